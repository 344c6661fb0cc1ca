"""Classic attention bugs, each as broken code, its measured symptom, and the fix (notebook 09).

Each pitfall is the broken code the way it is usually written (``broken_*``, a few lines), the
fix (``fixed_*``), and a demo that runs both on small seeded inputs and returns a ``Demo``: what
was measured, whether the symptom showed up with the broken code, and whether the fix removed it.

A demo is registered once, by the ``@pitfall(name, title, notebook, symptom)`` line above it
(the registry is ``pitfall_registry``): ``PITFALLS`` maps each name to its ``Pitfall`` entry (its
description, demo, and for four of them the attention weights to draw, ``weights``). ``run_all()`` runs every demo
(tests/reference/test_pitfalls.py does, and so does notebook 09); ``pitfall_weights`` gives the pictured
weights, which ``viz.PitfallWidget`` draws.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_mask,
    check_module_dtype,
    check_positive_int,
    check_qkv,
    check_real,
    check_tensor,
    shape_str,
)
from .attention import scaled_dot_product_attention
from .masks import causal_mask
from .pitfall_registry import PITFALLS, Demo, Pitfall, Weights, pitfall, run_all

__all__ = [
    "Demo",
    "Pitfall",
    "PITFALLS",
    "pitfall",
    "run_all",
    "HEATMAP_PITFALLS",
    "pitfall_weights",
    # the correct attention, the fix of pitfalls 1 and 2
    "fixed_attention",
    # 1. missing sqrt(dk)
    "broken_no_scale", "demo_missing_scale",
    # 2. softmax over the wrong dim
    "broken_softmax_dim", "demo_softmax_dim",
    # 3. mask polarity
    "demo_mask_polarity",
    # 4. fully masked row
    "broken_masked_softmax", "fixed_masked_softmax", "demo_fully_masked_row",
    # 5. float16 overflow
    "broken_fp16_scores", "fixed_fp16_scores", "demo_fp16_overflow",
    # 6. view after transpose
    "broken_merge_heads_view", "broken_merge_heads_no_transpose", "fixed_merge_heads", "demo_view_after_transpose",
    # 7. dropout in eval
    "BrokenDropoutAttention", "FixedDropoutAttention", "demo_dropout_in_eval",
    # 8. is_causal with a cache
    "broken_decode_is_causal", "fixed_decode_bottom_right", "demo_is_causal_with_cache",
    # 9. RoPE offset
    "demo_rope_offset",
    # 10. RoPE pairing
    "demo_rope_pairing",
    # 11. repeat vs repeat_interleave
    "broken_expand_kv", "fixed_expand_kv", "demo_gqa_repeat",
    # 12. batch_first
    "demo_batch_first",
    # 13. mask on the wrong device
    "BrokenMaskedAttention", "FixedMaskedAttention", "demo_mask_device",
    # 14. weights are not explanations
    "demo_weights_not_explanations",
]


# ---------------------------------------------------------------------------------------------
# Input checks: each broken and fixed function checks what it is given first, so that a wrong shape
# is a clear ValueError, never mistaken for the pitfall's own symptom. The bodies stay the few lines
# a learner reads.
# ---------------------------------------------------------------------------------------------

def _takes_qkv(fn):
    """fn(q, k, v) or a method fn(self, q, k, v): q (..., L, dk), k (..., S, dk), v (..., S, dv), one dtype."""
    method = fn.__code__.co_varnames[0] == "self"
    names = fn.__code__.co_varnames[int(method):int(method) + 3]

    @functools.wraps(fn)
    def checked(*args):
        q, k, v = args[int(method):]
        check_qkv(q, k, v, enable_gqa=None, names=names)
        if q.shape[-2] < 1 or k.shape[-2] < 1:
            raise ValueError(f"{names[0]} {shape_str(q)} and {names[1]} {shape_str(k)} need at least one query "
                             f"and one key")
        return fn(*args)
    return checked


def _takes_qk(fn):
    """fn(q, k): q (..., L, dk), k (..., S, dk), floating, one dtype."""
    @functools.wraps(fn)
    def checked(q, k):
        check_qkv(q, k, k, enable_gqa=None, names=("q", "k", "k"))
        return fn(q, k)
    return checked


def _takes_scores_mask(fn):
    """fn(scores, mask): floating scores (..., L, S), a bool mask (True = may attend) that broadcasts to them."""
    @functools.wraps(fn)
    def checked(scores, mask):
        check_tensor("scores", scores, floating=True)
        if scores.dim() < 1:
            raise ValueError("scores must have at least 1 dim (..., S), got a 0-dim tensor")
        check_mask("mask", mask, scores.shape)
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool (True = may attend), got dtype {mask.dtype}")
        return fn(scores, mask)
    return checked


def _takes_heads(fn):
    """fn(out): out (B, h, T, dk)."""
    @functools.wraps(fn)
    def checked(out):
        check_tensor("out", out, dim=4, layout="(B, h, T, dk)")
        return fn(out)
    return checked


def _takes_kv_heads(fn):
    """fn(k, n_heads): k (B, h_kv, S, d), n_heads a multiple of h_kv."""
    @functools.wraps(fn)
    def checked(k, n_heads):
        check_tensor("k", k, dim=4, layout="(B, h_kv, S, d)")
        check_positive_int("n_heads", n_heads)
        if k.shape[1] < 1 or n_heads % k.shape[1]:
            raise ValueError(f"n_heads={n_heads} must be a multiple of the K/V heads h_kv = {k.shape[1]} "
                             f"of k {shape_str(k)}")
        return fn(k, n_heads)
    return checked


def _takes_x(forward):
    """forward(self, x): x (..., T, d) floating, in the module's dtype, T <= max_len."""
    @functools.wraps(forward)
    def checked(self, x):
        check_tensor("x", x, floating=True)
        d, max_len = self.proj.in_features, self.mask.shape[0]
        if x.dim() < 2 or x.shape[-1] != d or not 1 <= x.shape[-2] <= max_len:
            raise ValueError(f"x {shape_str(x)} must be (..., T, d) with d = {d} and 1 <= T <= max_len = {max_len}")
        check_module_dtype("x", x, self.proj.weight.dtype)
        return forward(self, x)
    return checked


