"""Multi-head latent attention: naive and absorbed forms, the latent cache, bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.mla import (
    MLACache,
    MultiHeadLatentAttention,
    mla_cache_bytes,
    mla_decode_bytes,
    mla_decode_flops,
    mla_weight_values,
)
from selfattn_lite.positions import RotaryEmbedding


def _mla(q_lora_rank=None, **kw):
    args = dict(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, q_lora_rank=q_lora_rank)
    args.update(kw)
    torch.manual_seed(0)
    return MultiHeadLatentAttention(32, 4, **args).double()


def _reference(m, x):
    """MLA written from the paper's equations with explicit per-head matrices (no module code path)."""
    B, T, _ = x.shape
    pos = torch.arange(T)
    rope = RotaryEmbedding(m.qk_rope_head_dim, interleaved=True)
    if m.q_lora_rank is None:
        q = x @ m.q_proj.weight.T
    else:
        q = F.rms_norm(x @ m.q_a_proj.weight.T, (m.q_lora_rank,), m.q_a_layernorm.weight, 1e-6) @ m.q_b_proj.weight.T
    q = q.view(B, T, m.n_heads, -1).transpose(1, 2)
    q_c, q_r = q[..., :m.qk_nope_head_dim], rope(q[..., m.qk_nope_head_dim:], pos)
    a = x @ m.kv_a_proj_with_mqa.weight.T
    c = F.rms_norm(a[..., :m.kv_lora_rank], (m.kv_lora_rank,), m.kv_a_layernorm.weight, 1e-6)
    k_r = rope(a[..., m.kv_lora_rank:], pos)                                 # (B, T, rope)
    w = m.kv_b_proj.weight.view(m.n_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    outs = []
    for i in range(m.n_heads):
        k_c = c @ w[i, :m.qk_nope_head_dim].T                                # (B, T, nope)
        v = c @ w[i, m.qk_nope_head_dim:].T                                  # (B, T, v)
        scores = (q_c[:, i] @ k_c.transpose(1, 2) + q_r[:, i] @ k_r.transpose(1, 2)) / (m.qk_head_dim ** 0.5)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        outs.append(scores.softmax(-1) @ v)
    return torch.cat(outs, dim=-1) @ m.o_proj.weight.T


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_naive_and_absorbed_equal_the_equations_in_float64(q_lora_rank):
    m = _mla(q_lora_rank)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    ref = _reference(m, x)
    torch.testing.assert_close(m(x), ref)
    torch.testing.assert_close(m(x, absorbed=True), ref)


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 10), prefill=st.integers(1, 10), heads=st.sampled_from([1, 2, 4]),
       rank=st.integers(1, 9), rope=st.sampled_from([2, 4, 6]), absorbed=st.booleans())
def test_decoding_with_the_latent_cache_equals_one_pass(B, T, prefill, heads, rank, rope, absorbed):
    prefill = min(prefill, T)
    torch.manual_seed(1)
    m = MultiHeadLatentAttention(8 * heads, heads, kv_lora_rank=rank, qk_nope_head_dim=3, qk_rope_head_dim=rope,
                                 v_head_dim=4).double()
    x = torch.randn(B, T, 8 * heads, dtype=torch.float64)
    cache = m.new_cache(B, T)
    steps = [m(x[:, :prefill], cache, absorbed=absorbed)]
    steps += [m(x[:, t:t + 1], cache, absorbed=absorbed) for t in range(prefill, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), m(x))
    assert len(cache) == T and cache.nbytes == B * T * (rank + rope) * 8


def test_cache_holds_only_the_latent_and_rope_key():
    m = _mla()
    cache = m.new_cache(1, 5)
    m(torch.randn(1, 5, 32, dtype=torch.float64), cache)
    assert cache.c_kv.shape == (1, 5, 12) and cache.k_rope.shape == (1, 5, 4)
    cache.crop(2)
    assert len(cache) == 2
    cache.reset()
    assert len(cache) == 0


def test_mla_cache_bytes_published_figures():
    assert mla_cache_bytes(60, 512, 64) == 69_120                  # DeepSeek-V2: 67.5 KiB per token in bf16
    assert mla_cache_bytes(61, 512, 64, n_tokens=4096) == 576 * 61 * 4096 * 2
    assert mla_cache_bytes(2, 8, 2, n_tokens=0) == 0


