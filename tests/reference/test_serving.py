"""Notebook 13's package parts: sink and rolling caches, document masks, FlexAttention, presets, widget."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite import flex, streaming
from selfattn_lite.attention import scaled_dot_product_attention
from selfattn_lite.kv_cache import PRESETS, RollingKVCache, SinkKVCache, get_preset, kv_cache_bytes
from selfattn_lite.masks import causal_mask, document_mask, document_positions, sink_window_mask, to_additive
from selfattn_lite.multihead import MultiHeadAttention
from selfattn_lite.positions import RotaryEmbedding, alibi_bias

KiB = 1024


# ---------------------------------------------------------------- sink and rolling caches
@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 24), n_sink=st.integers(0, 4), window=st.integers(1, 8), heads=st.sampled_from([1, 2]))
def test_decoding_with_a_sink_cache_equals_the_masked_pass(T, n_sink, window, heads):
    torch.manual_seed(0)
    attn = MultiHeadAttention(8 * heads, heads, is_causal=True, bias=False, rope=RotaryEmbedding(8)).eval()
    x = torch.randn(2, T, 8 * heads)
    cache = SinkKVCache(2, heads, 8, window=window, n_sink=n_sink)
    first = min(T, n_sink + window)
    with torch.no_grad():
        reference, _ = attn(x, attn_mask=sink_window_mask(T, n_sink, window))
        steps = [attn(x[:, :first], cache=cache)[0]]
        steps += [attn(x[:, t:t + 1], cache=cache)[0] for t in range(first, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), reference)
    assert len(cache) == T and cache.n_kept == min(T, n_sink + window)
    kept = sorted(cache.kept_positions().tolist())
    assert kept == torch.nonzero(sink_window_mask(T, n_sink, window)[-1]).flatten().tolist()


def test_rolling_cache_memory_is_constant_and_it_equals_sliding_window_attention():
    from selfattn_lite.efficient import sliding_window_mask

    cache = RollingKVCache(1, 1, 4, window=3)
    sizes = set()
    for t in range(10):
        kv = torch.full((1, 1, 1, 4), float(t))
        k, _ = cache.update(kv, kv)
        sizes.add(cache.nbytes)
        assert sorted(k[0, 0, :, 0].tolist()) == [float(p) for p in range(max(0, t - 2), t + 1)]
    assert sizes == {2 * 3 * 4 * 4}
    assert torch.equal(sink_window_mask(9, 0, 3), sliding_window_mask(9, 3))
    assert cache.slot(7) == 1 and "window=3" in repr(cache)


def test_sink_cache_slots_and_bad_input():
    cache = SinkKVCache(1, 2, 4, window=3, n_sink=2)
    assert [cache.slot(p) for p in range(8)] == [0, 1, 2, 3, 4, 2, 3, 4]
    with pytest.raises(ValueError, match=r"feed at most n_sink \+ window - len = 5 tokens at once"):
        cache.update(torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4))
    with pytest.raises(ValueError, match=r"k must have shape \(B=1, n_kv_heads=2, T_new, head_dim=4\)"):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="n_sink must be a non-negative int"):
        SinkKVCache(1, 1, 4, window=3, n_sink=-1)
    with pytest.raises(ValueError, match="window must be a positive int"):
        RollingKVCache(1, 1, 4, window=0)
    cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(0)                                   # evicted tokens cannot come back
    cache.reset()
    assert len(cache) == 0 and cache.n_kept == 0 and (cache.slot_positions == -1).all()
    with pytest.raises(ValueError, match="at least one new token"):
        cache.update(torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4))


# ---------------------------------------------------------------- masks for packed sequences
@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5), is_causal=st.booleans())
def test_document_mask_and_positions_match_a_loop(lengths, is_causal):
    ids = torch.cat([torch.full((n,), 7 * i) for i, n in enumerate(lengths)])
    T = len(ids)
    mask = document_mask(ids, is_causal=is_causal)
    want = torch.tensor([[ids[i] == ids[j] and (j <= i or not is_causal) for j in range(T)] for i in range(T)])
    assert torch.equal(mask, want)
    assert document_positions(ids).tolist() == [p for n in lengths for p in range(n)]
    batched = document_mask(torch.stack([ids, ids.flip(0)]), is_causal=is_causal)
    assert batched.shape == (2, T, T) and torch.equal(batched[0], mask)


def test_packed_rows_equal_each_document_alone():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, is_causal=True, bias=False, rope=RotaryEmbedding(8)).eval()
    docs = [torch.randn(1, n, 16) for n in (3, 5, 2)]
    ids = torch.tensor([0] * 3 + [1] * 5 + [2] * 2)
    with torch.no_grad():
        packed, _ = attn(torch.cat(docs, 1), attn_mask=document_mask(ids, is_causal=True), positions=document_positions(ids))
        alone = torch.cat([attn(d)[0] for d in docs], 1)
    torch.testing.assert_close(packed, alone)


def test_mask_bad_input():
    with pytest.raises(ValueError, match="doc_ids must be a"):
        document_mask(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="doc_ids must be a"):
        document_positions(torch.zeros(2, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="causal must be True or False"):
        document_mask([0, 1], is_causal=1)
    with pytest.raises(ValueError, match="n_sink must be a non-negative int"):
        sink_window_mask(4, -1, 2)
    with pytest.raises(ValueError, match="window must be a positive int"):
        sink_window_mask(4, 1, 0)


# ---------------------------------------------------------------- FlexAttention on the CPU
@pytest.mark.parametrize("name", ["causal", "window", "sinks", "documents"])
def test_flex_mask_mods_equal_the_package_masks_and_count_skipped_blocks(name, recwarn):
    T = 256
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, T, 8) for _ in range(3))
    docs = torch.tensor([0] * 70 + [1] * 120 + [2] * 66)
    mask_mod, mask = {
        "causal": (flex.causal_mod, causal_mask(T)),
        "window": (flex.sliding_window_mod(40), sink_window_mask(T, 0, 40)),
        "sinks": (flex.sink_window_mod(3, 40), sink_window_mask(T, 3, 40)),
        "documents": (flex.document_mod(docs), document_mask(docs)),
    }[name]
    block = flex.block_mask(mask_mod, T, block_size=64)
    out = flex.flex_attention(q, k, v, block_mask=block)
    reference, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, reference)
    counts = flex.block_counts(block)
    tiles = mask.reshape(4, 64, 4, 64)
    assert counts["skipped"] == int((~tiles.any(dim=(1, 3))).sum())
    assert counts["full"] == int(tiles.all(dim=(1, 3)).sum())
    assert counts["total"] == 16 and counts["share_skipped"] == pytest.approx(block.sparsity() / 100)
    assert not [w for w in recwarn if "torch.compile" in str(w.message)]   # the eager warning is handled


def test_flex_alibi_score_mod_equals_alibi_bias():
    T = 128
    q, k, v = (torch.randn(1, 4, T, 8) for _ in range(3))
    out = flex.flex_attention(q, k, v, score_mod=flex.alibi_score_mod(4), block_mask=flex.block_mask(flex.causal_mod, T))
    reference, _ = scaled_dot_product_attention(q, k, v, attn_mask=alibi_bias(4, T) + to_additive(causal_mask(T)))
    torch.testing.assert_close(out, reference)
    with pytest.raises(ValueError, match="flex_attention takes"):
        flex.flex_attention(q[0], k, v)
    with pytest.raises(ValueError, match="window must be a positive int"):
        flex.sliding_window_mod(0)
    with pytest.raises(ValueError, match="doc_ids must be a"):
        flex.document_mod(torch.zeros(2, 3, dtype=torch.long))


# ---------------------------------------------------------------- presets
def test_mla_presets_use_the_latent_formula():
    v2, v3 = get_preset("deepseek-v2"), get_preset("DeepSeek-V3")
    assert v2.attention == v3.attention == "MLA"
    assert v2.kv_bytes() == (512 + 64) * 60 * 2 == 69_120               # 67.5 KiB per token
    assert v3.kv_bytes(4096, 2, 1) == (512 + 64) * 61 * 4096 * 2
    assert v2.kv_bytes(n_kv_heads=128) == v2.kv_bytes()
    with pytest.raises(ValueError, match="multi-head latent attention"):
        v2.kv_bytes(n_kv_heads=8)


def test_cross_layer_preset_counts_only_caching_layers_and_caps_sliding_ones():
    g = get_preset("Gemma-3n-E4B")
    assert g.cache_layers == 20 and g.kv_bytes() == kv_cache_bytes(20, 2, 256) == 40 * KiB
    assert g.kv_bytes(512) == kv_cache_bytes(20, 2, 256, 512)          # inside the window: all 20 grow
    assert g.kv_bytes(4096) == kv_cache_bytes(4, 2, 256, 4096) + kv_cache_bytes(16, 2, 256, 512)
    assert g.kv_bytes(4096, n_kv_heads=1) * 2 == g.kv_bytes(4096)


def test_existing_presets_unchanged():
    assert PRESETS["Llama-2-7B"].kv_bytes() == 512 * KiB
    assert PRESETS["Llama-3-8B"].kv_bytes(n_kv_heads=32) == PRESETS["Llama-2-7B"].kv_bytes()
    assert PRESETS["Llama-2-7B"].cache_layers == 32


@pytest.mark.slow
def test_new_presets_match_transformers_configs_and_parameter_counts():
    """The published configs, instantiated by transformers on the meta device, have the presets' shapes
    and parameter counts (DeepSeek: the papers' 236B and 671B)."""
    transformers = pytest.importorskip("transformers")

    def count(model_cls, config):
        with torch.device("meta"):
            return sum(p.numel() for p in model_cls(config).parameters())

    common = dict(num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840,
                  tie_word_embeddings=False, n_group=8)
    v2 = transformers.DeepseekV2Config(vocab_size=102400, hidden_size=5120, intermediate_size=12288,
                                       num_hidden_layers=60, n_routed_experts=160, n_shared_experts=2,
                                       num_experts_per_tok=6, moe_intermediate_size=1536, first_k_dense_replace=1,
                                       topk_group=3, **common)
    v3 = transformers.DeepseekV3Config(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                       num_hidden_layers=61, n_routed_experts=256, n_shared_experts=1,
                                       num_experts_per_tok=8, moe_intermediate_size=2048, first_k_dense_replace=3,
                                       topk_group=4, **common)
    for preset, config, cls, published in ((PRESETS["DeepSeek-V2"], v2, transformers.DeepseekV2ForCausalLM, 236e9),
                                           (PRESETS["DeepSeek-V3"], v3, transformers.DeepseekV3ForCausalLM, 671e9)):
        assert (preset.n_layers, preset.d_model, preset.vocab_size) == \
            (config.num_hidden_layers, config.hidden_size, config.vocab_size)
        assert (preset.kv_lora_rank, preset.qk_rope_head_dim) == (config.kv_lora_rank, config.qk_rope_head_dim)
        assert (preset.head_dim, preset.v_head_dim) == (config.qk_nope_head_dim + config.qk_rope_head_dim,
                                                        config.v_head_dim)
        n = count(cls, config)
        assert n == preset.n_params and abs(n / published - 1) < 0.005
    g = transformers.Gemma3nTextConfig()                                  # documented as the E4B configuration
    p = PRESETS["Gemma-3n-E4B"]
    assert (p.n_layers, p.n_kv_heads, p.head_dim, p.sliding_window) == \
        (g.num_hidden_layers, g.num_key_value_heads, g.head_dim, g.sliding_window)
    own = g.layer_types[: g.num_hidden_layers - g.num_kv_shared_layers]   # the layers before the shared ones
    assert p.kv_layers == len(own) and p.sliding_kv_layers == own.count("sliding_attention")
    assert count(transformers.Gemma3nForCausalLM, g) == p.n_params


# ---------------------------------------------------------------- streaming helpers and the widget
def test_first_key_attention_and_window_loss_shapes():
    w = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    out = streaming.first_key_attention(w)
    torch.testing.assert_close(out, w[:, :, 1:, 0].mean(-1))
    with pytest.raises(ValueError, match="weights must be"):
        streaming.first_key_attention(torch.zeros(3, 5, 5))


def test_cache_policy_widget_reads_bytes_off_real_caches():
    from selfattn_lite.viz import CachePolicyWidget

    w = CachePolicyWidget(T=12, window=4, n_sink=2, n_kv_heads=1, head_dim=4)
    assert w.kept == 6 and w.held_bytes == 2 * 6 * 4 * 4
    w.policy.value = "window"
    assert w.kept == 4 and w.held_bytes == 2 * 12 * 4 * 4             # a mask alone frees nothing
    w.step.value = 2
    assert w.kept == 3 and w.renders >= 3
    w.step.value = 11
    w.policy.value = "rolling"                                            # the ring frees what leaves the window
    assert w.kept == 4 and w.held_bytes == RollingKVCache(1, 1, 4, window=4).nbytes
    w.policy.value = "full"
    assert w.kept == 12 and w.held_bytes == 2 * 12 * 4 * 4
    with pytest.raises(ValueError, match="unknown policy"):
        CachePolicyWidget(policy="lru")


def test_draw_policy_tells_evicted_keys_from_keys_masked_but_stored():
    from selfattn_lite.viz.serving import draw_policy

    def colours(policy):                                  # the grid drawn: 1 evicted, 4 masked but still stored
        return draw_policy(policy, 8, window=3, n_sink=1).images[0].get_array()

    behind = torch.tril(torch.ones(8, 8, dtype=torch.bool), diagonal=-3)  # written, older than the window
    assert (colours("window")[behind] == 4).all()                         # a mask over a growing KVCache
    assert (colours("rolling")[behind] == 1).all()                        # evicted from the ring
    assert set(colours("sinks + window")[behind].tolist()) == {1, 3}      # evicted, or a sink (key 0)


def test_kv_calculator_widget_prices_mla_and_shared_presets_with_their_formula():
    from selfattn_lite.viz import KVCalculatorWidget

    w = KVCalculatorWidget("Llama-2-7B", seq_len=4096, batch=16)
    w.preset.value = "DeepSeek-V2"                 # MLA: one latent per token and layer, no K/V-head choice
    assert w.kv_heads.options == (128,) and w.cache_bytes == get_preset("DeepSeek-V2").kv_bytes(4096, 16)
    w.preset.value = "Gemma-3n-E4B"
    assert w.cache_bytes == get_preset("Gemma-3n-E4B").kv_bytes(4096, 16)
    w.kv_heads.value = 1
    assert w.cache_bytes * 2 == get_preset("Gemma-3n-E4B").kv_bytes(4096, 16)


def test_streaming_helpers_on_the_tiny_decoder():
    from selfattn_lite.models import load_tiny_decoder

    model = load_tiny_decoder()
    ids = torch.randint(0, model.config.vocab_size, (2, 61), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(streaming.masked_logits(model, ids), model(ids))
        full = streaming.window_loss(model, ids, window=None)
        assert full == pytest.approx(model.loss(ids).item(), rel=1e-5)
        caches = streaming.sink_caches(model, 2, window=8, n_sink=2)
        decoded = streaming.decode_logits(model, ids, caches)
        masked = streaming.masked_logits(model, ids, sink_window_mask(61, 2, 8))
    torch.testing.assert_close(decoded, masked, atol=1e-4, rtol=1e-4)
    assert all(c.nbytes == caches[0].nbytes for c in caches) and len(caches[0]) == 61
    assert streaming.window_loss(model, ids, window=60) == pytest.approx(full, rel=1e-5)   # window covers all
    with pytest.raises(ValueError, match=r"attn_mask must be a \(61, 61\) bool mask"):
        streaming.masked_logits(model, ids, torch.ones(5, 5, dtype=torch.bool))


def test_an_alibi_decoder_takes_a_mask_next_to_its_bias():
    from selfattn_lite.models import DATA_DIR, load_tiny_decoder

    model = load_tiny_decoder(DATA_DIR / "tiny_decoder_alibi.safetensors", DATA_DIR / "tiny_decoder_alibi.json")
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attn_mask=causal_mask(40)), model(ids))    # causal AND causal
        windowed = model(ids, attn_mask=sink_window_mask(40, 0, 8))
        torch.testing.assert_close(windowed[:, :8], model(ids)[:, :8])                  # inside the window
        assert not torch.allclose(windowed[:, 8:], model(ids)[:, 8:])                 # beyond it


def test_block_mask_is_built_where_its_inputs_live(monkeypatch):
    import torch.nn.attention.flex_attention as fa

    seen = []
    monkeypatch.setattr(fa, "create_block_mask", lambda *args, device, **kw: seen.append(torch.device(device)))
    flex.block_mask(flex.causal_mod, 8)                                         # nothing to follow: the CPU
    flex.block_mask(flex.causal_mod, 8, device="meta")                          # an explicit device wins
    flex.block_mask(flex.document_mod(torch.zeros(8, dtype=torch.long, device="meta")), 8)   # its doc_ids' device
    assert seen == [torch.device("cpu"), torch.device("meta"), torch.device("meta")]
