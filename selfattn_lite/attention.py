"""Scaled dot-product attention, written out explicitly.

A transparent twin of ``torch.nn.functional.scaled_dot_product_attention``: the same
arguments and semantics, but every step is plain tensor code and the attention
weights are returned next to the output, so a learner can look at them.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import (
    check_bool,
    check_int,
    check_mask,
    check_qkv,
    check_real,
    check_scale,
    check_tensor,
    is_int,
    shape_str,
)

__all__ = ["scaled_dot_product_attention", "attention_backward", "safe_softmax", "upcast_dtype", "validate_qkv",
           "validate_mask"]

HALF_DTYPES = (torch.float16, torch.bfloat16)


def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention is computed in: float32 for half-precision inputs, else the inputs' own.

    Taught in notebook 09, "5 · float16 overflow of the scores".
    """
    return torch.float32 if dtype in HALF_DTYPES else dtype


def safe_softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """Softmax that gives zeros, not NaN, on a row where every score is -inf.

    A fully masked row has no key to attend to; torch >= 2.5 returns zero weights
    (and so a zero output) there, and so do we. The row is replaced by zeros *before*
    the softmax too, so no NaN flows back through it in the backward pass either.

    When no row is fully masked (the usual case) it is a plain ``torch.softmax``, so autograd keeps
    the weights once, as the same tensor the next matrix product keeps (notebook 11, "What SDPA
    keeps"). With a fully masked row the guard's ``masked_fill`` makes a copy, and the graph keeps
    the softmax's result and the filled weights apart: two (..., L, S) tensors.

    Taught in notebook 03, "A query with nothing to look at".
    """
    check_tensor("scores", scores, floating=True)
    if scores.dim() < 1:
        raise ValueError("scores must have at least 1 dim, got a 0-dim tensor")
    check_int("dim", dim, low=-scores.dim(), high=scores.dim() - 1)
    fully_masked = torch.isneginf(scores).all(dim=dim, keepdim=True)
    if not fully_masked.any():                       # no guard needed: one tensor of weights, not two
        return torch.softmax(scores, dim=dim)
    weights = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=dim)
    return weights.masked_fill(fully_masked, 0.0)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + M) V, with the weights.

    Same arguments and semantics as ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        query: (..., Hq, L, E) queries; any number of leading dims.
        key: (..., H, S, E) keys.
        value: (..., H, S, Ev) values.
        attn_mask: broadcastable to (..., L, S). Boolean: True = may attend.
            Floating: added to the scores (0 = attend, -inf = never).
        dropout_p: probability of zeroing a weight (applied whenever > 0, as torch does;
            pass 0.0 in eval mode yourself).
        is_causal: query i sees keys 0..i (aligned top-left, like torch). Not with attn_mask
            (torch refuses the pair too; combine masks with ``masks.combine_masks``).
        scale: multiplies the scores; default 1 / sqrt(E).
        enable_gqa: allow Hq to be a multiple of H; key/value head j serves query heads
            j*g .. (j+1)*g - 1 where g = Hq / H (``repeat_interleave``).

    Returns:
        output (..., Hq, L, Ev) in the input dtype, and weights (..., Hq, L, S), the
        (post-dropout) attention probabilities, also in the input dtype. A query row
        with every key masked gets zero weights and a zero output. Half-precision
        inputs are computed in float32 and cast back.

    Taught in notebook 01, "Check against the package and torch".
    """
    validate_qkv(query, key, value, enable_gqa=enable_gqa)
    check_real("dropout_p", dropout_p, low=0, high=1)
    _check_options(is_causal, scale, enable_gqa)
    if attn_mask is not None:
        validate_mask(attn_mask, _scores_shape(query, key, enable_gqa))
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both (combine them with "
                         "selfattn_lite.masks.combine_masks(causal_mask(L, S), mask))")
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(E)

    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(group, dim=-3)      # (..., Hq, S, E)
        value = value.repeat_interleave(group, dim=-3)  # (..., Hq, S, Ev)

    dtype = query.dtype
    compute = upcast_dtype(dtype)
    q, k, v = query.to(compute), key.to(compute), value.to(compute)

    scores = (q @ k.transpose(-2, -1)) * scale          # (..., Hq, L, S)
    if is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()   # top-left
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(compute)

    weights = safe_softmax(scores, dim=-1)              # (..., Hq, L, S), rows sum to 1
    if dropout_p > 0.0:
        weights = torch.dropout(weights, dropout_p, train=True)
    output = weights @ v                                # (..., Hq, L, Ev)
    return output.to(dtype), weights.to(dtype)


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of O = softmax(Q K^T * scale + M) V with respect to q, k and v, by hand.

    With S = scale Q K^T + M, P = softmax(S) (row by row) and O = P V, and dO = grad_out:

        dV = P^T dO
        dP = dO V^T
        dS = P * (dP - rowsum(dP * P))         the softmax Jacobian, one row at a time
        dQ = scale dS K
        dK = scale dS^T Q

    The same numbers as autograd through ``torch.nn.functional.scaled_dot_product_attention``
    (no dropout). A fully masked query row has P = 0, so it sends no gradient anywhere. With
    ``enable_gqa`` each key/value head serves g = Hq / H query heads, so its dK and dV are the
    sums over those g heads; leading dims that were broadcast are summed the same way.

    Args:
        q: (..., Hq, L, E) queries; k: (..., H, S, E) keys; v: (..., H, S, Ev) values.
        grad_out: (..., Hq, L, Ev) the gradient of the loss with respect to the output O.
        attn_mask, is_causal, scale, enable_gqa: as in ``scaled_dot_product_attention``.

    Returns:
        (dq, dk, dv), shaped like q, k and v, in their dtype (computed in float32 for half inputs).

    Taught in notebook 11, "All five gradients, built in cells".
    """
    check_qkv(q, k, v, enable_gqa=enable_gqa, names=("q", "k", "v"))
    check_tensor("grad_out", grad_out)
    _check_options(is_causal, scale, enable_gqa)
    if attn_mask is not None:
        validate_mask(attn_mask, _scores_shape(q, k, enable_gqa))
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
    out_shape = (*_scores_shape(q, k, enable_gqa)[:-1], v.shape[-1])
    if tuple(grad_out.shape) != out_shape:
        raise ValueError(f"grad_out must have the output's shape {'(' + ', '.join(map(str, out_shape)) + ')'} "
                         f"(query {shape_str(q)}, value {shape_str(v)}), got {shape_str(grad_out)}")
    if grad_out.dtype != q.dtype:
        raise ValueError(f"grad_out must have the inputs' dtype {q.dtype}, got {grad_out.dtype}")
    E = q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    compute = upcast_dtype(q.dtype)
    qc, kc, vc, do = (t.to(compute) for t in (q, k, v, grad_out))

    group = q.shape[-3] // k.shape[-3] if enable_gqa else 1
    if group > 1:
        kc = kc.repeat_interleave(group, dim=-3)            # (..., Hq, S, E)
        vc = vc.repeat_interleave(group, dim=-3)            # (..., Hq, S, Ev)
    _, p = scaled_dot_product_attention(qc, kc, vc, attn_mask=attn_mask, is_causal=is_causal,
                                        scale=scale)        # P: (..., Hq, L, S)

    dv = p.transpose(-2, -1) @ do                           # (..., Hq, S, Ev)
    dp = do @ vc.transpose(-2, -1)                          # (..., Hq, L, S)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))      # (..., Hq, L, S)
    dq = scale * (ds @ kc)                                  # (..., Hq, L, E)
    dk = scale * (ds.transpose(-2, -1) @ qc)                # (..., Hq, S, E)

    if group > 1:                                           # each K/V head: sum over its g query heads
        dk = dk.unflatten(-3, (k.shape[-3], group)).sum(dim=-3)   # (..., H, S, E)
        dv = dv.unflatten(-3, (k.shape[-3], group)).sum(dim=-3)   # (..., H, S, Ev)
    # broadcast leading dims: sum the gradient back to each input's own shape
    dq, dk, dv = dq.sum_to_size(q.shape), dk.sum_to_size(k.shape), dv.sum_to_size(v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---------------------------------------------------------------------------------------------
# Argument checks (shared by multihead and efficient)
# ---------------------------------------------------------------------------------------------

def validate_qkv(query: Tensor, key: Tensor, value: Tensor, *, enable_gqa: bool = False) -> None:
    """Check that query (..., Hq, L, E), key (..., H, S, E), value (..., H, S, Ev) fit together.

    Raises:
        ValueError: naming the shapes when they do not fit.

    Taught in notebook 01, "Check against the package and torch".
    """
    check_qkv(query, key, value, enable_gqa=enable_gqa)


def _scores_shape(q: Tensor, k: Tensor, enable_gqa: bool) -> tuple:
    """The scores' shape (..., Hq, L, S) of checked q, k."""
    q_lead, k_lead = q.shape[:-2], k.shape[:-2]
    if enable_gqa:
        k_lead = (*k_lead[:-1], q_lead[-1])
    return (*torch.broadcast_shapes(q_lead, k_lead), q.shape[-2], k.shape[-2])


def _check_options(is_causal, scale, enable_gqa) -> None:
    """is_causal and enable_gqa are bools; scale is None or a finite number."""
    check_bool("is_causal", is_causal)
    check_bool("enable_gqa", enable_gqa)
    check_scale(scale)


def validate_mask(attn_mask: Tensor, scores_shape: torch.Size) -> None:
    """Check that a mask is boolean or floating and broadcasts to the scores (..., L, S).

    Taught in notebook 03, "1 · The additive mask".
    """
    if isinstance(scores_shape, str) or not isinstance(scores_shape, torch.Size | tuple | list) \
            or len(scores_shape) < 2 or not all(is_int(n) and n >= 0 for n in scores_shape):
        raise ValueError(f"scores_shape must be the scores' shape (..., L, S), a torch.Size or a tuple of "
                         f"at least 2 sizes, got {scores_shape!r}")
    check_mask("attn_mask", attn_mask, scores_shape)