def test_bad_input_raises_value_errors():
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MultiHeadLatentAttention(16, 2, kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=3, v_head_dim=4)
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive int"):
        MultiHeadLatentAttention(16, 2, kv_lora_rank=0, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    m = _mla()
    with pytest.raises(ValueError, match=r"x must be a floating \(B, L, d_model=32\)"):
        m(torch.randn(2, 3, 31, dtype=torch.float64))
    with pytest.raises(ValueError, match="cache must be an MLACache"):
        m(torch.randn(1, 3, 32, dtype=torch.float64), cache=object())
    cache = MLACache(1, 2, 12, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="MLA cache overflow"):
        m(torch.randn(1, 3, 32, dtype=torch.float64), cache)
    with pytest.raises(ValueError, match=r"c_kv must be \(B=1, T_new, 12\)"):
        cache.update(torch.randn(1, 1, 11), torch.randn(1, 1, 4))
    with pytest.raises(ValueError, match="crop length"):
        cache.crop(5)
    with pytest.raises(ValueError, match="n_tokens must be a non-negative int"):
        mla_cache_bytes(2, 8, 2, n_tokens=-1)


def test_the_absorbed_form_applies_w_uv_per_head_and_the_fold_gives_the_same_output():
    m = _mla(q_lora_rank=6).double().eval()
    x = torch.randn(2, 5, m.d_model, dtype=torch.float64)
    with torch.no_grad():
        fold = m.fold_output()                                           # (d, h, d_c)
        assert fold.shape == (m.d_model, m.n_heads, m.kv_lora_rank)
        torch.testing.assert_close(m(x, absorbed=True, fold=fold), m(x))
        m.o_proj.weight.mul_(1.5)                                        # nothing is kept between calls
        torch.testing.assert_close(m(x, absorbed=True), m(x))
    with pytest.raises(ValueError, match="used with absorbed=True"):
        m(x, fold=fold)
    with pytest.raises(ValueError, match=r"fold must be a \(d_model=32, h=4, kv_lora_rank=12\)"):
        m(x, absorbed=True, fold=fold[:, :2])


def test_the_absorbed_form_trains_its_weights():
    m = _mla().double()
    x = torch.randn(1, 4, m.d_model, dtype=torch.float64)
    m(x, absorbed=True).square().sum().backward()
    grads = [p.grad.clone() for p in (m.o_proj.weight, m.kv_b_proj.weight)]
    m.zero_grad()
    m(x).square().sum().backward()
    for got, want in zip(grads, (m.o_proj.weight.grad, m.kv_b_proj.weight.grad)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_naive_absorbed_and_cached_equal_hugging_face_deepseek_v3_attention(q_lora_rank):
    """transformers' DeepseekV3Attention (eager, interleaved RoPE) with its weights loaded into ours by name."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    config = transformers.DeepseekV3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=12, q_lora_rank=q_lora_rank,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, rope_interleave=True, attention_bias=False,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = DeepseekV3Attention(config, layer_idx=0).double().eval()
    for p in hf.parameters():                                            # RMSNorm weights too, not all ones
        torch.nn.init.normal_(p, std=0.3)
    ours = _mla(q_lora_rank)
    ours.load_state_dict(hf.state_dict(), strict=True)                   # the same submodule names
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, torch.arange(9)[None])
    causal = torch.full((9, 9), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want, _ = hf(x, (cos.double(), sin.double()), causal)
        torch.testing.assert_close(ours(x), want)
        torch.testing.assert_close(ours(x, absorbed=True), want)
        cache = ours.new_cache(2, 9)
        steps = [ours(x[:, :4], cache)] + [ours(x[:, t:t + 1], cache, absorbed=True) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, dim=1), want)


V2 = dict(d_model=5120, n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def test_weight_values_at_deepseek_v2_shapes():
    shapes = {k: v for k, v in V2.items() if k != "qk_rope_head_dim"}
    apart = mla_weight_values(**shapes, form="absorbed")
    folded = mla_weight_values(**shapes, form="folded")
    assert apart == mla_weight_values(**shapes, form="naive")
    assert apart["w_uv"] + apart["o_proj"] == 128 * 128 * 512 + 5120 * 128 * 128 == 92_274_688     # 92.3M
    assert folded["w_o_uv"] == 5120 * 128 * 512 == 335_544_320                                      # 335.5M
    assert folded["w_o_uv"] * 2 == 640 * 2**20                                                     # 640 MiB in bf16
    assert folded["w_uk"] == apart["w_uk"] == 128 * 128 * 512
    with pytest.raises(ValueError, match="form must be one of"):
        mla_weight_values(**shapes, form="fused")


def test_weight_values_are_the_layers_own_tensors():
    m = _mla()
    w_uk, w_uv = m.up_projections()
    shapes = dict(d_model=32, n_heads=4, kv_lora_rank=12, qk_nope_head_dim=6, v_head_dim=5)
    assert mla_weight_values(**shapes) == {"w_uk": w_uk.numel(), "w_uv": w_uv.numel(),
                                           "o_proj": m.o_proj.weight.numel()}
    assert mla_weight_values(**shapes, form="folded")["w_o_uv"] == m.fold_output().numel()


def test_decode_bytes_count_cache_expanded_keys_and_weights():
    naive = mla_decode_bytes(4096, **V2, form="naive")
    absorbed = mla_decode_bytes(4096, **V2, form="absorbed")
    folded = mla_decode_bytes(4096, **V2, form="folded")
    assert naive["cache"] == absorbed["cache"] == folded["cache"] == 4096 * 576 * 2
    assert naive["keys_values"] == 2 * (4096 * 128 * (128 + 64 + 128) * 2) and absorbed["keys_values"] == 0  # write + read
    assert absorbed["weights"] == naive["weights"] == (128 * 128 * 512 + 92_274_688) * 2
    assert folded["weights"] == (128 * 128 * 512 + 335_544_320) * 2
    for row in (naive, absorbed, folded):
        assert row["total"] == row["cache"] + row["keys_values"] + row["weights"]
    assert absorbed["total"] < folded["total"] < naive["total"]          # at 4k tokens naive moves the most
    at_2k = {form: mla_decode_bytes(2048, **V2, form=form)["total"] for form in ("naive", "absorbed", "folded")}
    assert at_2k["absorbed"] < at_2k["naive"] < at_2k["folded"]          # at 2k (notebook 13) the fold does
    with pytest.raises(ValueError, match="n_heads"):
        mla_decode_bytes(4, **{**V2, "n_heads": 0})


def test_expanded_cache_is_deepseek_v3_naive():
    """DeepSeek-V3's attn_impl = "naive" caches h (nope + rope + v) values per token and expands only new tokens."""
    expanded = mla_decode_bytes(2048, **V2, form="expanded_cache")
    naive = mla_decode_bytes(2048, **V2, form="naive")
    assert expanded["cache"] == 2048 * 128 * (128 + 64 + 128) * 2 == 2048 * 40_960 * 2    # MHA-sized, read once
    assert expanded["keys_values"] == 0 and expanded["weights"] == naive["weights"]
    assert expanded["total"] == expanded["cache"] + expanded["weights"]
    shapes = dict(V2)
    for L, S in ((1, 2048), (5, 9), (2048, 2048)):
        gap = mla_decode_flops(L, S, **shapes, form="naive") - mla_decode_flops(L, S, **shapes, form="expanded_cache")
        assert gap == 2 * (S - L) * 512 * 128 * (128 + 128)            # naive expands S latents, it L
    with pytest.raises(ValueError, match="form must be one of"):
        mla_decode_bytes(4, **V2, form="expanded")


def test_fold_is_larger_exactly_past_its_threshold():
    """d h d_c > h v d_c + d h v  <=>  d_c > d v / (d - v): 131.3 at d = 5120, v = 128."""
    base = dict(d_model=5120, n_heads=2, qk_nope_head_dim=8, v_head_dim=128)
    for d_c, larger in ((131, False), (132, True)):
        apart = mla_weight_values(**base, kv_lora_rank=d_c, form="absorbed")
        folded = mla_weight_values(**base, kv_lora_rank=d_c, form="folded")
        assert (folded["w_o_uv"] > apart["w_uv"] + apart["o_proj"]) is larger


@pytest.mark.parametrize("form", ["naive", "absorbed", "folded"])
def test_decode_flops_match_torch_flop_counter(form):
    from torch.utils.flop_counter import FlopCounterMode

    m = _mla().double().eval()
    S, L = 7, 3
    x = torch.randn(1, S, m.d_model, dtype=torch.float64)
    c_kv, k_rope = m.latents(x, torch.arange(S))
    q_nope, q_rope = m.queries(x[:, -L:], torch.arange(S - L, S))
    fold = m.fold_output() if form == "folded" else None
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        if form == "naive":
            m._naive(q_nope, q_rope, c_kv, k_rope, None)
        else:
            m._absorbed(q_nope, q_rope, c_kv, k_rope, None, fold)
    shapes = dict(d_model=32, n_heads=4, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
    assert counter.get_total_flops() == mla_decode_flops(L, S, **shapes, form=form)