# ---------------------------------------------------------------------------------------------
# 1. Missing 1/sqrt(dk)
# ---------------------------------------------------------------------------------------------

@_takes_qkv
def broken_no_scale(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T) V: the scale is missing.

    Taught in notebook 09, "1 · Missing 1/√dk".
    """
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights


@_takes_qkv
def fixed_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(dk)) V, the softmax over the keys: the fix of pitfalls 1 and 2.

    q (..., L, dk), k (..., S, dk), v (..., S, dv) -> output (..., L, dv) and weights (..., L, S).

    Taught in notebook 09, "1 · Missing 1/√dk".
    """
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def _missing_scale_weights(fixed: bool) -> Weights:
    q, k = _picture_qk(6, 6, 512)
    return (fixed_attention if fixed else broken_no_scale)(q, k, k)[1], None


@pitfall("missing_scale", "Missing 1/sqrt(dk)", "01_scaled_dot_product_attention",
         "weights saturate to one-hot (and their gradient vanishes) as dk grows",
         broken=broken_no_scale, fixed=fixed_attention,
         picture="1 · missing 1/sqrt(dk) (dk = 512)", weights=_missing_scale_weights)
def demo_missing_scale(dk: int = 512) -> Demo:
    """With dk = 512 unscaled scores have std ~ 22: softmax is nearly one-hot.

    Taught in notebook 09, "1 · Missing 1/√dk".
    """
    dk = check_positive_int("dk", dk)
    g = _gen(1)
    q, k = torch.randn(64, 1, dk, generator=g), torch.randn(64, 16, dk, generator=g)   # 64 queries, 16 keys each
    v = torch.randn(64, 16, 8, generator=g)
    _, w_broken = broken_no_scale(q, k, v)
    out_fixed, w_fixed = fixed_attention(q, k, v)
    broken_max = w_broken.max(-1).values.mean().item()
    fixed_max = w_fixed.max(-1).values.mean().item()
    return Demo(dict(mean_max_weight_broken=broken_max, mean_max_weight_fixed=fixed_max),
                symptom_seen=broken_max > 0.9,
                fix_works=fixed_max < 0.6 and _close(out_fixed, F.scaled_dot_product_attention(q, k, v)))


# ---------------------------------------------------------------------------------------------
# 2. Softmax over the wrong dimension
# ---------------------------------------------------------------------------------------------

