"""selfattn_lite.scaled_dot_product_attention against torch's fused SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite import scaled_dot_product_attention as sdpa
from selfattn_lite.attention import safe_softmax

# every device present: CPU here and in CI; CUDA too on a GPU machine (the same tests, not skipped ones)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-8),
       torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


@st.composite
def attention_inputs(draw, gqa=False):
    lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    hkv = draw(st.integers(1, 3))
    hq = hkv * draw(st.integers(1, 3)) if gqa else hkv
    L, S = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    E, Ev = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    device = draw(st.sampled_from(DEVICES))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, hq, L, E, generator=g).to(device, dtype)
    k = torch.randn(*lead, hkv, S, E, generator=g).to(device, dtype)
    v = torch.randn(*lead, hkv, S, Ev, generator=g).to(device, dtype)
    return q, k, v, g


def mask_for(draw_kind, q, k, g):
    """A mask broadcastable to (..., L, S) of the given kind, with some fully masked rows."""
    L, S = q.shape[-2], k.shape[-2]
    if draw_kind == "none":
        return None
    shape = (*q.shape[:-2], L, S) if draw_kind.endswith("full") else (L, S)
    allowed = (torch.rand(*shape, generator=g) > 0.5).to(q.device)
    allowed[..., 0, :] = False                       # the first query row is fully masked
    if draw_kind.startswith("bool"):
        return allowed
    additive = torch.randn(*shape, generator=g).to(q.device, q.dtype)
    return additive.masked_fill(~allowed, float("-inf"))


# torch's documented output for a query row that may attend to no key: zeros on every backend since
# torch 2.5 (SDPA calls _safe_softmax and the fused kernels were updated, pytorch/pytorch#133882); before
# that, the fused CUDA kernels returned NaN there. Ours gives zeros everywhere.
TORCH_ZEROS_FULLY_MASKED_ROWS = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def assert_matches_torch(out, expected, mask, tol):
    """out == torch's expected, with torch's documented behaviour on fully masked rows per version and device."""
    if mask is None or TORCH_ZEROS_FULLY_MASKED_ROWS or out.device.type == "cpu":
        torch.testing.assert_close(out, expected, **tol)
        return
    allowed = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
    empty = ~allowed.any(-1).expand(out.shape[:-1])        # (..., L) rows that see no key
    assert (out[empty] == 0).all()                          # ours: zeros; torch < 2.5 on CUDA: NaN allowed
    torch.testing.assert_close(out[~empty], expected[~empty], **tol)


@given(attention_inputs(), st.sampled_from(["none", "bool", "bool-full", "float", "float-full"]),
       st.one_of(st.none(), st.floats(0.05, 2.0)))
def test_matches_torch_sdpa(inputs, mask_kind, scale):
    q, k, v, g = inputs
    mask = mask_for(mask_kind, q, k, g)
    out, weights = sdpa(q, k, v, attn_mask=mask, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    assert out.dtype == q.dtype and weights.dtype == q.dtype
    assert weights.shape == (*q.shape[:-1], k.shape[-2])
    assert_matches_torch(out, expected, mask, TOL[q.dtype])


@given(attention_inputs())
def test_is_causal_matches_torch_top_left(inputs):
    q, k, v, _ = inputs
    out, weights = sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL[q.dtype])
    L, S = q.shape[-2], k.shape[-2]
    above = ~torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    assert (weights[..., above] == 0).all()


@given(attention_inputs(gqa=True), st.sampled_from(["none", "bool", "float"]))
def test_gqa_matches_torch(inputs, mask_kind):
    q, k, v, g = inputs
    mask = mask_for(mask_kind, q, k, g)
    out, weights = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_matches_torch(out, expected, mask, TOL[q.dtype])
    assert weights.shape[-3] == q.shape[-3]


@given(attention_inputs())
def test_weights_rows_are_distributions_and_output_is_weights_at_v(inputs):
    q, k, v, _ = inputs
    q, k, v = q.double(), k.double(), v.double()
    out, weights = sdpa(q, k, v)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))
    torch.testing.assert_close(out, weights @ v)


@given(attention_inputs(), st.sampled_from(["none", "bool", "bool-full", "float", "float-full"]),
       st.booleans())
def test_gradients_match_torch_even_through_fully_masked_rows(inputs, mask_kind, is_causal):
    q, k, v, g = inputs
    q, k, v = q.double(), k.double(), v.double()       # float64: gradients compared tightly
    mask = None if is_causal else mask_for(mask_kind, q, k, g)
    mask = mask.double() if mask is not None and mask.is_floating_point() else mask
    upstream = torch.randn(*q.shape[:-1], v.shape[-1], generator=g, dtype=torch.float64).to(q.device)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    (sdpa(*ours, attn_mask=mask, is_causal=is_causal)[0] * upstream).sum().backward()
    (F.scaled_dot_product_attention(*theirs, attn_mask=mask, is_causal=is_causal) * upstream).sum().backward()
    for a, b in zip(ours, theirs):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad, b.grad, **TOL[torch.float64])


def test_fully_masked_rows_give_zero_weights_and_output_like_torch():
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 6)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    out, weights = sdpa(q, k, v, attn_mask=mask)
    assert torch.equal(weights[:, 2], torch.zeros(2, 5)) and torch.equal(out[:, 2], torch.zeros(2, 6))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert not out.isnan().any()


def test_default_scale_is_inverse_sqrt_of_head_dim():
    q, k, v = torch.randn(3, 16), torch.randn(4, 16), torch.randn(4, 2)
    _, weights = sdpa(q, k, v)
    torch.testing.assert_close(weights, torch.softmax(q @ k.T / math.sqrt(16), dim=-1))


def test_half_inputs_compute_softmax_in_float32():
    # scores this large overflow float16 (max 65504) if computed in half precision
    q = torch.full((1, 2, 64), 40.0, dtype=torch.float16)
    k = torch.full((1, 3, 64), 40.0, dtype=torch.float16)
    v = torch.randn(1, 3, 4).to(torch.float16)
    out, weights = sdpa(q, k, v, scale=1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(weights, torch.full((1, 2, 3), 1 / 3, dtype=torch.float16))


@pytest.mark.parametrize("use_mask", [False, True])
def test_dropout_is_applied_as_torch_does(use_mask):
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 5)
    mask = torch.rand(6, 7) > 0.3 if use_mask else None
    torch.manual_seed(123)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3)
    torch.manual_seed(123)
    out, weights = sdpa(q, k, v, attn_mask=mask, dropout_p=0.3)
    torch.testing.assert_close(out, expected)
    kept = weights[weights > 0]
    assert (weights == 0).any() and kept.numel() > 0        # some weights dropped, the rest rescaled by 1/(1-p)


def test_dropout_of_one_drops_everything_like_torch():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    out, weights = sdpa(q, k, v, dropout_p=1.0)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)) and not weights.any()


def test_safe_softmax():
    scores = torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]])
    torch.testing.assert_close(safe_softmax(scores), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def saved_weights(out: torch.Tensor, shape: tuple) -> list:
    """Every floating tensor of ``shape`` that the autograd graph behind ``out`` keeps for the backward."""
    found, todo, seen = [], [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found += [getattr(node, name) for name in dir(node) if name.startswith("_saved_")
                  and isinstance(getattr(node, name), torch.Tensor) and getattr(node, name).is_floating_point()
                  and getattr(node, name).numel() == math.prod(shape)]
        todo.extend(parent for parent, _ in node.next_functions)
    return found


def test_explicit_attention_keeps_the_weights_once_without_fully_masked_rows():
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    out, weights = sdpa(q, k, v, is_causal=True)
    kept = saved_weights(out, (2, 3, 5, 5))                   # softmax's result and the product's P
    assert len(kept) == 2 and all(torch.equal(t.reshape(weights.shape), weights) for t in kept)
    assert len({t.untyped_storage().data_ptr() for t in kept}) == 1          # one storage: P kept once


def test_explicit_attention_with_a_fully_masked_row_keeps_two_copies_and_gives_zero_gradient():
    q, k, v = (torch.randn(1, 5, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False
    out, weights = sdpa(q, k, v, attn_mask=mask)
    storages = {t.untyped_storage().data_ptr() for t in saved_weights(out, (1, 5, 5))}
    assert len(storages) == 2                                                 # the guard's copy (docstring)
    out.sum().backward()
    assert not weights[:, 2].any() and q.grad[:, 2].abs().max() == 0 and not q.grad.isnan().any()


# ---- bad input: a ValueError that names the shapes ----

@pytest.mark.parametrize("q_shape, k_shape, v_shape, kwargs, match", [
    ((2, 4, 8), (2, 5, 7), (2, 5, 3), {}, r"query \(2, 4, 8\).*E=8.*key \(2, 5, 7\).*E=7"),
    ((2, 4, 8), (2, 5, 8), (2, 6, 3), {}, r"key \(2, 5, 8\), value \(2, 6, 3\)"),
    ((4, 8), (2, 5, 8), (2, 5, 3), {}, r"same number of dims"),
    ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8), {}, r"do not broadcast.*enable_gqa"),
    ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"enable_gqa": True}, r"Hq=3 must be a multiple of.*H=2"),
    ((8,), (5, 8), (5, 8), {}, r"at least 2 dims.*\(8,\)"),
    ((4, 0), (5, 0), (5, 3), {}, r"non-empty last dim E.*\(4, 0\)"),
])
def test_bad_shapes_raise_value_error_naming_them(q_shape, k_shape, v_shape, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sdpa(torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape), **kwargs)


def test_bad_masks_raise_value_error():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not broadcast.*\(2, 4, 5\)"):
        sdpa(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4, 5\).*\(2, 4, 5\)"):
        sdpa(q, k, v, attn_mask=torch.ones(3, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool .* or floating .*torch.int64"):
        sdpa(q, k, v, attn_mask=torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="not both"):
        sdpa(q, k, v, attn_mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True)


def test_bad_dtypes_and_dropout_raise_value_error():
    q, k, v = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="share a dtype"):
        sdpa(q, k.double(), v)
    with pytest.raises(ValueError, match="floating-point"):
        sdpa(q.long(), k, v)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\], got 1.5"):
        sdpa(q, k, v, dropout_p=1.5)
