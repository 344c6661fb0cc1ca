"""The bad inputs a learner meets first: each is refused in one sentence that names it, or handled as documented.

``test_fuzz_inputs`` derives thousands of bad calls automatically; these are the cases worth stating one by one.
"""

import numpy as np
import pytest
import torch

from selfattn_lite import efficient, encoder, flex, graphs, kv_cache, mla, models, presets, recall, recurrent
from selfattn_lite import recall_models as rm
from selfattn_lite import scaled_dot_product_attention as sdpa
from selfattn_lite.distributed import shard_segments
from selfattn_lite.streaming import window_loss


def small_decoder():
    torch.manual_seed(0)
    return models.TinyDecoder(models.DecoderConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, max_len=16))


def recall_model():
    torch.manual_seed(0)
    return rm.RecallModel(rm.RecallConfig(mixer="hybrid", vocab_size=16, d_model=8, n_heads=2, d_state=4, window=4,
                                          d_ff=16)).eval()


# ------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("call", [lambda m: m("to be"), lambda m: m.generate("to be", 3), lambda m: m.loss("ab")])
def test_text_instead_of_ids_says_encode_it_first(call):
    with pytest.raises(ValueError, match=r"ids must be .* integer token ids, got a str: encode the text first"):
        call(small_decoder())


def test_a_loss_over_nothing_to_predict_is_refused():
    model = small_decoder()
    with pytest.raises(ValueError, match=r"loss needs at least 2 tokens per row .* ids \(1, 1\)"):
        model.loss(torch.tensor([[3]]))
    assert torch.isfinite(model.loss(torch.tensor([[3, 4]])))


def test_the_tokenizer_decodes_only_ids_of_its_vocabulary():
    tok = models.CharTokenizer("abc")
    assert tok.decode(torch.tensor([2, 0, 1])) == tok.decode([2, 0, 1]) == tok.decode(np.array([2, 0, 1])) == "cab"
    for bad in ([3], [-1]):             # -1 used to decode as the last character, 3 was an IndexError
        with pytest.raises(ValueError, match=r"ids must be in \[0, vocab_size=3\)"):
            tok.decode(bad)
    with pytest.raises(ValueError, match="ids must be integer token ids, got dtype torch.float32"):
        tok.decode(torch.tensor([1.0]))


# ------------------------------------------------------------------------------------------- recall models
@pytest.mark.parametrize("ids, match", [
    (torch.tensor([[1, 16]]), r"ids must be in \[0, vocab_size=16\), got min 1, max 16"),
    (torch.tensor([[1.0, 2.0]]), "ids must be integer token ids, got dtype torch.float32"),
    (torch.tensor([1, 2, 3]), r"ids \(3,\) must have 2 dims \(B, T\)"),
])
def test_recall_model_checks_its_ids(ids, match):
    model = recall_model()
    with pytest.raises(ValueError, match=match):
        model(ids)
    with pytest.raises(ValueError, match=match):
        model.mixer_weights(ids)


def test_a_layer_past_the_model_is_refused_not_wrapped_around():
    model, ids = recall_model(), torch.tensor([[1, 2, 3, 4]])
    assert len(model.blocks) == 2
    torch.testing.assert_close(model.mixer_weights(ids, layer=-1), model.mixer_weights(ids, layer=1))
    for layer in (2, -3):               # layer 2 used to return layer 0's weights
        with pytest.raises(ValueError, match=r"layer must be an int in \[-2, 1\], got"):
            model.mixer_weights(ids, layer=layer)


def test_recall_accuracy_over_no_query_is_refused():
    model, (inputs, targets) = recall_model(), recall.mqar(2, 16, 3, 16)
    assert 0.0 <= rm.recall_accuracy(model, inputs, targets) <= 1.0
    with pytest.raises(ValueError, match="targets hold no query"):
        rm.recall_accuracy(model, inputs, torch.full_like(targets, recall.IGNORE_INDEX))


def test_window_loss_with_nothing_left_to_score_is_refused():
    model, ids = small_decoder(), torch.randint(0, 10, (1, 8))
    with pytest.raises(ValueError, match="start=7 leaves no prediction to score"):
        window_loss(model, ids, window=3, start=7)