@_takes_qkv
def broken_softmax_dim(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax over dim=-2, the queries: each *column* sums to 1.

    Taught in notebook 09, "2 · Softmax over the wrong dimension".
    """
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return weights @ v, weights


def _softmax_dim_weights(fixed: bool) -> Weights:
    q, k = _picture_qk(6, 6, 8)
    return (fixed_attention if fixed else broken_softmax_dim)(q, k, k)[1], None


@pitfall("softmax_dim", "Softmax over the wrong dimension", "01_scaled_dot_product_attention",
         "rows do not sum to 1 (columns do): outputs are not averages of values",
         broken=broken_softmax_dim, fixed=fixed_attention,
         picture="2 · softmax over the queries", weights=_softmax_dim_weights)
def demo_softmax_dim() -> Demo:
    """Softmax over the queries instead of the keys: the columns sum to 1, the rows do not.

    Taught in notebook 09, "2 · Softmax over the wrong dimension".
    """
    g = _gen(2)
    q, k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(3))
    _, w_broken = broken_softmax_dim(q, k, v)
    out_fixed, w_fixed = fixed_attention(q, k, v)   # softmax over dim=-1, the keys
    row_sums = w_broken.sum(-1)
    return Demo(dict(row_sums_broken=row_sums[0].tolist(), row_sums_fixed=w_fixed.sum(-1)[0].tolist()),
                symptom_seen=not _close(row_sums, torch.ones_like(row_sums)),
                fix_works=_close(w_fixed.sum(-1), torch.ones(2, 5))
                and _close(out_fixed, F.scaled_dot_product_attention(q, k, v)))


# ---------------------------------------------------------------------------------------------
# 3. Mask polarity: SDPA True = may attend, nn.MultiheadAttention True = ignore
# ---------------------------------------------------------------------------------------------

def _mask_polarity_weights(fixed: bool) -> Weights:
    q, k = _picture_qk(6, 6, 8)
    mha_style = torch.ones(6, 6, dtype=torch.bool).triu(1)          # True = forbidden
    allowed = ~mha_style if fixed else mha_style                    # what SDPA reads as "may attend"
    return scaled_dot_product_attention(q, k, k, attn_mask=allowed)[1], ~allowed


@pitfall("mask_polarity", "Mask polarity (SDPA vs nn.MultiheadAttention)", "03_masks_and_cross_attention",
         "token 0 sees the future: its output moves when only the last token changes",
         picture="3 · True = forbidden mask given to SDPA", weights=_mask_polarity_weights)
def demo_mask_polarity() -> Demo:
    """A causal mask written the nn.MultiheadAttention way (True = forbidden) given to SDPA.

    Taught in notebook 09, "3 · Mask polarity: SDPA's True = attend, nn.MultiheadAttention's True = ignore".
    """
    g = _gen(3)
    T = 6
    q, k, v = (torch.randn(1, T, 8, generator=g) for _ in range(3))
    mha_style = torch.ones(T, T, dtype=torch.bool).triu(1)           # True = may NOT attend (the future)

    def run(v_in, mask):
        return F.scaled_dot_product_attention(q, k, v_in, attn_mask=mask)

    v_changed = v.clone()
    v_changed[:, -1] += 10.0                                          # change the last token only
    broken = run(v_changed, mha_style) - run(v, mha_style)            # SDPA reads True = may attend
    fixed = run(v_changed, ~mha_style) - run(v, ~mha_style)
    return Demo(dict(change_at_token0_broken=broken[0, 0].abs().max().item(),
                     change_at_token0_fixed=fixed[0, 0].abs().max().item()),
                symptom_seen=broken[0, 0].abs().max().item() > 1.0,
                fix_works=fixed[0, :-1].abs().max().item() < 1e-6
                and _close(run(v, ~mha_style), F.scaled_dot_product_attention(q, k, v, is_causal=True)))


# ---------------------------------------------------------------------------------------------
# 4. A fully masked row: -inf everywhere -> NaN
# ---------------------------------------------------------------------------------------------

@_takes_scores_mask
def broken_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """masked_fill with -inf then softmax: a row with no allowed key becomes 0/0 = NaN.

    Taught in notebook 09, "4 · −∞ on a fully masked row → NaN".
    """
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


@_takes_scores_mask
def fixed_masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Same, then zero the rows that had no allowed key (what torch >= 2.5 and selfattn_lite do).

    Taught in notebook 09, "4 · −∞ on a fully masked row → NaN".
    """
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


@pitfall("fully_masked_row", "-inf on a fully masked row", "03_masks_and_cross_attention",
         "softmax of a row of -inf is 0/0 = NaN, and one NaN turns the whole loss into NaN",
         broken=broken_masked_softmax, fixed=fixed_masked_softmax)
def demo_fully_masked_row() -> Demo:
    """A batch of two sequences; the second is all padding, so its query rows see no key.

    Taught in notebook 09, "4 · −∞ on a fully masked row → NaN".
    """
    g = _gen(4)
    q, k, v = (torch.randn(2, 4, 8, generator=g) for _ in range(3))
    real = torch.tensor([[True, True, True, False], [False, False, False, False]])   # (B, S) True = real
    mask = real[:, None, :].expand(2, 4, 4)                                          # (B, L, S)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    w_broken, w_fixed = broken_masked_softmax(scores, mask), fixed_masked_softmax(scores, mask)
    loss_broken, loss_fixed = (w_broken @ v).mean(), (w_fixed @ v).mean()     # one NaN poisons the mean
    reference, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return Demo(dict(nan_weights_broken=int(w_broken.isnan().sum()), loss_broken=loss_broken.item(),
                     loss_fixed=loss_fixed.item()),
                symptom_seen=bool(torch.isnan(loss_broken)),
                fix_works=bool(torch.isfinite(loss_fixed)) and _close(w_fixed @ v, reference)
                and _close(w_fixed[1], torch.zeros(4, 4)))


# ---------------------------------------------------------------------------------------------
# 5. float16 overflow of the scores
# ---------------------------------------------------------------------------------------------

@_takes_qk
def broken_fp16_scores(q: Tensor, k: Tensor) -> Tensor:
    """(Q K^T) / sqrt(dk) in float16: the product overflows (> 65504) before the division.

    Taught in notebook 09, "5 · float16 overflow of the scores".
    """
    return torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)


