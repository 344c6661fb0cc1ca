"""MultiHeadAttention against nn.MultiheadAttention, a per-head loop, and its own two paths."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from selfattn_lite.kv_cache import KVCache
from selfattn_lite.masks import causal_mask
from selfattn_lite.multihead import MultiHeadAttention

TOL = dict(atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- stand-ins for other modules


class TinyRope:
    """Rotary embedding on interleaved pairs; records the positions it was called with."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        self.inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.calls = []

    def __call__(self, x, positions):
        self.calls.append(positions.clone())
        angles = positions[..., None].double() * self.inv_freq      # (T, hd/2) or (B, T, hd/2)
        if angles.dim() == 3:
            angles = angles[:, None]                                 # (B, 1, T, hd/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class ListCache:
    """Minimal KV cache: len() and update(k, v) -> everything stored so far."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


def per_head_reference(mha: MultiHeadAttention, x, context=None, mask=None):
    """Attention written as a loop over heads, straight from the formula. mask: bool (L, S) or None."""
    c = x if context is None else context
    q, k, v = mha.q_proj(x), mha.k_proj(c), mha.v_proj(c)
    hd, group = mha.head_dim, mha.n_heads // mha.n_kv_heads
    heads = []
    for i in range(mha.n_heads):
        j = i // group                                              # the kv head serving query head i
        qi, kj, vj = q[..., i * hd:(i + 1) * hd], k[..., j * hd:(j + 1) * hd], v[..., j * hd:(j + 1) * hd]
        scores = qi @ kj.transpose(-2, -1) / math.sqrt(hd)          # (B, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vj)            # (B, L, hd)
    return mha.out_proj(torch.cat(heads, dim=-1))


# ---------------------------------------------------------------- construction


def test_submodules_and_shapes():
    mha = MultiHeadAttention(48, 6, 2)
    assert mha.head_dim == 8
    assert tuple(mha.q_proj.weight.shape) == (48, 48)
    assert tuple(mha.k_proj.weight.shape) == (16, 48) and tuple(mha.v_proj.weight.shape) == (16, 48)
    assert tuple(mha.out_proj.weight.shape) == (48, 48)
    y, w = mha(torch.randn(3, 5, 48), need_weights=True)
    assert y.shape == (3, 5, 48) and w.shape == (3, 6, 5, 5)
    assert mha(torch.randn(3, 5, 48))[1] is None


def test_bias_false_has_no_biases():
    mha = MultiHeadAttention(16, 4, bias=False)
    assert all(m.bias is None for m in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj))
    with torch.no_grad():
        y = mha(torch.zeros(1, 3, 16))[0]
    assert torch.equal(y, torch.zeros(1, 3, 16))


# ---------------------------------------------------------------- against the formula


@given(B=st.integers(1, 3), L=st.integers(1, 6), S=st.integers(1, 6), hd=st.sampled_from([2, 4, 8]),
       heads=st.sampled_from([(1, 1), (4, 4), (4, 2), (4, 1), (6, 3)]), cross=st.booleans(),
       is_causal=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_per_head_loop(B, L, S, hd, heads, cross, is_causal, seed):
    torch.manual_seed(seed)
    h, h_kv = heads
    mha = MultiHeadAttention(h * hd, h, h_kv, is_causal=is_causal)
    x = torch.randn(B, L, h * hd)
    context = torch.randn(B, S, h * hd) if cross else None
    S = S if cross else L
    mask = causal_mask(L, S) if is_causal else None                       # top-left, like is_causal
    expected = per_head_reference(mha, x, context, mask)
    for need_weights in (True, False):
        y, _ = mha(x, context, need_weights=need_weights)
        torch.testing.assert_close(y, expected, **TOL)


def test_per_head_loop_and_batched_form_agree_under_no_grad():
    """The inference path (packed q/k/v matmul) gives the same numbers as the training path."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, 2, is_causal=True)
    x = torch.randn(2, 7, 32)
    with_grad = mha(x)[0]
    with torch.no_grad():
        no_grad = mha(x)[0]
    torch.testing.assert_close(no_grad, with_grad, **TOL)
    torch.testing.assert_close(with_grad, per_head_reference(mha, x, mask=causal_mask(7)), **TOL)


