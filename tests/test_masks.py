import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite import masks
from selfattn_lite import scaled_dot_product_attention as sdpa


@given(st.integers(1, 12), st.integers(1, 12))
def test_causal_mask_top_left_is_torch_is_causal(L, S):
    q, k, v = torch.randn(L, 4), torch.randn(S, 4), torch.randn(S, 3)
    m = masks.causal_mask(L, S)
    assert m.shape == (L, S) and m.dtype == torch.bool
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=m), expected)


@given(st.integers(1, 12), st.integers(0, 12))
def test_causal_mask_bottom_right_lets_new_queries_see_every_cached_key(L, cached):
    S = L + cached
    m = masks.causal_mask(L, S, bottom_right=True)
    for i in range(L):                         # query i is at absolute position cached + i
        assert m[i].tolist() == [j <= cached + i for j in range(S)]
    # it is the last L rows of the full causal mask
    assert torch.equal(m, masks.causal_mask(S)[-L:])


def test_bottom_right_matches_torch_causal_lower_right():
    from torch.nn.attention.bias import causal_lower_right
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 7))
    got, _ = sdpa(q, k, v, attn_mask=masks.causal_mask(3, 7, bottom_right=True))
    torch.testing.assert_close(got, expected)


def test_padding_mask():
    m = masks.padding_mask([3, 1, 0], 4)
    assert m.tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]
    assert masks.padding_mask(torch.tensor([2, 5])).shape == (2, 5)


def test_key_padding_to_attn_mask_and_combine():
    real = masks.padding_mask([2, 3], 3)                    # (B, S)
    key_mask = masks.key_padding_to_attn_mask(real)         # (B, 1, 1, S)
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


@pytest.mark.parametrize("call, match", [
    (lambda: masks.causal_mask(0), r"L must be a positive int, got 0"),
    (lambda: masks.causal_mask(3, -1), r"S must be a positive int, got -1"),
    (lambda: masks.padding_mask([1, 5], 4), r"\[0, max_len=4\], got \[1, 5\]"),
    (lambda: masks.padding_mask([[1, 2]], 4), r"1-D integer.*\(1, 2\)"),
    (lambda: masks.padding_mask([1.5], 4), r"1-D integer"),
    (lambda: masks.combine_masks(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, 3, dtype=torch.bool)),
     r"\(2, 3\), \(4, 3\) do not broadcast"),
    (lambda: masks.combine_masks(torch.zeros(2, 2)), r"bool masks.*torch.float32"),
    (lambda: masks.to_additive(torch.zeros(2, 2)), r"bool mask.*torch.float32"),
    (lambda: masks.key_padding_to_attn_mask(torch.ones(2, 3)), r"\(B, S\) bool mask.*\(2, 3\)"),
    (lambda: masks.combine_masks([[True]]), r"each mask must be a torch.Tensor, got list"),
    (lambda: masks.to_additive([[True]]), r"mask must be a torch.Tensor, got list"),
    (lambda: masks.to_additive(masks.causal_mask(2), dtype=torch.int64), r"floating, got torch.int64"),
    (lambda: masks.is_fully_masked([[True]]), r"torch.Tensor, got list"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