@_takes_qk
def fixed_fp16_scores(q: Tensor, k: Tensor) -> Tensor:
    """Scores and softmax in float32 (fused kernels accumulate in float32 too), weights cast back.

    Taught in notebook 09, "5 · float16 overflow of the scores".
    """
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1).to(q.dtype)


@pitfall("fp16_overflow", "float16 overflow of the scores", "09_common_pitfalls",
         "q . k exceeds float16's largest value 65504: inf, then inf - inf = NaN in the softmax",
         broken=broken_fp16_scores, fixed=fixed_fp16_scores)
def demo_fp16_overflow() -> Demo:
    """Queries and keys sharing one large 'outlier' feature, as LLM activations often do.

    Taught in notebook 09, "5 · float16 overflow of the scores".
    """
    g = _gen(5)
    q, k = torch.randn(1, 4, 128, generator=g), torch.randn(1, 6, 128, generator=g)
    q[..., 0], k[..., 0] = 300.0, 300.0                     # 300 * 300 = 90,000 > 65,504 = float16 max
    q, k = q.half(), k.half()
    w_broken, w_fixed = broken_fp16_scores(q, k), fixed_fp16_scores(q, k)
    _, reference = scaled_dot_product_attention(q, k, k)    # selfattn_lite computes half inputs in float32
    return Demo(dict(float16_max=torch.finfo(torch.float16).max,
                     largest_dot=(q.float() @ k.float().transpose(-2, -1)).max().item(),
                     nan_weights_broken=int(w_broken.isnan().sum())),
                symptom_seen=bool(w_broken.isnan().any()),
                fix_works=bool(torch.isfinite(w_fixed).all()) and _close(w_fixed, reference, atol=1e-3, rtol=1e-2))


# ---------------------------------------------------------------------------------------------
# 6. .view after .transpose when merging heads
# ---------------------------------------------------------------------------------------------

@_takes_heads
def broken_merge_heads_view(out: Tensor) -> Tensor:
    """(B, h, T, dk) -> (B, T, h*dk) with .view after .transpose: raises, the memory is not contiguous.

    Taught in notebook 09, "6 · `.view` after `.transpose`".
    """
    B, h, T, dk = out.shape
    return out.transpose(1, 2).view(B, T, h * dk)


@_takes_heads
def broken_merge_heads_no_transpose(out: Tensor) -> Tensor:
    """(B, h, T, dk) -> (B, T, h*dk) with .view and no transpose: runs, but mixes tokens.

    Taught in notebook 09, "6 · `.view` after `.transpose`".
    """
    B, h, T, dk = out.shape
    return out.reshape(B, T, h * dk)


@_takes_heads
def fixed_merge_heads(out: Tensor) -> Tensor:
    """Transpose to (B, T, h, dk), then reshape (copies when it must).

    Taught in notebook 09, "6 · `.view` after `.transpose`".
    """
    B, h, T, dk = out.shape
    return out.transpose(1, 2).reshape(B, T, h * dk)


@pitfall("view_after_transpose", ".view after .transpose", "04_multi_head_attention",
         ".view raises on the transposed (non-contiguous) tensor; skipping the transpose runs "
         "but puts other tokens' features into each row",
         broken=(broken_merge_heads_view, broken_merge_heads_no_transpose), fixed=fixed_merge_heads)
def demo_view_after_transpose() -> Demo:
    """Merging heads with .view after .transpose: an error, or (without the transpose) mixed-up rows.

    Taught in notebook 09, "6 · `.view` after `.transpose`".
    """
    B, h, T, dk = 2, 4, 5, 3
    out = torch.arange(B * h * T * dk, dtype=torch.float32).reshape(B, h, T, dk)
    try:
        broken_merge_heads_view(out)
        raised = ""
    except RuntimeError as err:
        raised = str(err).split(".")[0]
    merged_wrong, merged = broken_merge_heads_no_transpose(out), fixed_merge_heads(out)
    # row t of the merge must hold token t of every head: out[b, :, t, :]
    expected_token1 = torch.cat([out[0, head, 1] for head in range(h)])
    return Demo(dict(error=raised, token1_wrong=merged_wrong[0, 1, :6].tolist(),
                     token1_right=merged[0, 1, :6].tolist()),
                symptom_seen=bool(raised) and not torch.equal(merged_wrong[0, 1], expected_token1),
                fix_works=torch.equal(merged[0, 1], expected_token1))