def test_packed_weights_follow_weight_changes():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 4, 16)
    with torch.no_grad():
        before = mha(x)[0]
        mha.k_proj.weight.mul_(2.0)                                    # in-place edit bumps the version
        after = mha(x)[0]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, mha(x)[0].detach(), **TOL)       # grad path: separate Linear calls
    mha.load_state_dict(MultiHeadAttention(16, 2).state_dict())
    with torch.no_grad():
        torch.testing.assert_close(mha(x)[0], mha(x, x)[0], **TOL)


@pytest.mark.parametrize("edit", [
    lambda m: m.k_proj.weight.data.mul_(3.0),                          # .data edits leave _version alone
    lambda m: m.q_proj.weight.data.copy_(torch.randn(16, 16)),
    lambda m: m.v_proj.bias.data.add_(1.0),
    lambda m: setattr(m.k_proj.weight, "data", torch.randn(8, 16)),     # a new storage behind the same Parameter
], ids=["k_weight.data.mul_", "q_weight.data.copy_", "v_bias.data.add_", "k_weight.data = new"])
def test_no_grad_path_sees_edits_through_data(edit):
    """Every no_grad call uses the current weights, even after edits that autograd does not see."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, n_kv_heads=1).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        before = mha(x)[0]
        edit(mha)
        after = mha(x)[0]
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, per_head_reference(mha, x).detach(), **TOL)
    torch.testing.assert_close(after, mha(x)[0].detach(), **TOL)        # the grad path agrees


# ---------------------------------------------------------------- the two paths


@given(B=st.integers(1, 3), L=st.integers(1, 6), S=st.integers(1, 6),
       heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]), is_causal=st.booleans(), cross=st.booleans(),
       mask_kind=st.sampled_from(["none", "bool", "float"]), use_kpm=st.booleans(), seed=st.integers(0, 2**16))
def test_fused_path_equals_weights_path(B, L, S, heads, is_causal, cross, mask_kind, use_kpm, seed):
    gen = torch.Generator().manual_seed(seed)
    h, h_kv = heads
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8 * h, h, h_kv, is_causal=is_causal)
    x = torch.randn(B, L, 8 * h, generator=gen)
    context = torch.randn(B, S, 8 * h, generator=gen) if cross else None
    S = S if cross else L
    attn_mask = None
    if mask_kind != "none":
        allowed = torch.rand(B, 1, L, S, generator=gen) > 0.3          # some rows may be fully masked
        attn_mask = allowed if mask_kind == "bool" else torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
    kpm = (torch.rand(B, S, generator=gen) > 0.7) if use_kpm else None
    y_fused, none = mha(x, context, attn_mask=attn_mask, key_padding_mask=kpm)
    y_explicit, w = mha(x, context, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=True)
    assert none is None and w.shape == (B, h, L, S)
    assert not torch.isnan(y_explicit).any() and not torch.isnan(y_fused).any()
    torch.testing.assert_close(y_fused, y_explicit, **TOL)
    rows = w.sum(-1)                                                    # 1 per query, 0 if nothing allowed
    assert torch.all(((rows - 1).abs() < 1e-5) | (rows == 0))


def test_fully_masked_query_gives_zero_attention_not_nan():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    attn_mask = torch.ones(3, 3, dtype=torch.bool)
    attn_mask[1] = False                                                # query 1 sees nothing
    for need_weights in (True, False):
        y, w = mha(x, attn_mask=attn_mask, need_weights=need_weights)
        torch.testing.assert_close(y[0, 1], mha.out_proj.bias)          # zero attention -> just the bias
        if w is not None:
            assert torch.equal(w[0, :, 1], torch.zeros(2, 3))


def test_causal_flag_equals_explicit_causal_mask():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, is_causal=True)
    plain = MultiHeadAttention(16, 4)
    plain.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 16)
    for need_weights in (True, False):
        y, _ = mha(x, need_weights=need_weights)
        y2, _ = plain(x, attn_mask=causal_mask(5), need_weights=need_weights)
        torch.testing.assert_close(y, y2, **TOL)
    _, w = mha(x, need_weights=True)
    future = ~causal_mask(5)
    assert torch.all(w[..., future] == 0) and torch.all(w[..., ~future] > 0)


def test_causal_outputs_ignore_the_future():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, is_causal=True)
    x = torch.randn(1, 6, 16)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)
    torch.testing.assert_close(mha(x)[0][:, :4], mha(x2)[0][:, :4])
    assert not torch.allclose(mha(x)[0][:, 4:], mha(x2)[0][:, 4:])


# ---------------------------------------------------------------- parity with nn.MultiheadAttention


@given(B=st.integers(1, 3), L=st.integers(1, 6), S=st.integers(1, 6), h=st.sampled_from([1, 2, 4]),
       hd=st.sampled_from([2, 4]), batch_first=st.booleans(), cross=st.booleans(), bias=st.booleans(),
       mask_kind=st.sampled_from(["none", "bool", "float", "per_head"]), use_kpm=st.booleans(),
       seed=st.integers(0, 2**16))
def test_from_torch_matches_nn_multihead_attention(B, L, S, h, hd, batch_first, cross, bias, mask_kind,
                                                   use_kpm, seed):
    torch.manual_seed(seed)
    d = h * hd
    theirs = nn.MultiheadAttention(d, h, bias=bias, batch_first=batch_first).eval()
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.batch_first == batch_first
    S = S if cross else L
    x = torch.randn(B, L, d)
    c = torch.randn(B, S, d) if cross else x
    allowed = torch.rand(B, h, L, S) > 0.4
    allowed[..., 0] = True                                              # no query loses every key
    kpm_pad = torch.rand(B, S) > 0.6
    kpm_pad[:, 0] = False
    if mask_kind in ("bool", "float"):
        allowed = allowed[0, 0]                                         # (L, S)
    float_masks = mask_kind == "float"
    their_mask = our_mask = None
    if mask_kind != "none":
        our_mask = allowed if not float_masks else torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
        their_mask = ~allowed if not float_masks else our_mask          # torch MHA: True = NOT allowed
        if mask_kind == "per_head":
            their_mask = their_mask.reshape(B * h, L, S)                # torch's (B*h, L, S) is batch-major
    kpm = None
    if use_kpm:
        kpm = kpm_pad if not float_masks else torch.zeros(B, S).masked_fill(kpm_pad, -math.inf)

    def layout(t):
        return t if batch_first else t.transpose(0, 1)

    y_t, w_t = theirs(layout(x), layout(c), layout(c), key_padding_mask=kpm, attn_mask=their_mask,
                      need_weights=True)
    context = None if not cross else layout(c)
    y_o, w_o = ours(layout(x), context, key_padding_mask=kpm, attn_mask=our_mask, need_weights=True)
    y_f, _ = ours(layout(x), context, key_padding_mask=kpm, attn_mask=our_mask)
    torch.testing.assert_close(y_o, y_t, **TOL)
    torch.testing.assert_close(y_f, y_t, **TOL)
    torch.testing.assert_close(w_o.mean(1), w_t, **TOL)                 # torch averages over heads
    if mask_kind == "per_head":                                         # torch's (B*h, L, S) form works too
        y_3d, _ = ours(layout(x), context, key_padding_mask=kpm, attn_mask=our_mask.reshape(B * h, L, S))
        torch.testing.assert_close(y_3d, y_t, **TOL)


def test_from_torch_without_weights_fast_path_and_no_grad():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x, x, x, need_weights=False)[0], **TOL)


def test_from_torch_separate_kdim_vdim():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(16, 4, kdim=6, vdim=10, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)
    assert (ours.kdim, ours.vdim) == (6, 10) and ours.k_proj.weight.shape == (16, 6)
    x, key, value = torch.randn(2, 3, 16), torch.randn(2, 5, 6), torch.randn(2, 5, 10)
    y_t, w_t = theirs(x, key, value)
    y_o, w_o = ours(x, (key, value), need_weights=True)
    torch.testing.assert_close(y_o, y_t, **TOL)
    torch.testing.assert_close(w_o.mean(1), w_t, **TOL)


def test_from_torch_copies_dropout_and_mode():
    theirs = nn.MultiheadAttention(8, 2, dropout=0.25)
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.dropout == 0.25 and ours.training and not ours.batch_first
    assert not MultiHeadAttention.from_torch(theirs.eval()).training


def test_from_torch_rejects_what_it_cannot_copy():
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(ValueError, match="Linear"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))


# ---------------------------------------------------------------- dropout


def test_dropout_only_in_training_mode():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(2, 6, 16)
    mha.eval()
    y1, w1 = mha(x, need_weights=True)
    y2, _ = mha(x)
    torch.testing.assert_close(y1, y2, **TOL)
    torch.testing.assert_close(w1.sum(-1), torch.ones(2, 2, 6))
    mha.train()
    _, w_train = mha(x, need_weights=True)
    assert (w_train == 0).any()                                         # dropped weights
    assert not torch.allclose(mha(x)[0], y2)                            # fused path drops too


# ---------------------------------------------------------------- rope and kv_cache contracts


def test_rope_is_applied_to_q_and_k_with_default_positions():
    torch.manual_seed(0)
    rope = TinyRope(8)
    mha = MultiHeadAttention(16, 2, rope=rope, is_causal=True)
    x = torch.randn(2, 5, 16)
    y, _ = mha(x)
    assert len(rope.calls) == 2 and all(torch.equal(p, torch.arange(5)) for p in rope.calls)
    # Rotary scores depend only on relative position: shifting every position changes nothing...
    y_shift, _ = mha(x, positions=torch.arange(5) + 7)
    torch.testing.assert_close(y_shift, y, **TOL)
    # ...while dropping rope, or giving one batch row other spacings, does change it.
    plain = MultiHeadAttention(16, 2, is_causal=True)
    plain.load_state_dict(mha.state_dict())
    assert not torch.allclose(plain(x)[0], y)
    y_b, _ = mha(x, positions=torch.stack([torch.arange(5), torch.arange(5) * 2]))   # (B, T) positions
    torch.testing.assert_close(y_b[0], y[0], **TOL)
    assert not torch.allclose(y_b[1], y[1])


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("need_weights", [True, False])
def test_kv_cache_decoding_equals_full_causal_forward(n_kv_heads, need_weights):
    torch.manual_seed(0)
    rope = TinyRope(4)
    mha = MultiHeadAttention(16, 4, n_kv_heads, is_causal=True, rope=rope).eval()
    x = torch.randn(2, 7, 16)
    full, _ = mha(x)
    cache = ListCache()
    rope.calls.clear()
    prefill, _ = mha(x[:, :4], cache=cache, need_weights=need_weights)   # 4 tokens at once
    steps = [mha(x[:, t:t + 1], cache=cache, need_weights=need_weights)[0] for t in range(4, 7)]
    assert len(cache) == 7 and cache.k.shape == (2, n_kv_heads, 7, 4)
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, **TOL)
    assert [p.tolist() for p in rope.calls[::2]] == [[0, 1, 2, 3], [4], [5], [6]]  # len(cache) before update


def test_kv_cache_chunk_uses_bottom_right_causal_mask():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, is_causal=True)
    x = torch.randn(1, 5, 8)
    cache = ListCache()
    mha(x[:, :2], cache=cache)
    _, w = mha(x[:, 2:], cache=cache, need_weights=True)            # 3 new queries, 5 keys
    allowed = causal_mask(3, 5, bottom_right=True)
    assert torch.equal(w[0, 0] > 0, allowed)                            # new queries see every cached key


def test_kv_cache_with_padding_counts_cached_keys():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, is_causal=True)
    cache = ListCache()
    mha(torch.randn(2, 3, 8), cache=cache)
    kpm = torch.tensor([[True, False, False, False], [False, False, False, False]])  # left padding
    _, w = mha(torch.randn(2, 1, 8), cache=cache, key_padding_mask=kpm, need_weights=True)
    assert torch.all(w[0, :, :, 0] == 0) and torch.all(w[1, :, :, 0] > 0)


# ---------------------------------------------------------------- gradients


def test_gradients_reach_every_projection():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, 2, is_causal=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    for need_weights in (True, False):
        mha.zero_grad()
        mha(x, need_weights=need_weights)[0].pow(2).sum().backward()
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj):
            assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_half_precision_weights_path():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).to(torch.bfloat16)
    x = torch.randn(1, 4, 16, dtype=torch.bfloat16)
    y, w = mha(x, need_weights=True)
    assert y.dtype == w.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), mha.float()(x.float())[0], atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, message", [
    ((10, 3), "d_model=10 is not divisible by n_heads=3"),
    ((12, 4, 3), "n_heads=4 is not a multiple of n_kv_heads=3"),
    ((0, 1), "d_model must be a positive int, got 0"),
    ((8, 2, 0), "n_kv_heads must be a positive int, got 0"),
])
def test_bad_construction(args, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(*args)


def test_bad_dropout():
    with pytest.raises(ValueError, match="dropout must be in"):
        MultiHeadAttention(8, 2, dropout=1.5)


def test_bad_x_and_context():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(B, T, d_model\) with d_model=8, got \(4, 8\)"):
        mha(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"d_model=8, got \(2, 4, 6\)"):
        mha(torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="x must be a floating-point tensor, got dtype torch.int64"):
        mha(torch.ones(2, 4, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"context \(keys\) must be \(B, S, 8\), got \(2, 5, 7\)"):
        mha(torch.randn(2, 4, 8), torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"context \(keys\) \(3, 5, 8\) has batch size 3 but x \(2, 4, 8\) has 2"):
        mha(torch.randn(2, 4, 8), torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"keys \(2, 5, 8\) and values \(2, 6, 8\) need the same length S"):
        mha(torch.randn(2, 4, 8), (torch.randn(2, 5, 8), torch.randn(2, 6, 8)))
    with pytest.raises(ValueError, match="context \\(keys\\) must be a floating-point tensor, got dtype torch.int64"):
        mha(torch.randn(2, 4, 8), torch.ones(2, 5, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="self-attention only"):
        MultiHeadAttention(8, 2, rope=TinyRope(4))(torch.randn(1, 2, 8), torch.randn(1, 3, 8))


def test_self_attention_needs_kdim_and_vdim_equal_to_d_model():
    mha = MultiHeadAttention(16, 4, kdim=6, vdim=10)
    with pytest.raises(ValueError, match=r"self-attention \(context=None\) projects x \(2, 3, 16\) to keys and "
                                         r"values, which needs kdim == vdim == d_model=16, but this module has "
                                         r"kdim=6, vdim=10: pass context=\(keys, values\)"):
        mha(torch.randn(2, 3, 16))
    with torch.no_grad(), pytest.raises(ValueError, match="kdim=6, vdim=10"):
        mha(torch.randn(2, 3, 16))                                      # the inference path too
    with pytest.raises(ValueError, match="kdim=16, vdim=10"):
        MultiHeadAttention(16, 4, vdim=10)(torch.randn(2, 3, 16))


@pytest.mark.parametrize("module_dtype, x_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32),
                                                   (torch.float64, torch.float32)])
def test_dtype_mismatch_names_both_dtypes(module_dtype, x_dtype):
    mha = MultiHeadAttention(8, 2, dtype=module_dtype)
    x = torch.randn(2, 4, 8, dtype=x_dtype)
    with pytest.raises(ValueError, match=rf"x \(2, 4, 8\) has dtype {x_dtype} but the module's parameters are "
                                         rf"{module_dtype}"):
        mha(x)
    with torch.no_grad(), pytest.raises(ValueError, match=f"x .* has dtype {x_dtype}"):
        mha(x)
    good = torch.randn(2, 4, 8, dtype=module_dtype)
    with pytest.raises(ValueError, match=rf"context \(keys\) \(2, 5, 8\) has dtype {x_dtype} but the module's "
                                         rf"parameters are {module_dtype}"):
        mha(good, torch.randn(2, 5, 8, dtype=x_dtype))
    with pytest.raises(ValueError, match=rf"context \(values\) \(2, 5, 8\) has dtype {x_dtype}"):
        mha(good, (torch.randn(2, 5, 8, dtype=module_dtype), torch.randn(2, 5, 8, dtype=x_dtype)))


@pytest.mark.parametrize("need_weights", [True, False])
def test_autocast_accepts_mixed_dtypes(need_weights):
    """Under torch.autocast, a bf16 x with float32 weights is normal (the previous layer was autocast too)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, is_causal=True)
    x = torch.randn(2, 5, 16)
    expected = mha(x)[0]
    for inputs in (x, x.bfloat16()):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = mha(inputs, need_weights=need_weights)
            y_cross, _ = mha(inputs, inputs.bfloat16(), need_weights=need_weights)
        assert y.dtype == y_cross.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), expected, atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(y_cross.float(), y.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_context_sequence_must_be_a_pair(n):
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    for kind in (tuple, list):
        with pytest.raises(ValueError, match=rf"context must be one tensor \(keys = values\) or a pair "
                                             rf"\(keys, values\), got a {kind.__name__} of {n} items"):
            mha(x, kind(torch.randn(2, 5, 8) for _ in range(n)))
    with pytest.raises(ValueError, match=r"context \(values\) must be \(B, S, 8\), got str"):
        mha(x, (torch.randn(2, 5, 8), "values"))


def test_sequence_first_errors_report_the_shapes_passed():
    """batch_first=False: messages show (T, B, ...) layouts and the tensors as given, not transposed."""
    mha = MultiHeadAttention(8, 2, batch_first=False)
    x = torch.randn(4, 2, 8)                                            # (T, B, d)
    with pytest.raises(ValueError, match=r"x must be \(T, B, d_model\) with d_model=8, got \(4, 2, 6\)"):
        mha(torch.randn(4, 2, 6))
    with pytest.raises(ValueError, match=r"context \(keys\) must be \(S, B, 8\), got \(5, 2, 7\)"):
        mha(x, torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match=r"context \(keys\) \(5, 3, 8\) has batch size 3 but x \(4, 2, 8\) has 2"):
        mha(x, torch.randn(5, 3, 8))
    with pytest.raises(ValueError, match=r"keys \(5, 2, 8\) and values \(6, 2, 8\) need the same length S"):
        mha(x, (torch.randn(5, 2, 8), torch.randn(6, 2, 8)))
    with pytest.raises(ValueError, match=r"x \(4, 2, 8\) has dtype torch.float64"):
        mha(x.double())
    y, w = mha(x, torch.randn(5, 2, 8), need_weights=True)               # and the right shapes pass
    assert y.shape == (4, 2, 8) and w.shape == (2, 2, 4, 5)


def test_bad_masks():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\) does not broadcast to the scores "
                                         r"\(..., L, S\) of shape \(2, 2, 4, 4\)"):
        mha(x, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 3, 4, 4\)"):
        mha(x, attn_mask=torch.ones(2, 3, 4, 4, dtype=torch.bool))      # 3 heads, not 2
    with pytest.raises(ValueError, match="attn_mask must be bool .* got dtype torch.int64"):
        mha(x, attn_mask=torch.ones(4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, S\) = \(2, 4\), got \(2, 5\)"):
        mha(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask must be bool .* got dtype torch.int32"):
        mha(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, S\) = \(2, 6\)"):
        mha(x, torch.randn(2, 6, 8), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))


def test_bad_positions():
    mha = MultiHeadAttention(8, 2, rope=TinyRope(4))
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"positions must have shape \(4,\) or \(2, 4\), got \(5,\)"):
        mha(x, positions=torch.arange(5))
    with pytest.raises(ValueError, match="positions must be an integer tensor, got dtype torch.float32"):
        mha(x, positions=torch.arange(4.0))