# ------------------------------------------------------------------------------------------- encoder
def test_mean_pool_reads_hugging_faces_integer_attention_mask_as_1_real():
    hidden = torch.randn(2, 4, 3, dtype=torch.float64)
    attention_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])          # Hugging Face: 1 = real token
    want = torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])
    torch.testing.assert_close(encoder.mean_pool(hidden, attention_mask), want)
    torch.testing.assert_close(encoder.mean_pool(hidden, attention_mask == 0), want)   # bool: True = padding
    with pytest.raises(ValueError, match=r"integer 0/1 .*got values \[0, 2\]"):
        encoder.mean_pool(hidden, torch.tensor([[2, 0, 0, 0], [2, 2, 2, 2]]))
    with pytest.raises(ValueError, match=r"rows \[0\] with no real token"):
        encoder.mean_pool(hidden, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"key_padding_mask \(2, 3\) must be \(B, T\) = \(2, 4\)"):
        encoder.mean_pool(hidden, attention_mask[:, :3])


# ------------------------------------------------------------------------------------------- FlashAttention backward
def test_flash_attention_backward_checks_what_the_forward_saved():
    q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 3)
    out, lse = efficient.flash_attention(q, k, v, return_lse=True)
    grad_out = torch.randn_like(out)
    efficient.flash_attention_backward(q, k, v, out, lse, grad_out)
    longer_lse = torch.cat([lse, lse[..., :1]], dim=-1)                 # used to be sliced silently
    with pytest.raises(ValueError, match=r"lse \(1, 2, 6\) must have shape \(1, 2, 5\) to fit q"):
        efficient.flash_attention_backward(q, k, v, out, longer_lse, grad_out)
    with pytest.raises(ValueError, match=r"out \(1, 2, 5, 4\) must have shape \(1, 2, 5, 3\)"):
        efficient.flash_attention_backward(q, k, v, torch.randn(1, 2, 5, 4), lse, grad_out)
    with pytest.raises(ValueError, match=r"grad_out \(1, 1, 5, 3\) must have shape \(1, 2, 5, 3\)"):
        efficient.flash_attention_backward(q, k, v, out, lse, grad_out[:, :1])


# ------------------------------------------------------------------------------------------- one-step functions
def test_linear_attention_step_checks_the_state_and_the_batch():
    q, k, v = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 3)
    _, state = efficient.linear_attention_step(None, q, k, v)
    with pytest.raises(ValueError, match=r"q, k and v must agree in every dim but the last.*v \(1, 3\)"):
        efficient.linear_attention_step(state, q, k, v[:1])             # a batch-1 value used to broadcast
    with pytest.raises(ValueError, match=r"state kv \(2, 4, 2\) must be \(\.\.\., m, Ev\) = \(2, 4, 3\)"):
        efficient.linear_attention_step((state[0][..., :2], state[1]), q, k, v)


def test_delta_rule_step_checks_the_state():
    state, q, k, v, beta = torch.zeros(1, 2, 4, 3), torch.randn(1, 2, 4), torch.randn(1, 2, 4), \
        torch.randn(1, 2, 3), torch.rand(1, 2)
    recurrent.delta_rule_step(state, q, k, v, beta)
    with pytest.raises(ValueError, match=r"state \(1, 2, 3, 4\) must be \(B, h, dk, dv\) = \(1, 2, 4, 3\)"):
        recurrent.delta_rule_step(state.transpose(-2, -1), q, k, v, beta)
    with pytest.raises(ValueError, match=r"beta \(1, 1\) must be \(B, h\) = \(1, 2\)"):
        recurrent.delta_rule_step(state, q, k, v, beta[:, :1])


def test_selective_scan_step_checks_the_state():
    state, u, delta = torch.zeros(1, 3, 2), torch.randn(1, 3), torch.rand(1, 3)
    A, B, C = -torch.rand(3, 2), torch.randn(1, 2), torch.randn(1, 2)
    recurrent.selective_scan_step(state, u, delta, A, B, C)
    with pytest.raises(ValueError, match=r"state \(1, 3, 5\) must be \(batch, d, n\) = \(1, 3, 2\)"):
        recurrent.selective_scan_step(torch.zeros(1, 3, 5), u, delta, A, B, C)


def test_linear_attention_weights_checks_q_and_k():
    with pytest.raises(ValueError, match=r"q \(2, 5, 4\) and k \(2, 6, 4\) must have one shape"):
        recurrent.linear_attention_weights(torch.randn(2, 5, 4), torch.randn(2, 6, 4))