# ---------------------------------------------------------------------------------------------
# 7. SDPA applies dropout in eval mode unless dropout_p is gated
# ---------------------------------------------------------------------------------------------

class BrokenDropoutAttention(nn.Module):
    """Passes its dropout rate to SDPA unconditionally: SDPA has no idea about ``.eval()``.

    Taught in notebook 09, "7 · SDPA applies dropout in eval mode unless `dropout_p` is gated".
    """

    def __init__(self, dropout: float = 0.5):
        super().__init__()
        self.dropout = check_real("dropout", dropout, low=0, high=1)

    @_takes_qkv
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout)


class FixedDropoutAttention(BrokenDropoutAttention):
    """Gates the rate on ``self.training``, as nn.MultiheadAttention and our MultiHeadAttention do.

    Taught in notebook 09, "7 · SDPA applies dropout in eval mode unless `dropout_p` is gated".
    """

    @_takes_qkv
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)


@pitfall("dropout_in_eval", "SDPA dropout in eval mode", "09_common_pitfalls",
         "in eval mode two identical calls give different outputs",
         broken=BrokenDropoutAttention, fixed=FixedDropoutAttention)
def demo_dropout_in_eval() -> Demo:
    """SDPA's dropout_p passed unconditionally: eval-mode outputs change from call to call.

    Taught in notebook 09, "7 · SDPA applies dropout in eval mode unless `dropout_p` is gated".
    """
    g = _gen(7)
    q, k, v = (torch.randn(1, 6, 8, generator=g) for _ in range(3))
    broken, fixed = BrokenDropoutAttention().eval(), FixedDropoutAttention().eval()
    torch.manual_seed(0)
    b1, b2 = broken(q, k, v), broken(q, k, v)
    f1, f2 = fixed(q, k, v), fixed(q, k, v)
    return Demo(dict(max_diff_between_calls_broken=(b1 - b2).abs().max().item(),
                     max_diff_between_calls_fixed=(f1 - f2).abs().max().item()),
                symptom_seen=not torch.equal(b1, b2),
                fix_works=torch.equal(f1, f2) and _close(f1, F.scaled_dot_product_attention(q, k, v)))


# ---------------------------------------------------------------------------------------------
# 8. is_causal=True with a KV cache: torch aligns the mask top-left
# ---------------------------------------------------------------------------------------------

@_takes_qkv
def broken_decode_is_causal(q_new: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
    """L new queries against S >= L keys with is_causal=True: query i sees keys 0..i only.

    Taught in notebook 09, "8 · `is_causal=True` with a KV cache".
    """
    return F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True)


@_takes_qkv
def fixed_decode_bottom_right(q_new: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
    """The new queries are the *last* L positions: align the causal mask bottom-right.

    Taught in notebook 09, "8 · `is_causal=True` with a KV cache".
    """
    L, S = q_new.shape[-2], k_all.shape[-2]
    return F.scaled_dot_product_attention(q_new, k_all, v_all, attn_mask=causal_mask(L, S, bottom_right=True))


def _is_causal_with_cache_weights(fixed: bool) -> Weights:
    q, k = _picture_qk(3, 8, 8)                                     # 3 new queries, 5 cached + 3 new keys
    allowed = causal_mask(3, 8, bottom_right=fixed)
    return scaled_dot_product_attention(q, k, k, attn_mask=allowed)[1], ~allowed


@pitfall("is_causal_with_cache", "is_causal=True with a cache", "03_masks_and_cross_attention",
         "the first new token sees only key 0 instead of the 8 keys up to its own position",
         broken=broken_decode_is_causal, fixed=fixed_decode_bottom_right,
         picture="8 · is_causal=True for 3 new tokens after 5 cached", weights=_is_causal_with_cache_weights)
def demo_is_causal_with_cache() -> Demo:
    """7 tokens cached, 3 new ones: their outputs must equal the last 3 rows of full causal attention.

    Taught in notebook 09, "8 · `is_causal=True` with a KV cache".
    """
    g = _gen(8)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., -3:, :]   # reference
    broken = broken_decode_is_causal(q[..., -3:, :], k, v)
    fixed = fixed_decode_bottom_right(q[..., -3:, :], k, v)
    return Demo(dict(max_error_broken=(broken - full).abs().max().item(),
                     max_error_fixed=(fixed - full).abs().max().item(),
                     broken_first_row_is_v0=_close(broken[..., 0, :], v[..., 0, :])),
                symptom_seen=_close(broken[..., 0, :], v[..., 0, :]) and not _close(broken, full),
                fix_works=_close(fixed, full))


# ---------------------------------------------------------------------------------------------
# 9. RoPE without the position offset when decoding
# ---------------------------------------------------------------------------------------------

@pitfall("rope_offset", "RoPE without the position offset when decoding", "05_positional_information",
         "the new token is rotated as if it were at position 0: its relative offsets to the cache are wrong")
