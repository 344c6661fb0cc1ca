"""Masks against torch and against their definitions, over random shapes; bad input; notebook 03's MaskWidget."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from selfattn_lite import masks
from selfattn_lite.attention import scaled_dot_product_attention
from selfattn_lite.multihead import MultiHeadAttention

sizes = st.integers(1, 9)
seeds = st.integers(0, 2**16)


def qkv(B, H, L, S, E, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, n, E, generator=gen) for n in (L, S, S))


@given(L=sizes, S=sizes)
def test_causal_mask_definition(L, S):
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    assert torch.equal(masks.causal_mask(L, S), j <= i)                          # top-left
    assert torch.equal(masks.causal_mask(L, S, bottom_right=True), j <= i + (S - L))
    assert torch.equal(masks.causal_mask(L), masks.causal_mask(L, L, bottom_right=True))


@given(L=sizes, S=sizes, seed=seeds)
def test_top_left_causal_is_torch_is_causal(L, S, seed):
    q, k, v = qkv(2, 2, L, S, 4, seed)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal_mask(L, S)), expected)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, attn_mask=masks.causal_mask(L, S))[0], expected)


@given(L=sizes, extra=st.integers(0, 6), seed=seeds)
def test_bottom_right_causal_is_torch_causal_lower_right(L, extra, seed):
    S = L + extra                                                                 # queries after cached keys
    q, k, v = qkv(1, 2, L, S, 4, seed)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S))
    ours = scaled_dot_product_attention(q, k, v, attn_mask=masks.causal_mask(L, S, bottom_right=True))[0]
    torch.testing.assert_close(ours, expected)


@given(n_cached=st.integers(0, 5), n_new=st.integers(1, 5), seed=seeds)
def test_bottom_right_rows_equal_full_causal_attention(n_cached, n_new, seed):
    """New queries appended after cached keys see exactly what full causal attention shows them."""
    T = n_cached + n_new
    q, k, v = qkv(1, 2, T, T, 4, seed)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    new = F.scaled_dot_product_attention(q[..., n_cached:, :], k, v,
                                         attn_mask=masks.causal_mask(n_new, T, bottom_right=True))
    torch.testing.assert_close(new, full[..., n_cached:, :])


@given(lengths=st.lists(st.integers(0, 7), min_size=1, max_size=4), extra=st.integers(0, 3))
def test_padding_mask_definition(lengths, extra):
    T = max(lengths) + extra
    real = masks.padding_mask(lengths, T)
    assert real.shape == (len(lengths), T) and real.dtype == torch.bool
    assert real.sum(-1).tolist() == lengths
    for b, n in enumerate(lengths):
        assert real[b, :n].all() and not real[b, n:].any()                        # right padding


@given(B=st.integers(1, 3), L=sizes, S=sizes, seed=seeds, p=st.floats(0.0, 1.0))
def test_random_bool_masks_match_torch_and_additive_form(B, L, S, seed, p):
    """Bool mask, its additive form, torch SDPA and ours agree; fully masked rows give zeros."""
    q, k, v = qkv(B, 2, L, S, 4, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    allowed = torch.rand(B, 1, L, S, generator=gen) >= p                          # any row may be empty
    additive = masks.to_additive(allowed)
    out, w = scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, attn_mask=additive)[0], out)
    assert torch.equal(w.masked_select(~allowed), torch.zeros(int((~allowed).sum()) * 2))   # exactly 0
    empty = masks.is_fully_masked(allowed).expand(B, 2, L)                      # (B, h, L)
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    sums = w.sum(-1)
    torch.testing.assert_close(sums[~empty], torch.ones_like(sums[~empty]))
    if empty.any():                                                                # a hand-written softmax: NaN
        assert torch.isnan(torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~allowed, -torch.inf), -1)[empty]).all()


@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=seeds)
def test_padding_is_invisible_to_real_tokens(lengths, seed):
    T = max(lengths)
    q, k, v = qkv(len(lengths), 1, T, T, 4, seed)
    key_mask = masks.key_padding_to_attn_mask(masks.padding_mask(lengths, T))       # (B, 1, 1, T)
    both = masks.combine_masks(masks.causal_mask(T), key_mask)                    # (B, 1, T, T)
    for mask, causal in ((key_mask, False), (both, True)):
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask)[0]
        for b, n in enumerate(lengths):
            alone = F.scaled_dot_product_attention(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                                   is_causal=causal)
            torch.testing.assert_close(out[b:b + 1, :, :n], alone)


@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=3))
def test_left_padding_with_causal_leaves_rows_empty(lengths):
    """Left padding + causal: query i of a sequence padded by p sees nothing exactly when i < p."""
    T = 5
    real = masks.padding_mask(lengths, T).flip(-1)                               # left padding
    mask = masks.combine_masks(masks.causal_mask(T), real[:, None, :])
    empty = masks.is_fully_masked(mask)                                          # (B, T)
    for b, n in enumerate(lengths):
        assert empty[b].tolist() == [i < T - n for i in range(T)]


@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=3), float_kpm=st.booleans(), seed=seeds)
def test_queries_that_see_no_key_give_finite_gradients(lengths, float_kpm, seed):
    """Left padding + causal through MultiHeadAttention: the padded queries that see no key get zero
    attention (output = out_proj's bias), and every gradient is finite, on both paths and for bool and
    float (additive -inf) key_padding_masks; the two paths agree on outputs and gradients."""
    T = 5
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2, is_causal=True)
    pad = ~masks.padding_mask(lengths, T).flip(-1)                               # (B, T) True = padding, left
    kpm = torch.zeros(pad.shape).masked_fill(pad, -math.inf) if float_kpm else pad
    x = torch.randn(len(lengths), T, 8)
    results = []
    for need_weights in (True, False):
        xg = x.clone().requires_grad_()
        mha.zero_grad()
        y = mha(xg, key_padding_mask=kpm, need_weights=need_weights)[0]         # (B, T, 8)
        y.pow(2).sum().backward()
        grads = [xg.grad] + [p.grad for p in mha.parameters()]
        assert all(torch.isfinite(g).all() for g in grads), f"need_weights={need_weights}"
        torch.testing.assert_close(y[pad], mha.out_proj.bias.detach().expand(int(pad.sum()), 8))
        results.append((y, grads))
    (y_explicit, g_explicit), (y_fused, g_fused) = results
    torch.testing.assert_close(y_fused, y_explicit, atol=1e-5, rtol=1e-5)
    for g_e, g_f in zip(g_explicit, g_fused):
        torch.testing.assert_close(g_f, g_e, atol=1e-5, rtol=1e-5)


@given(B=st.integers(1, 3), T=st.integers(2, 7), t=st.integers(0, 5), seed=seeds)
def test_causal_outputs_do_not_see_the_future(B, T, t, seed):
    t = min(t, T - 2)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2, is_causal=True)
    x = torch.randn(B, T, 8)
    x2 = x.clone()
    x2[:, t + 1:] = torch.randn(B, T - t - 1, 8)
    for need_weights in (True, False):
        torch.testing.assert_close(mha(x2, need_weights=need_weights)[0][:, :t + 1],
                                   mha(x, need_weights=need_weights)[0][:, :t + 1])


@given(shape_a=st.sampled_from([(4, 4), (1, 4), (2, 1, 4), (2, 4, 4)]),
       shape_b=st.sampled_from([(4, 4), (4, 1), (2, 1, 1), (1, 4)]), seed=seeds)
def test_combine_masks_is_broadcast_and(shape_a, shape_b, seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.rand(shape_a, generator=gen) > 0.5, torch.rand(shape_b, generator=gen) > 0.5
    assert torch.equal(masks.combine_masks(a, None, b), a & b)
    torch.testing.assert_close(masks.to_additive(a & b), masks.to_additive(a) + masks.to_additive(b))


def test_key_padding_polarity_matches_nn_multihead_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 4, 8)
    real = masks.padding_mask([4, 2], 4)
    _, w = mha(x, x, x, key_padding_mask=~real)                                   # torch: True = padding
    assert torch.equal(w[1, :, 2:], torch.zeros(4, 2))
    assert torch.equal(masks.key_padding_to_attn_mask(real)[:, 0, 0], real)


@pytest.mark.parametrize("call, message", [
    (lambda: masks.causal_mask(0), "L must be a positive int, got 0"),
    (lambda: masks.causal_mask(3, 0), "S must be a positive int, got 0"),
    (lambda: masks.causal_mask(3, -1), r"S must be a positive int, got -1"),
    (lambda: masks.padding_mask([2, 5], 4), r"every length must be in \[0, max_len=4\], got \[2, 5\]"),
    (lambda: masks.padding_mask([[1, 2]], 4), r"1-D integer.*\(1, 2\)"),
    (lambda: masks.padding_mask([1.5]), "integer"),
    (lambda: masks.to_additive(torch.zeros(2, 2)), "expects a bool mask"),
    (lambda: masks.to_additive([[True]]), r"mask must be a torch.Tensor, got list"),
    (lambda: masks.to_additive(masks.causal_mask(2), dtype=torch.int64), r"floating, got torch.int64"),
    (lambda: masks.combine_masks(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, 3, dtype=torch.bool)),
     r"masks of shapes \(2, 3\), \(4, 3\) do not broadcast"),
    (lambda: masks.combine_masks(torch.ones(2, 2)), "bool masks"),
    (lambda: masks.combine_masks([[True]]), r"each mask must be a torch.Tensor, got list"),
    (lambda: masks.key_padding_to_attn_mask(torch.ones(2, 3)), r"real_tokens \(2, 3\) must be bool \(True = real token\) or integer 0/1"),
    (lambda: masks.is_fully_masked([[True]]), r"torch.Tensor, got list"),
])
def test_mask_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_padding_mask_default_length_and_key_padding_form():
    assert masks.padding_mask(torch.tensor([2, 5])).shape == (2, 5)              # max_len = the longest
    real = masks.padding_mask([2, 3], 3)                                          # (B, S)
    key_mask = masks.key_padding_to_attn_mask(real)                               # (B, 1, 1, S)
    combined = masks.combine_masks(masks.causal_mask(3), key_mask)
    assert combined.shape == (2, 1, 3, 3)
    assert combined[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert masks.combine_masks(None, None) is None


def test_to_additive_gives_exact_zero_weights():
    m = masks.causal_mask(4)
    additive = masks.to_additive(m)
    assert additive.dtype == torch.float32
    assert (additive[m] == 0).all() and torch.isneginf(additive[~m]).all()
    w = torch.softmax(torch.randn(4, 4) + additive, dim=-1)
    assert (w[~m] == 0).all()


def test_is_fully_masked():
    m = masks.combine_masks(masks.causal_mask(3), masks.padding_mask([0], 3)[:, None, :])
    assert masks.is_fully_masked(m).tolist() == [[True, True, True]]
    assert masks.is_fully_masked(masks.causal_mask(3)).tolist() == [False, False, False]


# ---------------------------------------------------------------- notebook 03's widget


def test_mask_widget_controls_change_mask_and_weights():
    from selfattn_lite.viz import MaskWidget

    w = MaskWidget(max_len=6)
    assert torch.equal(w.mask, masks.causal_mask(5)) and w.renders == 1
    w.real_keys.value = 3
    assert torch.equal(w.mask, masks.causal_mask(5) & masks.padding_mask([3], 5))
    assert torch.equal(w.weights[:, 3:], torch.zeros(5, 2)) and w.renders == 2
    w.cross.value, w.n_keys.value, w.n_queries.value = True, 4, 6
    w.alignment.value = "bottom-right"                                           # 6 queries after 4 keys
    assert w.weights.shape == (6, 4)
    assert torch.equal(w.mask, masks.causal_mask(6, 4, bottom_right=True) & masks.padding_mask([3], 4))
    assert torch.equal(w.weights[:2], torch.zeros(2, 4))                        # rows with no key: zeros
    w.causal.value = False
    torch.testing.assert_close(w.weights.sum(-1), torch.ones(6))
    assert w.renders == 7 and len(w.image.value) > 0
    assert w.static_figure() is not None


def test_mask_widget_bad_input():
    from selfattn_lite.viz import MaskWidget

    with pytest.raises(ValueError, match="max_len must be an int >= 2, got 1"):
        MaskWidget(max_len=1)


# --------------------------------------------------------------------------------------
# window_mask_2d: Swin's window attention over a grid of patches
# --------------------------------------------------------------------------------------
def _window_mask_loop(h, w, window, shift):
    """The definition, pair by pair: the same shifted square along both axes."""
    def square(x):
        return (x - shift) // window                     # Python's // floors negative numbers too
    mask = torch.zeros(h * w, h * w, dtype=torch.bool)
    for p in range(h * w):
        for p2 in range(h * w):
            (r, c), (r2, c2) = divmod(p, w), divmod(p2, w)
            mask[p, p2] = square(r) == square(r2) and square(c) == square(c2)
    return mask


def _window_mask_cyclic_shift(h, w, window, shift):
    """Swin's construction: roll the grid by -shift, cut regular windows, mask the wrapped pieces."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    src_r, src_c = (rows + shift) % h, (cols + shift) % w            # rolled grid: which patch sits where
    region_r = (rows >= h - window).long() + (rows >= h - shift).long() if shift else torch.zeros_like(rows)
    region_c = (cols >= w - window).long() + (cols >= w - shift).long() if shift else torch.zeros_like(cols)
    label = (rows // window) * (w // window) + cols // window        # regular window of the rolled grid
    piece = region_r * 3 + region_c                                  # which wrapped piece inside it
    key = (label * 9 + piece).flatten()                              # (h*w,) in rolled raster order
    rolled = key[:, None] == key[None, :]                            # attention in the rolled grid
    original = (src_r * w + src_c).flatten()                         # rolled slot -> original patch
    mask = torch.zeros(h * w, h * w, dtype=torch.bool)
    mask[original[:, None], original[None, :]] = rolled              # undo the roll
    return mask


@pytest.mark.parametrize("h, w, window, shift", [(4, 4, 2, 0), (4, 4, 2, 1), (8, 8, 4, 2), (6, 9, 3, 1),
                                                 (8, 4, 4, 3), (3, 3, 3, 1), (2, 4, 1, 0)])
def test_window_mask_2d_matches_the_loop_and_swin_cyclic_shift(h, w, window, shift):
    got = masks.window_mask_2d(h, w, window, shift)
    assert got.dtype == torch.bool and got.shape == (h * w, h * w)
    assert torch.equal(got, _window_mask_loop(h, w, window, shift))
    assert torch.equal(got, _window_mask_cyclic_shift(h, w, window, shift))
    assert torch.equal(got, got.T) and got.diagonal().all()


def test_window_mask_2d_counts():
    regular, shifted = masks.window_mask_2d(8, 8, 4), masks.window_mask_2d(8, 8, 4, shift=2)
    assert regular.sum() == 4 * 16 * 16                      # 4 windows of 16 patches, all pairs
    sizes = [2, 4, 2]                                        # shifted: squares cut 2, 4, 2 along each axis
    assert shifted.sum() == sum((a * b) ** 2 for a in sizes for b in sizes)
    assert masks.window_mask_2d(4, 4, 4).all()                     # one window: global attention


def test_window_mask_2d_rejects_bad_sizes():
    with pytest.raises(ValueError, match="whole number of windows"):
        masks.window_mask_2d(6, 8, 4)
    with pytest.raises(ValueError, match=r"shift must be an int in \[0, 3\]"):
        masks.window_mask_2d(8, 8, 4, shift=4)
    with pytest.raises(ValueError, match="window must be"):
        masks.window_mask_2d(8, 8, 0)