# ------------------------------------------------------------------------------------------- mixed dtypes
def test_float32_with_float64_is_named_not_a_matmul_error():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"q, k, v, beta must have one dtype, got q torch.float32, k torch.float64"):
        recurrent.delta_rule(q, q.double(), q, torch.rand(1, 2, 5))
    h, adj = torch.randn(4, 3), torch.ones(4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"must have one dtype, got h torch.float32, weight torch.float64"):
        graphs.gat_attention(h, adj, torch.randn(2, 3, dtype=torch.float64), torch.randn(2), torch.randn(2))
    layer = mla.MultiHeadLatentAttention(8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
    hand_made = mla.MLACache(1, 4, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"cache holds dtype torch.float64 but the module's parameters are torch.float32"):
        layer(torch.randn(1, 2, 8), cache=hand_made)


# ------------------------------------------------------------------------------------------- the q/k/v hint
def test_the_enable_gqa_hint_only_where_head_counts_differ():
    k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    with pytest.raises(ValueError, match=r"head counts 4 and 2 differ: pass enable_gqa=True"):
        sdpa(torch.randn(2, 4, 3, 4), k, v)
    with pytest.raises(ValueError) as batch_only:
        sdpa(torch.randn(3, 2, 3, 4), k, v)                           # only the batch differs
    assert "enable_gqa" not in str(batch_only.value)
    with pytest.raises(ValueError) as no_such_argument:
        efficient.linear_attention(torch.randn(2, 4, 3, 4), k, v)     # linear_attention has no enable_gqa
    assert "enable_gqa" not in str(no_such_argument.value) and "head counts 4 and 2 differ" in str(no_such_argument.value)


# ------------------------------------------------------------------------------------------- cost formulas
def test_a_string_for_a_number_is_refused_in_the_cost_formulas():
    with pytest.raises(ValueError, match="bytes_per_value must be a number > 0, got '2'"):
        mla.mla_decode_bytes(100, d_model=32, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                             v_head_dim=8, form="absorbed", bytes_per_value="2")          # was 222222
    with pytest.raises(ValueError, match="bytes_per_value must be a number > 0, got '2'"):
        presets.get_preset("llama-2-7b").weight_bytes("2")                            # was a huge string
    assert presets.get_preset("llama-2-7b").weight_bytes(np.float32(2)) == 2 * 6_738_415_616


# ------------------------------------------------------------------------------------------- caches
def test_paged_cache_refuses_an_empty_append():
    cache = kv_cache.PagedKVCache(4, 2, 2, 3)
    with pytest.raises(ValueError, match=r"an append must hold at least one new token, got k \(2, 0, 3\)"):
        cache.append("a", torch.randn(2, 0, 3), torch.randn(2, 0, 3))
    assert "a" not in cache.block_tables                                # nothing half-stored for a later gather


# ------------------------------------------------------------------------------------------- flex, sharding
def test_block_mask_given_a_mask_tensor_says_it_wants_a_function():
    with pytest.raises(ValueError) as error:
        flex.block_mask(torch.ones(8, 8, dtype=torch.bool).tril(), 8)
    message = str(error.value)
    assert message.startswith("mask_mod must be a function, got Tensor") and "tensor(" not in message


def test_numpy_integers_are_integers_everywhere():
    assert shard_segments(np.int64(8), np.int64(1), np.int64(2)) == shard_segments(8, 1, 2) == [(4, 8)]
    assert presets.kv_cache_bytes(np.int64(32), np.int32(32), np.int64(128)) == 524_288
    assert models.CharTokenizer("abc").decode(np.array([np.int64(1)])) == "b"


def test_what_torch_accepts_is_accepted_and_agrees_with_torch():
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64) for _ in range(3))
    for scale in (torch.tensor(0.5), np.float32(0.5), 1):              # torch takes a one-element tensor too
        want = F.scaled_dot_product_attention(q, k, v, scale=scale)
        torch.testing.assert_close(sdpa(q, k, v, scale=scale)[0], want)
        torch.testing.assert_close(efficient.flash_attention(q, k, v, scale=scale), want)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match="is_causal must be True or False, got 1"):   # refused as torch does
        sdpa(q, k, v, is_causal=1)