def demo_rope_offset() -> Demo:
    """Decode token 5 after 5 cached ones: rotate it by position 5, not 0.

    Taught in notebook 09, "9 · RoPE without the position offset when decoding".
    """
    from .positions import RotaryEmbedding

    g = _gen(9)
    T, d = 6, 16
    rope = RotaryEmbedding(d)
    q, k, v = (torch.randn(1, 2, T, d, generator=g) for _ in range(3))
    pos = torch.arange(T)
    reference = F.scaled_dot_product_attention(rope(q, pos), rope(k, pos), v, is_causal=True)[..., -1:, :]
    k_cached = rope(k[..., :-1, :], pos[:-1])                       # keys 0..4, rotated when they were new

    def decode(position):
        q_new = rope(q[..., -1:, :], torch.tensor([position]))
        k_all = torch.cat([k_cached, rope(k[..., -1:, :], torch.tensor([position]))], dim=-2)
        return F.scaled_dot_product_attention(q_new, k_all, v)      # one query sees every key

    broken, fixed = decode(0), decode(T - 1)                        # fixed: position = len(cache)
    return Demo(dict(max_error_broken=(broken - reference).abs().max().item(),
                     max_error_fixed=(fixed - reference).abs().max().item()),
                symptom_seen=not _close(broken, reference, atol=1e-3), fix_works=_close(fixed, reference))


# ---------------------------------------------------------------------------------------------
# 10. Half-split RoPE weights loaded into interleaved code
# ---------------------------------------------------------------------------------------------

@pitfall("rope_pairing", "Half-split RoPE weights in interleaved code", "05_positional_information",
         "no error, but every score changes: the rotation pairs dimensions the weights never paired")
def demo_rope_pairing() -> Demo:
    """A q/k projection trained with half-split RoPE (Hugging Face layout) run by interleaved code.

    Taught in notebook 09, "10 · Half-split RoPE weights loaded into interleaved code".
    """
    from .positions import RotaryEmbedding, permute_qk_rows

    g = _gen(10)
    T, h, d = 8, 2, 16
    x = torch.randn(1, T, h * d, generator=g)
    w_q, w_k = torch.randn(h * d, h * d, generator=g) / 6, torch.randn(h * d, h * d, generator=g) / 6
    pos = torch.arange(T)

    def scores(wq, wk, rope):
        q = (x @ wq.T).view(1, T, h, d).transpose(1, 2)             # (1, h, T, d)
        k = (x @ wk.T).view(1, T, h, d).transpose(1, 2)
        return rope(q, pos) @ rope(k, pos).transpose(-2, -1)        # (1, h, T, T)

    reference = scores(w_q, w_k, RotaryEmbedding(d, interleaved=False))   # as trained
    broken = scores(w_q, w_k, RotaryEmbedding(d, interleaved=True))        # same weights, other pairing
    fixed = scores(permute_qk_rows(w_q, h, to="interleaved"), permute_qk_rows(w_k, h, to="interleaved"),
                   RotaryEmbedding(d, interleaved=True))
    return Demo(dict(max_score_error_broken=(broken - reference).abs().max().item(),
                     max_score_error_fixed=(fixed - reference).abs().max().item()),
                symptom_seen=not _close(broken, reference, atol=1e-2), fix_works=_close(fixed, reference, atol=1e-4))


# ---------------------------------------------------------------------------------------------
# 11. repeat instead of repeat_interleave for GQA
# ---------------------------------------------------------------------------------------------

