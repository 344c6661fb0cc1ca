"""Checkers for notebook 14: merging two partial attention results with their log-sum-exps, and
the zig-zag shard of a rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distributed import block_attention, shard_indices
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_partials", "check_zigzag_indices"]


def _two_blocks():
    """q against keys 0-3 (block 1) and 4-8 (block 2), causal, so that query row 0 sees nothing of block 2."""
    gen = torch.Generator().manual_seed(14)
    q, k, v = torch.randn(2, 6, 4, generator=gen), torch.randn(2, 9, 4, generator=gen), torch.randn(2, 9, 3,
                                                                                                      generator=gen)
    q[:, 4:] *= 4.0                                      # some rows with peaked weights
    i, j = torch.arange(6)[:, None] + 3, torch.arange(9)[None, :]
    mask = j <= i                                        # queries at positions 3..8: rows 0 sees keys 0..3 only
    scale = 0.5
    o1, l1 = block_attention(q, k[:, :4], v[:, :4], scale=scale, mask=mask[:, :4])
    o2, l2 = block_attention(q, k[:, 4:], v[:, 4:], scale=scale, mask=mask[:, 4:])
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    want_lse = torch.logsumexp((q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf")), dim=-1)
    return (o1, l1, o2, l2), (want, want_lse)


def check_merge_partials(fn) -> None:
    """``fn(out1, lse1, out2, lse2) -> (out, lse)``: the attention of the same queries to two blocks of keys,
    merged. out_c (B, L, Ev) is softmax attention to block c alone, lse_c (B, L) the log-sum-exp of those
    scores (-inf for a query that sees no key of block c)."""
    (o1, l1, o2, l2), (want, want_lse) = _two_blocks()
    try:
        result = attempt(fn, o1.clone(), l1.clone(), o2.clone(), l2.clone())
    except NotAttempted:
        return not_attempted("merge_partials")
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseError("return a pair (out, lse)")
    out, lse = result
    lse = require_tensor("lse", lse, tuple(want_lse.shape))
    out = require_tensor("out", out, tuple(want.shape))
    if not torch.isfinite(out).all() or not torch.isfinite(lse).all():
        raise ExerciseError("NaN or inf in the result: query row 0 sees no key of block 2 (lse2 = -inf, out2 = 0); "
                            "its share exp(lse2 - lse) must come out 0, not NaN (use lse = logaddexp(lse1, lse2))")
    if close(out, (o1 + o2) / 2, atol=1e-5):
        raise ExerciseError("averaging the two outputs weighs both blocks equally; weigh each by its share of "
                            "the softmax mass, exp(lse_c - lse)")
    if close(lse, torch.maximum(l1, l2), atol=1e-5):
        raise ExerciseError("lse is not the larger of the two: it is log(exp(lse1) + exp(lse2)) (torch.logaddexp)")
    if close(lse, l1 + l2, atol=1e-5):
        raise ExerciseError("lse1 + lse2 multiplies the sums; add them instead: lse = log(exp(lse1) + exp(lse2))")
    if not close(lse, want_lse, atol=1e-5):
        raise ExerciseError("lse should be the log-sum-exp of all the scores: logaddexp(lse1, lse2)")
    w1, w2 = torch.exp(l1 - want_lse).unsqueeze(-1), torch.exp(l2 - want_lse).unsqueeze(-1)
    if close(out, o1 * torch.exp(l1).unsqueeze(-1) + o2 * torch.exp(l2).unsqueeze(-1), atol=1e-5):
        raise ExerciseError("weights exp(lse_c) are not normalised: divide by exp(lse), i.e. use exp(lse_c - lse)")
    if close(out, o1 * w2 + o2 * w1, atol=1e-5):
        raise ExerciseError("the weights are swapped: out1 gets exp(lse1 - lse), out2 gets exp(lse2 - lse)")
    if close(out, o1 * (1 / w1.clamp_min(1e-30)).clamp_max(1e30) + o2 * (1 / w2.clamp_min(1e-30)).clamp_max(1e30),
             atol=1e-5):
        raise ExerciseError("the share is upside down: exp(lse_c - lse) (at most 1), not exp(lse - lse_c)")
    if not close(out, want, atol=1e-5):
        raise ExerciseError("out should equal attention to all keys: out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)")
    return passed("out = out1·exp(lse1 − lse) + out2·exp(lse2 − lse) with lse = logaddexp(lse1, lse2): "
                  "exactly attention to both blocks")


def _chunk_starts(L: int, parts: int) -> list[int]:
    sizes = [L // parts + (1 if p < L % parts else 0) for p in range(parts)]
    return [sum(sizes[:p]) for p in range(parts + 1)]


def check_zigzag_indices(fn) -> None:
    """``fn(L, rank, world_size) -> positions``: the global positions rank holds in the zig-zag layout,
    in increasing order (a 1-D int tensor or a list). The first L % (2W) chunks get one row more."""
    cases = [(16, 0, 4), (16, 3, 4), (16, 1, 2), (10, 1, 2), (11, 2, 3), (13, 0, 3), (9, 3, 4), (8, 3, 4)]
    try:
        attempt(fn, 16, 0, 4)
    except NotAttempted:
        return not_attempted("zigzag_indices")
    for L, rank, world in cases:
        got = attempt(fn, L, rank, world)
        got = torch.as_tensor(got).flatten().long().tolist() if not isinstance(got, list) else [int(x) for x in got]
        want = shard_indices(L, rank, world, layout="zigzag").tolist()
        if got == want:
            continue
        where = f"L={L}, rank={rank}, world_size={world}"
        if got == shard_indices(L, rank, world, layout="contiguous").tolist():
            raise ExerciseError(f"{where}: that is the contiguous split; zig-zag cuts 2·W chunks and gives rank r "
                                "chunks r and 2W − 1 − r")
        if sorted(got) == want:
            raise ExerciseError(f"{where}: the right positions in the wrong order; return them increasing "
                                "(chunk r, then chunk 2W − 1 − r)")
        starts = _chunk_starts(L, 2 * world)
        chunk = lambda c: list(range(starts[c], starts[c + 1]))   # noqa: E731
        if got == chunk(rank) + chunk(world + rank):
            raise ExerciseError(f"{where}: chunks r and W + r pair early with middle; pair the first with the "
                                "last: chunk 2W − 1 − r")
        if 2 * world - rank < 2 * world and got == chunk(rank) + chunk(2 * world - rank):
            raise ExerciseError(f"{where}: off by one: the partner of chunk r is 2W − 1 − r (chunks count from 0)")
        size = L // (2 * world)
        even = list(range(rank * size, (rank + 1) * size)) + list(range((2 * world - 1 - rank) * size,
                                                                         (2 * world - rank) * size))
        if L % (2 * world) and got == even:
            raise ExerciseError(f"{where}: L is not divisible by 2W = {2 * world}: the first L % 2W chunks get one "
                                "row more (rows are lost or shifted otherwise)")
        raise ExerciseError(f"{where}: expected {want}, got {got}")
    return passed("rank r holds chunks r and 2W − 1 − r of 2W: one early, one late, the same causal work")
