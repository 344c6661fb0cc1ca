"""Multi-head latent attention: naive and absorbed forms, the latent cache, bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.mla import MLACache, MultiHeadLatentAttention, mla_cache_bytes
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


def test_the_absorbed_fold_is_made_once_and_remade_when_a_weight_changes():
    m = _mla(q_lora_rank=6).double().eval()
    x = torch.randn(2, 5, m.d_model, dtype=torch.float64)
    with torch.no_grad():
        first = m(x, absorbed=True)
        m(x, absorbed=True)
        assert m.folds == 1                                              # folded once, reused
        torch.testing.assert_close(first, m(x))
        m.o_proj.weight.mul_(1.5)                                        # an in-place change bumps _version
        second = m(x, absorbed=True)
        assert m.folds == 2
        torch.testing.assert_close(second, m(x))                         # the new fold, not the stale one
        assert not torch.allclose(second, first)
        m.kv_b_proj.weight.add_(0.1)
        torch.testing.assert_close(m(x, absorbed=True), m(x))
        m.load_state_dict(_mla(q_lora_rank=6).double().state_dict())     # new weights copied in
        torch.testing.assert_close(m(x, absorbed=True), m(x))
        m.o_proj.weight.data.mul_(2.0)                                   # .data bumps no counter: refold
        m.refold()
        torch.testing.assert_close(m(x, absorbed=True), m(x))
    m.float()                                                            # a new dtype (and storage)
    with torch.no_grad():
        torch.testing.assert_close(m(x.float(), absorbed=True), m(x.float()), atol=1e-5, rtol=1e-4)


def test_the_absorbed_form_trains_its_weights():
    m = _mla().double()
    x = torch.randn(1, 4, m.d_model, dtype=torch.float64)
    folds = m.folds
    m(x, absorbed=True).square().sum().backward()
    grads = [p.grad.clone() for p in (m.o_proj.weight, m.kv_b_proj.weight)]
    m.zero_grad()
    m(x).square().sum().backward()
    for got, want in zip(grads, (m.o_proj.weight.grad, m.kv_b_proj.weight.grad)):
        torch.testing.assert_close(got, want)
    assert m.folds == folds                                              # recording: nothing cached


def test_decode_bytes_naive_against_absorbed():
    from selfattn_lite.mla import mla_decode_bytes

    dims = dict(n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    naive = mla_decode_bytes(4096, **dims, absorbed=False)
    absorbed = mla_decode_bytes(4096, **dims, absorbed=True)
    assert naive["cache"] == absorbed["cache"] == absorbed["total"] == 4096 * 576 * 2
    assert naive["keys_values"] == 4096 * 128 * (128 + 64 + 128) * 2
    assert naive["total"] == naive["cache"] + naive["keys_values"]
    with pytest.raises(ValueError, match="n_heads"):
        mla_decode_bytes(4, **{**dims, "n_heads": 0}, absorbed=True)