@_takes_kv_heads
def broken_expand_kv(k: Tensor, n_heads: int) -> Tensor:
    """(B, h_kv, S, d) -> (B, h, S, d) with .repeat: heads come out kv0, kv1, kv0, kv1, ...

    Taught in notebook 09, "11 · `repeat` instead of `repeat_interleave` for GQA".
    """
    return k.repeat(1, n_heads // k.shape[1], 1, 1)


@_takes_kv_heads
def fixed_expand_kv(k: Tensor, n_heads: int) -> Tensor:
    """With .repeat_interleave: kv0, kv0, kv1, kv1, ... (query heads 0..g-1 share kv head 0).

    Taught in notebook 09, "11 · `repeat` instead of `repeat_interleave` for GQA".
    """
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


@pitfall("gqa_repeat", "repeat instead of repeat_interleave for GQA", "07_mqa_and_gqa",
         "query heads read the wrong key/value head: same shapes, no error, wrong outputs",
         broken=broken_expand_kv, fixed=fixed_expand_kv)
def demo_gqa_repeat() -> Demo:
    """repeat instead of repeat_interleave: each query head reads another group's key/value head.

    Taught in notebook 09, "11 · `repeat` instead of `repeat_interleave` for GQA".
    """
    g = _gen(11)
    h, h_kv = 8, 2
    q = torch.randn(1, h, 5, 8, generator=g)
    k, v = torch.randn(1, h_kv, 5, 8, generator=g), torch.randn(1, h_kv, 5, 8, generator=g)
    reference = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    broken = F.scaled_dot_product_attention(q, broken_expand_kv(k, h), broken_expand_kv(v, h))
    fixed = F.scaled_dot_product_attention(q, fixed_expand_kv(k, h), fixed_expand_kv(v, h))
    wrong_heads = [i for i in range(h) if not _close(broken[0, i], reference[0, i])]
    return Demo(dict(heads_wrong_broken=wrong_heads, kv_head_of_query_head_1_broken=1 % h_kv,
                     kv_head_of_query_head_1_fixed=1 // (h // h_kv)),
                symptom_seen=len(wrong_heads) > 0, fix_works=_close(fixed, reference))


# ---------------------------------------------------------------------------------------------
# 12. nn.MultiheadAttention's batch_first=False default
# ---------------------------------------------------------------------------------------------

@pitfall("batch_first", "nn.MultiheadAttention's batch_first=False default", "04_multi_head_attention",
         "no error: tokens attend across the *batch*, so sequence 0 changes when sequence 1 does")
def demo_batch_first() -> Demo:
    """A (B, T, d) batch given to nn.MultiheadAttention(d, h): it reads (T, B, d).

    Taught in notebook 09, "12 · `nn.MultiheadAttention`'s `batch_first=False` default".
    """
    torch.manual_seed(12)
    B, T, d = 3, 5, 16
    broken_mha = nn.MultiheadAttention(d, 4).eval()                   # batch_first=False by default
    fixed_mha = nn.MultiheadAttention(d, 4, batch_first=True).eval()
    fixed_mha.load_state_dict(broken_mha.state_dict())
    x = torch.randn(B, T, d, generator=_gen(12))
    x_changed = x.clone()
    x_changed[1] += 5.0                                              # change sequence 1 only

    def change_in_sequence0(mha):
        with torch.no_grad():
            return (mha(x_changed, x_changed, x_changed)[0] - mha(x, x, x)[0])[0].abs().max().item()

    with torch.no_grad():
        per_sequence = torch.stack([fixed_mha(x[i:i + 1], x[i:i + 1], x[i:i + 1])[0][0] for i in range(B)])
        batched = fixed_mha(x, x, x)[0]
    return Demo(dict(change_in_seq0_broken=change_in_sequence0(broken_mha),
                     change_in_seq0_fixed=change_in_sequence0(fixed_mha)),
                symptom_seen=change_in_sequence0(broken_mha) > 1e-3,
                fix_works=change_in_sequence0(fixed_mha) < 1e-6 and _close(batched, per_sequence))


# ---------------------------------------------------------------------------------------------
# 13. A mask created on the CPU while the model is on the GPU
# ---------------------------------------------------------------------------------------------

class BrokenMaskedAttention(nn.Module):
    """Keeps its causal mask as a plain attribute: ``.to(device)`` does not move it.

    Taught in notebook 09, "13 · A mask created on the CPU while the model is on the GPU".
    """

    def __init__(self, d: int, max_len: int):
        super().__init__()
        check_positive_int("d", d)
        check_positive_int("max_len", max_len)
        self.proj = nn.Linear(d, 3 * d)
        self.mask = torch.ones(max_len, max_len, dtype=torch.bool).tril()   # stays where it was made

    @_takes_x
    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.proj(x).chunk(3, dim=-1)
        T = x.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T])


class FixedMaskedAttention(nn.Module):
    """Registers the mask as a buffer: it moves with ``.to()`` / ``.cuda()`` like the weights.

    Taught in notebook 09, "13 · A mask created on the CPU while the model is on the GPU".
    """

    def __init__(self, d: int, max_len: int):
        super().__init__()
        check_positive_int("d", d)
        check_positive_int("max_len", max_len)
        self.proj = nn.Linear(d, 3 * d)
        self.register_buffer("mask", torch.ones(max_len, max_len, dtype=torch.bool).tril(),
                             persistent=False)                     # moves with the module, not saved

    @_takes_x
    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.proj(x).chunk(3, dim=-1)
        T = x.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T])


@pitfall("mask_device", "A mask on the CPU while the model is on the GPU", "09_common_pitfalls",
         "the plain-attribute mask stays on the CPU after .to(device): a device-mismatch error",
         broken=BrokenMaskedAttention, fixed=FixedMaskedAttention)
