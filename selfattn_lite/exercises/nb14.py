"""Checkers for notebook 14: merging two partial attention results with their log-sum-exps, the causal
skip rule of the ring, the zig-zag shard of a rank, and Ulysses and the ring's backward played in one
process, checked against the multi-process run."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distributed import (
    block_attention,
    block_attention_backward,
    causal_work,
    merge_partials,
    ring_schedule,
    ring_tiles,
    shard,
    shard_indices,
    shard_segments,
    unshard,
)
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_partials", "check_ring_skips", "check_zigzag_indices", "check_simulated_ulysses",
           "check_ring_backward"]


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
    even, uneven = causal_work(16, 4, layout="zigzag"), causal_work(11, 3, layout="zigzag")
    assert len(set(even)) == 1 and len(set(uneven)) > 1              # what the message says
    return passed(f"rank r holds chunks r and 2W − 1 − r of 2W: one early, one late. Where 2W divides L every "
                  f"rank computes the same causal work (L=16, W=4: {even} scores); otherwise the chunks differ by "
                  f"a row and the work differs too (L=11, W=3: {uneven})")


# ---------------------------------------------------------------------------------------------
# Ulysses and the ring's backward in one process, against the multi-process run
# ---------------------------------------------------------------------------------------------

def _case_ranks(case: dict, per_rank: list, method: str) -> int:
    if not isinstance(case, dict) or case.get("method") != method:
        raise ValueError(f"pass one of the notebook's {method} cases (cases[i] with method {method!r})")
    W = len(case["ranks"] or range(4))
    if len(per_rank) != W or any(r is None for r in per_rank):
        raise ValueError(f"pass the results of the {W} ranks that ran this case: [results[r][i] for r in ranks]")
    return W


def _per_rank(got, W: int, name: str, shapes: list[tuple]) -> list[torch.Tensor]:
    if not isinstance(got, (list, tuple)) or len(got) != W:
        raise ExerciseError(f"{name} should return a list with one tensor per rank ({W} ranks), got "
                            f"{type(got).__name__}{'' if not isinstance(got, (list, tuple)) else f' of {len(got)}'}")
    return [require_tensor(f"{name}[{r}]", t, shape) for r, (t, shape) in enumerate(zip(got, shapes))]


def check_simulated_ulysses(fn, case: dict, per_rank: list) -> None:
    """``fn(q_shards, k_shards, v_shards, is_causal) -> out_shards``: DeepSpeed-Ulysses played by one process.

    ``q_shards[r]`` (B, h, n_r, E) are rank r's contiguous rows with all heads (k, v the same, as many K/V heads
    as query heads). The answer makes both all-to-alls as tensor reshuffles over the W virtual ranks (rank j
    gets heads [j h/W, (j+1) h/W) of every rank's rows, attends, and each rank gets its rows back) and returns
    each rank's output rows. Checked against the multi-process run of the same case (``per_rank[r]["out"]``),
    and, through autograd on your reshuffles, its gradients (``dq``, ``dk``, ``dv``).
    """
    W = _case_ranks(case, per_rank, "ulysses")
    B, h, L, E = case["q"].shape
    if case["k"].shape[1] != h:
        raise ValueError("pass a case with as many K/V heads as query heads")
    leaves = [case[n].detach().clone().requires_grad_() for n in "qkv"]
    shards = [[shard(t, r, W) for r in range(W)] for t in leaves]
    lengths = [s.shape[-2] for s in shards[0]]
    try:
        got = attempt(fn, *shards, case["is_causal"])
    except NotAttempted:
        return not_attempted("simulate_ulysses")
    except RuntimeError as error:
        raise ExerciseError(f"torch refused ({str(error).splitlines()[0]}): rank j's heads of every rank's rows "
                            "are glued along the rows (dim -2), heads [j h/W, (j+1) h/W) taken along dim 1") from None
    outs = _per_rank(got, W, "simulate_ulysses", [(B, h, n, E) for n in lengths])
    want = [per_rank[r]["out"] for r in range(W)]
    if all(close(o, w, atol=1e-10, rtol=1e-10) for o, w in zip(outs, want)):
        try:
            torch.autograd.backward(outs, [shard(case["grad"], r, W) for r in range(W)])
        except RuntimeError as error:
            raise ExerciseError(f"the outputs match but autograd cannot reach q, k, v through them "
                                f"({str(error).splitlines()[0]}): build them with differentiable torch ops "
                                "(split, cat, narrow), not from detached copies") from None
        for name, leaf in zip(("dq", "dk", "dv"), leaves):
            if leaf.grad is None or not close(leaf.grad, unshard([per_rank[r][name] for r in range(W)],
                                                                   layout="contiguous"), atol=1e-10, rtol=1e-10):
                raise ExerciseError(f"the outputs match but autograd through your reshuffles gives a different {name}: "
                                    "build them from q, k, v with differentiable torch ops (split, cat, narrow), not "
                                    "from detached copies")
        return passed(f"two all-to-alls as reshuffles over {W} virtual ranks: every rank's rows, and the gradients "
                      "through them, equal the gloo processes' to 1e-10")
    q, k, v = (t.detach() for t in leaves)
    local = [F.scaled_dot_product_attention(*(s[r].detach() for s in shards), is_causal=case["is_causal"])
             for r in range(W)]
    if all(close(o, w, atol=1e-10) for o, w in zip(outs, local)):
        raise ExerciseError("each rank attended only to its own rows: the first all-to-all must give rank j heads "
                            "[j h/W, (j+1) h/W) of *all* rows, from every rank")
    full = F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"])
    if case["is_causal"] and close(unshard(outs, layout="contiguous"),
                                   F.scaled_dot_product_attention(q, k, v), atol=1e-10):
        raise ExerciseError("the causal mask is missing: after the all-to-all each rank holds all rows of its "
                            "heads in order, so is_causal=True applies the global mask")
    if close(unshard(outs, layout="contiguous"), full, atol=1e-10):
        raise ExerciseError("right numbers, but not split as the ranks hold them: return one tensor per rank with "
                            "its own rows (n_r) and all h heads")
    strided = torch.cat([full[:, j::W] for j in range(W)], dim=1)        # heads dealt round-robin, never put back
    if close(unshard(outs, layout="contiguous"), strided, atol=1e-10):
        raise ExerciseError("the heads came back in the wrong order: rank j's heads are the contiguous range "
                            "[j h/W, (j+1) h/W); the second all-to-all puts them back in that order")
    raise ExerciseError("the outputs differ from the multi-process run: to heads, rank j takes heads [j h/W, "
                        "(j+1) h/W) of every rank's rows (glued in rank order along the rows), attends, and the "
                        "second all-to-all sends rows n_0.. of its output back to rank 0, and so on")


def _ring_backward_inputs(case: dict, W: int):
    """Each rank's shards, its forward output and log-sum-exp (over all keys), its incoming gradient."""
    layout, is_causal = case["layout"], case["is_causal"]
    q, k, v, grad = (case[n].detach() for n in ("q", "k", "v", "grad"))
    L = q.shape[-2]
    pos = [shard_indices(L, r, W, layout=layout) for r in range(W)]
    qs, ks, vs, gs = ([shard(t, r, W, layout=layout) for r in range(W)] for t in (q, k, v, grad))
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for r in range(W):
        mask = pos[r][:, None] >= torch.arange(L)[None, :] if is_causal else None
        o, s = block_attention(qs[r], k, v, scale=scale, mask=mask)
        outs.append(o)
        lses.append(s)
    return qs, ks, vs, outs, lses, gs, pos, scale


def _reference_ring_backward(qs, ks, vs, outs, lses, gs, pos, is_causal, *, hops=None, travel=True, delta=True):
    """The ring's backward in one process; the flags plant the mistakes the checker names."""
    W = len(qs)
    scale = qs[0].shape[-1] ** -0.5
    deltas = [(g * o).sum(-1) if delta else torch.zeros_like(s) for g, o, s in zip(gs, outs, lses)]
    dq = [torch.zeros_like(q) for q in qs]
    held = [(r, torch.zeros_like(ks[r]), torch.zeros_like(vs[r])) for r in range(W)]   # (block, dK, dV)
    own_dk, own_dv = [torch.zeros_like(k) for k in ks], [torch.zeros_like(v) for v in vs]
    for step in range(W):
        for r in range(W):
            src, dk_acc, dv_acc = held[r]
            mask = pos[src][None, :] <= pos[r][:, None] if is_causal else None
            g = block_attention_backward(qs[r], ks[src], vs[src], lses[r], deltas[r], gs[r], scale=scale, mask=mask)
            dq[r] += g[0]
            if travel:
                dk_acc += g[1]
                dv_acc += g[2]
            elif src == r:                                  # planted: only the own block's gradients kept
                own_dk[r] += g[1]
                own_dv[r] += g[2]
        if step < (W if hops is None else hops):
            held = [held[(r - 1) % W] for r in range(W)]     # send to r + 1, receive from r - 1
    if not travel:
        return [(dq[r], own_dk[r], own_dv[r]) for r in range(W)]
    return [(dq[r], held[r][1], held[r][2]) for r in range(W)]


_ONE_SHORT = ("the dK, dV accumulators end one hop short (rank r holds block r + 1's): after the last step they "
              "travel once more, home to their owner (W hops in all, K/V only W - 1)")


def check_ring_backward(fn, case: dict, per_rank: list) -> None:
    """``fn(q, k, v, out, lse, grad, positions, is_causal) -> [(dq, dk, dv) per rank]``: the ring's backward
    played by one process.

    Each argument but ``is_causal`` is a list over the W virtual ranks: rank r's shards q[r] (B, h, n_r, E),
    k[r], v[r], its forward output out[r] and log-sum-exp lse[r] (B, h, n_r) over all keys, the incoming
    gradient grad[r], and positions[r], the global positions of its rows. At step s rank r holds K/V block
    (r - s) mod W with the dK, dV accumulators travelling with it; it adds its tiles' gradients
    (``dist_attn.block_attention_backward``) to its own dq and to those accumulators, and passes block and
    accumulators on to rank r + 1; they come home after W hops. Checked against the multi-process run of the
    same case (``per_rank[r]["dq"]``, ``["dk"]``, ``["dv"]``).
    """
    W = _case_ranks(case, per_rank, "ring")
    inputs = _ring_backward_inputs(case, W)
    qs, ks, vs, outs, lses, gs, pos, _ = inputs
    try:
        got = attempt(fn, [t.clone() for t in qs], [t.clone() for t in ks], [t.clone() for t in vs],
                      [t.clone() for t in outs], [t.clone() for t in lses], [t.clone() for t in gs],
                      [p.clone() for p in pos], case["is_causal"])
    except NotAttempted:
        return not_attempted("ring_backward")
    if not isinstance(got, (list, tuple)) or len(got) != W or any(not isinstance(g, (list, tuple)) or len(g) != 3
                                                                  for g in got):
        raise ExerciseError(f"return one (dq, dk, dv) triple per rank: a list of {W} triples")
    one_short = [tuple(ks[(r + 1) % W].shape) for r in range(W)]
    if W > 1 and [tuple(g[1].shape) if isinstance(g[1], torch.Tensor) else None for g in got] == one_short \
            and one_short != [tuple(t.shape) for t in ks]:
        raise ExerciseError(f"{_ONE_SHORT} (rank r returned the accumulators of block r + 1: see their shapes)")
    for r, (dq, dk, dv) in enumerate(got):
        require_tensor(f"dq of rank {r}", dq, tuple(qs[r].shape))
        require_tensor(f"dk of rank {r}", dk, tuple(ks[r].shape))
        require_tensor(f"dv of rank {r}", dv, tuple(vs[r].shape))
    names = ("dq", "dk", "dv")

    def matches(triples):
        return all(close(t, w, atol=1e-10, rtol=1e-10) for trip, want in zip(got, triples) for t, w in zip(trip, want))

    want = [tuple(per_rank[r][n] for n in names) for r in range(W)]
    if matches(want):
        return passed(f"dQ stays home, dK and dV travel with their K/V block and come home after {W} hops: every "
                      f"rank's gradients equal the {W} gloo processes' to 1e-10")
    is_causal = case["is_causal"]
    dq_ok = all(close(g[0], w[0], atol=1e-10, rtol=1e-10) for g, w in zip(got, want))
    if dq_ok and matches(_reference_ring_backward(*inputs[:6], pos, is_causal, hops=W - 1)):
        raise ExerciseError(_ONE_SHORT)
    if dq_ok and matches(_reference_ring_backward(*inputs[:6], pos, is_causal, travel=False)):
        raise ExerciseError("each rank kept only the dK, dV of its own block: the gradients other ranks compute for "
                            "block j must travel with it and be summed on the way")
    if matches(_reference_ring_backward(*inputs[:6], pos, is_causal, delta=False)):
        raise ExerciseError("D = rowsum(dO * O) is missing from dS = P * (dP - D) (notebook 11): pass "
                            "delta = (grad * out).sum(-1) of the rank's rows")
    if is_causal and matches(_reference_ring_backward(*inputs[:6], pos, False)):
        raise ExerciseError("the causal mask is missing: mask each tile with the global positions, "
                            "positions[src][None, :] <= positions[r][:, None]")
    if dq_ok:
        raise ExerciseError("dq is right; dk, dv are not: add each tile's dk, dv to the accumulators of the block "
                            "the rank holds at that step, and pass them on with it")
    raise ExerciseError("dq differs from the multi-process run: at step s rank r holds block (r - s) mod W and adds "
                        "its tile's dq to its own rows' gradient, using its own lse and D")