def test_fused_sdpa_is_torch_sdpa():
    """need_weights=False really is F.scaled_dot_product_attention on the split heads."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(1, 3, 16)
    q, k, v = (t.view(1, 3, 2, 8).transpose(1, 2) for t in (mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)))
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 3, 16)
    torch.testing.assert_close(mha(x)[0], mha.out_proj(out), **TOL)


# ---------------------------------------------------------------- notebook 04's views of the heads


def test_head_grid_and_head_widget():
    import matplotlib.pyplot as plt

    from selfattn_lite.viz import HeadWidget, head_grid

    w = torch.softmax(torch.randn(2, 3, 4, 4), dim=-1)                   # (B, h, L, S)
    fig = head_grid(w[0], list("abcd"), list("abcd"), head_names=["x", "y", "z"], ncols=2)
    drawn = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in drawn] == ["x", "y", "z"]
    assert [t.get_text() for t in drawn[0].get_xticklabels()] == list("abcd")
    plt.close(fig)
    widget = HeadWidget(w, tokens=list("abcd"))
    assert torch.equal(widget.weights, w[0]) and widget.renders == 1
    widget.head.value = "head 2"
    assert torch.equal(widget.weights, w[0, 2])
    widget.example.value = 1
    assert torch.equal(widget.weights, w[1, 2]) and widget.renders == 3 and len(widget.image.value) > 0
    one = HeadWidget(w[0])                                                 # (h, L, S): no example slider
    assert one.controls == [one.head]


@pytest.mark.parametrize("call, message", [
    (lambda HW, grid: HW(torch.zeros(4, 4)), r"\(B, h, L, S\) or \(h, L, S\), got \(4, 4\)"),
    (lambda HW, grid: HW(torch.zeros(1, 2, 3, 3), tokens=list("ab")), "one list of 3 labels"),
    (lambda HW, grid: HW(torch.zeros(2, 3, 3), head_names=["a"]), "1 head names for 2 heads"),
    (lambda HW, grid: grid(torch.zeros(3, 3)), r"per-head weights \(h, L, S\), got \(3, 3\)"),
])
def test_head_views_bad_input(call, message):
    from selfattn_lite.viz import HeadWidget, head_grid

    with pytest.raises(ValueError, match=message):
        call(HeadWidget, head_grid)


def test_kv_cache_keyword_is_the_deprecated_name_of_cache():
    """``kv_cache=`` still works (DESIGN.md documents it) but warns; ``cache=`` is the name."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, is_causal=True).eval()
    x = torch.randn(1, 5, 8)
    new, old = KVCache(1, 2, 8, 4), KVCache(1, 2, 8, 4)
    with torch.no_grad():
        want, _ = mha(x, cache=new)
        with pytest.warns(DeprecationWarning, match="kv_cache=.*deprecated.*cache="):
            got, _ = mha(x, kv_cache=old)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert len(old) == len(new) == 5
    with pytest.raises(ValueError, match="pass the layer's cache once"):
        mha(x, cache=KVCache(1, 2, 8, 4), kv_cache=KVCache(1, 2, 8, 4))