def demo_mask_device(device: str = "meta") -> Demo:
    """Move both models to another device ('meta' stands in for 'cuda' on a machine without a GPU).

    Taught in notebook 09, "13 · A mask created on the CPU while the model is on the GPU".
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a device name such as 'meta' or 'cuda', got {device!r}") from None
    torch.manual_seed(13)
    broken, fixed = BrokenMaskedAttention(8, 16).to(device), FixedMaskedAttention(8, 16).to(device)
    x = torch.randn(2, 5, 8, device=device)
    try:
        broken(x)
        error = ""
    except RuntimeError as err:
        error = str(err)
    out = fixed(x)
    cpu_fixed = FixedMaskedAttention(8, 16)
    cpu_x = torch.randn(2, 5, 8, generator=_gen(13))
    reference = F.scaled_dot_product_attention(*cpu_fixed.proj(cpu_x).chunk(3, dim=-1), is_causal=True)
    return Demo(dict(mask_device_broken=str(broken.mask.device), mask_device_fixed=str(fixed.mask.device),
                     error=error.split("!")[0][:80]),
                symptom_seen=broken.mask.device.type == "cpu" and "device" in error,
                fix_works=fixed.mask.device.type == torch.device(device).type and out.shape == (2, 5, 8)
                and "mask" not in fixed.state_dict() and _close(cpu_fixed(cpu_x), reference))


# ---------------------------------------------------------------------------------------------
# 14. Attention weights are not explanations
# ---------------------------------------------------------------------------------------------

@pitfall("weights_not_explanations", "Attention weights are not explanations", "10_attention_in_the_wild",
         "the most-attended token contributes almost nothing; the output is a low-weight token's value")
def demo_weights_not_explanations() -> Demo:
    """The most-attended token can contribute least to the output.

    The output is a sum of contributions, out = sum_j w_j v_j. Token 1's key matches the
    query best (largest weight) but its value is nearly zero; token 3 gets a small weight
    but carries a large value, and the output is essentially token 3's value. The norms
    ||w_j v_j|| (norm-based analysis, Kobayashi et al., 2020) rank token 3 first; the
    weights rank it third. The norms are another view of this layer's mixing, not a fix:
    here ``fix_works`` means that view ranks token 3 first and the contributions sum to the
    output. And weights are not unique: two tokens with the same value can trade weight
    without any change to the output.

    Taught in notebook 09, "14 · Attention weights are not explanations".
    """
    q = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    k = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.1, 0.0], [0.01, 0.0], [0.0, 0.1], [6.0, 6.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    contributions = w[0, :, None] * v                                # (4, 2): out = their sum
    norms = contributions.norm(dim=-1)                               # (4,) ||w_j v_j||
    cos_with_v3 = F.cosine_similarity(out[0], v[3], dim=0).item()

    # tokens 0 and 2 given the same value: moving weight between them changes nothing
    v_dup = v.clone()
    v_dup[2] = v_dup[0]
    k_swapped = k[[2, 1, 0, 3]]                                      # swap keys of tokens 0 and 2
    out_a, w_a = scaled_dot_product_attention(q + torch.tensor([[0, 1.0, 0, 0]]), k, v_dup)
    out_b, w_b = scaled_dot_product_attention(q + torch.tensor([[0, 1.0, 0, 0]]), k_swapped, v_dup)
    return Demo(dict(weights=[round(x, 3) for x in w[0].tolist()],
                     contribution_norm=[round(x, 4) for x in norms.tolist()], cos_output_v3=round(cos_with_v3, 4),
                     duplicate_weights_a=[round(x, 3) for x in w_a[0].tolist()],
                     duplicate_weights_b=[round(x, 3) for x in w_b[0].tolist()]),
                symptom_seen=int(w[0].argmax()) == 1 and norms[1].item() < 0.01 * norms.max().item()
                and bool(w_a[0, 0] > w_a[0, 2]) and bool(w_b[0, 0] < w_b[0, 2]) and _close(out_a, out_b),
                fix_works=int(norms.argmax()) == 3 and cos_with_v3 > 0.99 and _close(contributions.sum(0), out[0]))


# ---------------------------------------------------------------------------------------------
# Pictures: the weights of four pitfalls, broken and fixed (drawn by viz.PitfallWidget)
# ---------------------------------------------------------------------------------------------

HEATMAP_PITFALLS = {p.name: p.picture for p in PITFALLS.values() if p.weights is not None}   # name -> title


def pitfall_weights(name: str, fixed: bool) -> Weights:
    """(L, S) attention weights of one pictured pitfall, broken or fixed, and the mask (True = masked) if any.

    Taught in notebook 09, "Look at it".
    """
    check_bool("fixed", fixed)
    if not isinstance(name, str) or name not in HEATMAP_PITFALLS:
        raise ValueError(f"name must be one of {list(HEATMAP_PITFALLS)}, got {name!r}")
    return PITFALLS[name].weights(fixed)


# ---------------------------------------------------------------------------------------------
# Small helpers the demos share
# ---------------------------------------------------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(a: Tensor, b: Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))


def _picture_qk(L: int, S: int, d: int) -> tuple[Tensor, Tensor]:
    """The seeded (L, d) queries and (S, d) keys the pictures use."""
    g = _gen(90)
    return torch.randn(L, d, generator=g), torch.randn(S, d, generator=g)
