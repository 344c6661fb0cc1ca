"""Checkers for notebook 14: merging two partial attention results with their log-sum-exps, the causal
skip rule of the ring, and the zig-zag shard of a rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distributed import (
    block_attention,
    merge_partials,
    ring_schedule,
    ring_tiles,
    shard,
    shard_indices,
    shard_segments,
    unshard,
)
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_partials", "check_ring_skips", "check_zigzag_indices"]


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
    if close(lse, torch.logaddexp2(l1, l2), atol=1e-5):
        raise ExerciseError("merged in base 2: lse_c is a natural log (torch.logsumexp), so lse = "
                            "log(e^lse1 + e^lse2) = torch.logaddexp, not logaddexp2")
    if close(out, o1 + o2, atol=1e-5):
        raise ExerciseError("forgot to rescale: out1 + out2 counts each block as if it held all the softmax mass; "
                            "weigh out_c by its share exp(lse_c - lse)")
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
    if close(out, o1 * torch.exp2(l1 - want_lse).unsqueeze(-1) + o2 * torch.exp2(l2 - want_lse).unsqueeze(-1),
             atol=1e-5):
        raise ExerciseError("merged in base 2: the shares are exp(lse_c - lse) with a natural-log lse, not "
                            "2 ** (lse_c - lse)")
    if close(out, o1 * w2 + o2 * w1, atol=1e-5):
        raise ExerciseError("the weights are swapped: out1 gets exp(lse1 - lse), out2 gets exp(lse2 - lse)")
    if close(out, o1 * (1 / w1.clamp_min(1e-30)).clamp_max(1e30) + o2 * (1 / w2.clamp_min(1e-30)).clamp_max(1e30),
             atol=1e-5):
        raise ExerciseError("the share is upside down: exp(lse_c - lse) (at most 1), not exp(lse - lse_c)")
    if not close(out, want, atol=1e-5):
        raise ExerciseError("out should equal attention to all keys: out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)")
    return passed("out = out1·exp(lse1 − lse) + out2·exp(lse2 − lse) with lse = logaddexp(lse1, lse2): "
                  "exactly attention to both blocks")


def _needed_steps(rank: int, world: int, layout: str, L: int) -> list[int]:
    """Steps at which rank computes at least one tile of the block it holds (the package's tiles)."""
    segs = [shard_segments(L, r, world, layout=layout) for r in range(world)]
    return [s for s, held in enumerate(ring_schedule(world)) if any(ring_tiles(segs[rank], segs[held[rank]],
                                                                               is_causal=True))]


def _ring_with_skips(fn, world: int, layout: str):
    """One process plays a causal ring of ``world`` ranks that skips the steps fn names; its output and SDPA's."""
    gen = torch.Generator().manual_seed(141)
    L = 4 * world + 2
    q, k, v = (torch.randn(2, L, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = [shard_indices(L, r, world, layout=layout) for r in range(world)]
    outs = []
    for r in range(world):
        skip = set(int(s) for s in attempt(fn, r, world, layout))
        qr = shard(q, r, world, layout=layout)
        out, lse = torch.zeros_like(qr), torch.full(qr.shape[:-1], float("-inf"), dtype=qr.dtype)
        for step, held in enumerate(ring_schedule(world)):
            if step in skip:
                continue
            src = held[r]
            mask = pos[src][None, :] <= pos[r][:, None]                   # global causal mask
            o, s = block_attention(qr, shard(k, src, world, layout=layout), shard(v, src, world, layout=layout),
                                   scale=0.5, mask=mask)
            out, lse = merge_partials(out, lse, o, s)
        outs.append(out)
    return unshard(outs, layout=layout), F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)


def check_ring_skips(fn) -> None:
    """``fn(rank, world_size, layout) -> steps``: the steps of a causal ring at which ``rank`` may skip the
    K/V block it holds (every key of it comes after every query of the rank), as a list of ints.

    At step s rank r holds the block of rank (r - s) mod W. Checked against the package's tiles for
    contiguous and zig-zag layouts, then by running the ring in one process with those steps skipped
    against one-process SDPA.
    """
    try:
        attempt(fn, 0, 4, "contiguous")
    except NotAttempted:
        return not_attempted("skipped_steps")
    for layout in ("contiguous", "zigzag"):
        for world in (2, 3, 4, 5):
            got = [sorted(int(s) for s in attempt(fn, r, world, layout)) for r in range(world)]
            needed = [_needed_steps(r, world, layout, 4 * world) for r in range(world)]
            want = [[s for s in range(world) if s not in needed[r]] for r in range(world)]
            if got == want:
                continue
            where = f"W = {world}, {layout}"
            if any(0 in steps for steps in got):
                raise ExerciseError(f"{where}: skipped the diagonal step: at step 0 a rank holds its own block, "
                                    "whose keys up to each query are needed (masked inside, never skipped)")
            if layout == "zigzag":
                raise ExerciseError(f"{where}: in the zig-zag layout every rank holds a late chunk, which sees "
                                    "every block at least in part: no step may be skipped")
            if got == [[s for s in range(1, world) if (r - s) % world < r] for r in range(world)]:
                raise ExerciseError(f"{where}: reversed: the blocks of earlier ranks (src < r) hold keys every "
                                    "query sees; skip those of later ranks, src = (r - s) mod W > r")
            if got == [[s for s in range(max(r, 1), world)] for r in range(world)]:
                raise ExerciseError(f"{where}: off by one: at step r rank r holds block 0, which every query "
                                    "sees; the skipped steps are r + 1 .. W - 1")
            if not any(got):
                raise ExerciseError(f"{where}: nothing skipped: exact, but the blocks of later ranks hold only "
                                    "keys after all of a rank's queries; skip the steps that hold them")
            for r in range(world):
                if wrong := [s for s in got[r] if s in needed[r]]:
                    raise ExerciseError(f"{where}, rank {r}: step(s) {wrong} hold keys at or before some of the "
                                        "rank's queries: those must be computed")
            r = next(r for r in range(world) if got[r] != want[r])
            raise ExerciseError(f"{where}, rank {r}: the steps that may be skipped are {want[r]}, got {got[r]} "
                                "(skipping less is exact but wastes work)")
    for layout, world in (("contiguous", 4), ("zigzag", 3)):
        ring, sdpa = _ring_with_skips(fn, world, layout)
        if not close(ring, sdpa, atol=1e-10):
            raise ExerciseError(f"the one-process ring ({layout}, W = {world}) with those steps skipped differs "
                                "from SDPA")
    return passed("contiguous: rank r skips steps r + 1 .. W - 1 (the blocks of later ranks); zig-zag: nothing; "
                  "the one-process ring with those skips equals SDPA")


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
