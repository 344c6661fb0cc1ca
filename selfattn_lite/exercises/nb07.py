"""Checkers for notebook 07: expanding K/V heads for grouped-query attention; mean-pooling an MHA checkpoint."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_expand_kv", "check_mean_pool"]


def check_expand_kv(fn) -> None:
    """``fn(k, n_heads)`` must turn k (B, n_kv, S, dk) into (B, n_heads, S, dk), query head i using K/V head i // g."""
    gen = torch.Generator().manual_seed(7)
    B, n_kv, S, dk, n_heads = 2, 2, 5, 4, 8
    k = torch.randn(B, n_kv, S, dk, generator=gen)
    g = n_heads // n_kv
    expected = k.repeat_interleave(g, dim=1)
    try:
        got = attempt(fn, k, n_heads)
    except NotAttempted:
        return not_attempted("expand_kv")
    require_tensor("expand_kv(k, 8)", got)
    if got.shape != expected.shape:
        raise ExerciseError(f"expected shape {tuple(expected.shape)} = (B, n_heads, S, dk), got {tuple(got.shape)}: "
                            "copy along the head dim (dim=1)")
    if close(got, k.repeat(1, g, 1, 1)):
        raise ExerciseError("this is `repeat` (tiling): query head 1 gets K/V head 1, head 2 gets head 0 ... "
                            "Query heads 0-3 must all use K/V head 0 and heads 4-7 head 1: use repeat_interleave")
    if not close(got, expected):
        raise ExerciseError("the heads are not in the right order: query head i must read K/V head i // g")
    return passed("repeat_interleave along the head dim: query heads 0-3 read K/V head 0, heads 4-7 head 1")


def check_mean_pool(fn) -> None:
    """``fn(weight, n_heads, n_kv_heads)`` must average the K (or V) projection over each group of heads.

    weight: (n_heads * dk, d_in), rows h*dk .. (h+1)*dk - 1 produce head h. Result
    (n_kv_heads * dk, d_in): K/V head j = mean of heads j*g .. (j+1)*g - 1.
    """
    gen = torch.Generator().manual_seed(8)
    n_heads, n_kv, dk, d_in = 8, 2, 3, 5
    g = n_heads // n_kv
    weight = torch.randn(n_heads * dk, d_in, generator=gen)
    heads = weight.view(n_heads, dk, d_in)
    expected = heads.view(n_kv, g, dk, d_in).mean(1).reshape(n_kv * dk, d_in)
    try:
        got = attempt(fn, weight.clone(), n_heads, n_kv)
    except NotAttempted:
        return not_attempted("mean_pool_kv")
    require_tensor("mean_pool_kv(weight, 8, 2)", got)
    if got.shape != expected.shape:
        raise ExerciseError(f"expected shape {tuple(expected.shape)} = (n_kv_heads * dk, d_in), got "
                            f"{tuple(got.shape)}: reshape to (n_kv_heads, g, dk, d_in) and average over g")
    strided = heads.view(g, n_kv, dk, d_in).mean(0).reshape(n_kv * dk, d_in)
    if close(got, strided):
        raise ExerciseError("you averaged heads j, j + n_kv, j + 2 n_kv ... (a strided group). The heads that "
                            "share K/V head j are the consecutive ones j*g .. (j+1)*g - 1 (repeat_interleave order)")
    if close(got, expected * g):
        raise ExerciseError("you summed the heads of each group: take the mean, or the keys grow g times larger")
    if close(got, heads.view(n_kv, g, dk, d_in)[:, 0].reshape(n_kv * dk, d_in)):
        raise ExerciseError("you kept the first head of each group: the GQA recipe averages all of them")
    if not close(got, expected):
        raise ExerciseError("not the per-group mean of the heads: view the rows as (n_kv_heads, g, dk, d_in) "
                            "and average over dim 1")
    return passed("K/V head j = mean of query-group j's heads, as in the GQA paper's conversion")
