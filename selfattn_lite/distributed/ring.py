"""Ring attention (Liu et al. 2023): K/V blocks travel around a ring of ranks; the log-sum-exp merge.

Taught in notebook 14, "Merging partial results" and "Run it for real".

At step s rank r holds the K/V block of rank (r - s) mod W, attends its own queries to it, and merges
the partial result with the log-sum-exp rule

    lse = log(exp(lse1) + exp(lse2)),   out = out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)

(the online softmax of notebook 08, one block of keys at a time). After W steps every query has
seen every key. A rank holds its own K/V shard throughout (its caller keeps it, and the backward
needs it), the block it computes with, and the one arriving: at most three blocks, 3/W of the whole
K/V capped at all of it, so less than the whole only for W >= 4 (``counters.kv_held`` counts it).
Liu et al. count two buffers (current and arriving); the third here is the rank's own shard, kept
for the backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from .._checks import check_bool, check_qkv, check_real, check_same_dtype, check_shape, check_tensor, is_int, shape_str
from ..attention import upcast_dtype
from ..efficient import TileKind, tile_kind
from .comm import check_floats, counters, exchange, exchange_shapes, group_rank_size, wait_all
from .sharding import check_layout, shard_segments

__all__ = ["block_attention", "block_attention_backward", "merge_partials", "ring_attention", "RingTile", "ring_tiles"]


def _check_block_mask(mask: Tensor | None, q: Tensor, k: Tensor) -> None:
    """mask, when given, is a bool (Lq, Lk) tensor for these q and k; else ValueError."""
    if mask is None:
        return
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got dtype {mask.dtype}")
    check_shape("mask", mask, (q.shape[-2], k.shape[-2]), layout="(Lq, Lk)",
                against=f"q {shape_str(q)}, k {shape_str(k)}")


def block_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """Attention of q to one block of keys, and the log-sum-exp of each query's scores.

        s = q k^T * scale (masked: -inf),  lse = log sum_j exp(s_j),  out = softmax(s) v

    A query that sees no key of the block gets lse = -inf and out = 0, which the merge then
    ignores. (On a GPU a fused kernel returns the same pair, e.g. FlashAttention's forward.)

    Args:
        q: (..., Lq, E); k: (..., Lk, E); v: (..., Lk, Ev); mask: (Lq, Lk) bool, True = may attend.

    Returns:
        out (..., Lq, Ev) and lse (..., Lq), in float32 for half inputs, else in q's dtype.
    """
    check_qkv(q, k, v, enable_gqa=None, names=("q", "k", "v"))
    scale = check_real("scale", scale)
    _check_block_mask(mask, q, k)
    compute = upcast_dtype(q.dtype)
    s = (q.to(compute) @ k.to(compute).transpose(-2, -1)) * scale        # (..., Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                     # (..., Lq)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    p = torch.exp(s - safe.unsqueeze(-1))                                # exp(-inf) = 0 for masked pairs
    return p @ v.to(compute), lse


def block_attention_backward(q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor, grad_out: Tensor, *,
                             scale: float, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of attention's gradients, from the *final* log-sum-exp (notebook 11's backward).

        p = exp(q k^T * scale - lse)   (the weights of the full softmax, restricted to this block)
        dV = p^T dO,  dS = p * (dO V^T - D),  dQ = dS K * scale,  dK = dS^T Q * scale

    with D = rowsum(dO * O) of the full output. Summing dQ over every block, and dK, dV over every query
    block, gives the gradients of attention over all keys.

    Args:
        q: (..., Lq, E); k: (..., Lk, E); v: (..., Lk, Ev); lse, delta: (..., Lq) (lse = -inf: a row that
            saw no key anywhere); grad_out: (..., Lq, Ev); mask: (Lq, Lk) bool, True = may attend.

    Returns:
        dq (..., Lq, E), dk (..., Lk, E), dv (..., Lk, Ev): this block's contributions.

    Taught in notebook 14, "Run it for real" (used in its exercise 5, the ring's backward in one process).
    """
    check_qkv(q, k, v, enable_gqa=None, names=("q", "k", "v"))
    scale = check_real("scale", scale)
    for name, t in (("lse", lse), ("delta", delta)):
        check_tensor(name, t, floating=True)
        check_shape(name, t, q.shape[:-1], layout="(..., Lq)", against=f"q {shape_str(q)}")
    check_tensor("grad_out", grad_out, floating=True)
    check_shape("grad_out", grad_out, (*q.shape[:-1], v.shape[-1]), layout="(..., Lq, Ev)",
                against=f"q {shape_str(q)}, v {shape_str(v)}")
    check_same_dtype(q=q, k=k, v=v, lse=lse, delta=delta, grad_out=grad_out)
    _check_block_mask(mask, q, k)
    s = (q @ k.transpose(-2, -1)) * scale                                # (..., Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    safe_lse = lse.masked_fill(torch.isneginf(lse), float("inf"))        # a row that saw nothing: p = 0
    p = torch.exp(s - safe_lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def merge_partials(out1: Tensor, lse1: Tensor, out2: Tensor, lse2: Tensor) -> tuple[Tensor, Tensor]:
    """Merge the attention of the same queries to two disjoint blocks of keys.

        lse = log(exp(lse1) + exp(lse2))
        out = out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)

    exp(lse_c - lse) is the share of the softmax mass that block c holds. A block a query does
    not see (lse_c = -inf) gets share 0; when neither is seen, out = 0 and lse = -inf.

    Args:
        out1, out2: (..., L, Ev); lse1, lse2: (..., L).

    Returns:
        (out (..., L, Ev), lse (..., L)).
    """
    for name, t in (("out1", out1), ("lse1", lse1), ("out2", out2), ("lse2", lse2)):
        check_tensor(name, t, floating=True)
    if out1.dim() < 1:
        raise ValueError("out1 must have at least 1 dim (..., L, Ev), got a 0-dim tensor")
    check_shape("out2", out2, out1.shape, layout="(..., L, Ev)", against=f"out1 {shape_str(out1)}")
    for name, t in (("lse1", lse1), ("lse2", lse2)):
        check_shape(name, t, out1.shape[:-1], layout="(..., L)", against=f"out1 {shape_str(out1)}")
    check_same_dtype(out1=out1, lse1=lse1, out2=out2, lse2=lse2)
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    w1, w2 = torch.exp(lse1 - safe).unsqueeze(-1), torch.exp(lse2 - safe).unsqueeze(-1)   # (..., L, 1)
    return out1 * w1 + out2 * w2, lse


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, layout: str = "contiguous",
                   group=None) -> Tensor:
    """Exact attention of this rank's queries to the whole sequence, K/V blocks passed around a ring.

    Call it on every rank of ``group`` at once, each with its own shard (``shard(x, rank, world,
    layout=layout)``). At step s = 0 .. W-1 rank r holds the K/V block of rank (r - s) mod W:
    it posts the send of that block to rank r + 1 and the receive of the next one from rank r - 1,
    computes the tiles it needs (tiles entirely above the causal diagonal are skipped), merges
    them with ``merge_partials``, then waits for the transfer. The backward recomputes the tiles
    from the saved log-sum-exp and passes each K/V block together with its gradient accumulators
    (dK, dV) around the ring; after W steps they arrive back at the block's owner.

    Args:
        q: (..., n_r, E), k: (..., n_r, E), v: (..., n_r, Ev): this rank's rows (same leading dims on
            every rank; n_r from the layout; lengths need not divide evenly).
        is_causal: global causal mask: the query at global position i sees keys j <= i.
        layout: "contiguous" or "zigzag" (balanced causal work).
        group: the process group of the ring (default: the whole world).

    Returns:
        (..., n_r, Ev): this rank's rows of softmax(Q K^T / sqrt(E) + M) V. Differentiable.

    Raises:
        ValueError: shapes that do not fit, a bad layout, or no process group.
    """
    check_layout(layout)
    check_floats(q, k, v, "ring_attention")
    check_bool("is_causal", is_causal)
    problem = None
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2] and q.dtype == k.dtype == v.dtype):
        problem = (f"q (..., n, E), k (..., n, E), v (..., n, Ev) must share the leading dims, E and dtype; got "
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    lengths = exchange_shapes(q, k, v, layout, is_causal, group, "ring_attention", problem)
    return _RingAttention.apply(q, k, v, bool(is_causal), layout, group, lengths)


class RingTile(NamedTuple):
    """One (query run) x (key run) tile a rank computes: local row slices, its kind, its mask."""

    rows: slice           # this rank's local query rows
    cols: slice           # the held block's local key rows
    kind: TileKind        # FULL (no mask) or PARTIAL (masked inside); SKIP tiles are not yielded
    mask: Tensor | None   # (rows, cols) bool, True = may attend; None for FULL


def ring_tiles(q_segs: list[tuple[int, int]], k_segs: list[tuple[int, int]], *, is_causal: bool
               ) -> Iterator[RingTile]:
    """The tiles a rank computes when its queries meet one K/V block.

    The queries are the runs of global positions ``q_segs`` (from ``shard_segments``), the keys the
    runs ``k_segs``. Each (query run, key run) pair is one tile, classified by
    ``efficient.tile_kind``: under a causal mask a tile whose keys all come after all its queries is
    SKIP (not yielded), one whose keys all come at or before every query is FULL, the rest PARTIAL
    (with the mask key position <= query position). Without a mask every tile is FULL.

    Args:
        q_segs, k_segs: lists of [start, stop) runs of global positions, in local order.
        is_causal: the global causal mask.

    Yields:
        ``RingTile(rows, cols, kind, mask)`` with rows / cols slices into the local tensors.
    """
    check_bool("is_causal", is_causal)
    for name, segs in (("q_segs", q_segs), ("k_segs", k_segs)):
        ok = isinstance(segs, list | tuple) and segs and all(
            isinstance(r, list | tuple) and len(r) == 2 and is_int(r[0]) and is_int(r[1]) and 0 <= r[0] < r[1]
            for r in segs)
        if not ok:
            raise ValueError(f"{name} must be a non-empty list of [start, stop) runs with 0 <= start < stop "
                             f"(from shard_segments), got {segs!r:.80}")
    end = max(b for _, b in [*q_segs, *k_segs])
    below, above = end, (0 if is_causal else end)       # query i sees key j iff -below <= j - i <= above
    qo = 0
    for qa, qb in q_segs:
        ko = 0
        for ka, kb in k_segs:
            kind = tile_kind(qa, qb, ka, kb, below, above)
            if kind != TileKind.SKIP:
                mask = None
                if kind == TileKind.PARTIAL:                    # key position <= query position
                    mask = torch.arange(ka, kb)[None, :] <= torch.arange(qa, qb)[:, None]
                yield RingTile(slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), kind, mask)
            ko += kb - ka
        qo += qb - qa


# ---------------------------------------------------------------------------------------------
# The autograd function: forward and backward passes around the ring
# ---------------------------------------------------------------------------------------------

class _RingAttention(torch.autograd.Function):
    """Forward: K/V blocks go around the ring; backward: K/V blocks and their gradients do."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, layout, group, lengths):
        rank, world = group_rank_size(group)
        L = sum(lengths)
        segs = [shard_segments(L, r, world, layout=layout) for r in range(world)]
        scale = 1.0 / math.sqrt(q.shape[-1])
        compute = upcast_dtype(q.dtype)
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=compute, device=q.device)    # (..., n, Ev)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=compute, device=q.device)   # (..., n)
        k_blk, v_blk = k, v
        for step in range(world):
            src = (rank - step) % world                       # whose K/V block we hold now
            requests, incoming = [], ()
            if step < world - 1:                              # post the next transfer, then compute
                nxt = (rank - step - 1) % world
                k_next, v_next = (t.new_empty(*t.shape[:-2], lengths[nxt], t.shape[-1]) for t in (k, v))
                requests = exchange([(k_blk, (rank + 1) % world), (v_blk, (rank + 1) % world)],
                                    [(k_next, (rank - 1) % world), (v_next, (rank - 1) % world)], "kv", group)
                incoming = (k_next, v_next)
            counters.hold(k, v, k_blk, v_blk, *incoming)     # own shard, the block in use, the one arriving
            for rows, cols, _, mask in ring_tiles(segs[rank], segs[src], is_causal=is_causal):
                o, lse_o = block_attention(q[..., rows, :], k_blk[..., cols, :], v_blk[..., cols, :], scale=scale,
                                           mask=None if mask is None else mask.to(q.device))
                out[..., rows, :], lse[..., rows] = merge_partials(out[..., rows, :], lse[..., rows], o, lse_o)
                counters.scores += (rows.stop - rows.start) * (cols.stop - cols.start)
            wait_all(requests)
            if step < world - 1:
                k_blk, v_blk = k_next, v_next
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (is_causal, layout, group, lengths, scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, layout, group, lengths, scale = ctx.setup
        rank, world = group_rank_size(group)
        segs = [shard_segments(sum(lengths), r, world, layout=layout) for r in range(world)]
        compute = out.dtype
        qc, do = q.to(compute), grad_out.to(compute)
        delta = (do * out).sum(-1)                            # (..., n)  D_i = sum_e dO_ie O_ie
        dq = torch.zeros_like(qc)
        k_blk, v_blk = k, v
        dk_blk = torch.zeros(k.shape, dtype=compute, device=k.device)   # gradients of the block we hold
        dv_blk = torch.zeros(v.shape, dtype=compute, device=v.device)
        nxt_rank, prev_rank = (rank + 1) % world, (rank - 1) % world
        for step in range(world):
            src = (rank - step) % world
            requests = []
            if step < world - 1:                              # K/V need no update: post them first
                nxt = (rank - step - 1) % world
                k_next, v_next = (t.new_empty(*t.shape[:-2], lengths[nxt], t.shape[-1]) for t in (k, v))
                requests = exchange([(k_blk, nxt_rank), (v_blk, nxt_rank)],
                                    [(k_next, prev_rank), (v_next, prev_rank)], "kv_bwd", group)
            kc, vc = k_blk.to(compute), v_blk.to(compute)
            for rows, cols, _, mask in ring_tiles(segs[rank], segs[src], is_causal=is_causal):
                dq_t, dk_t, dv_t = block_attention_backward(
                    qc[..., rows, :], kc[..., cols, :], vc[..., cols, :], lse[..., rows], delta[..., rows],
                    do[..., rows, :], scale=scale, mask=None if mask is None else mask.to(q.device))
                dq[..., rows, :] += dq_t
                dk_blk[..., cols, :] += dk_t
                dv_blk[..., cols, :] += dv_t
                counters.scores += (rows.stop - rows.start) * (cols.stop - cols.start)
            wait_all(requests)
            # the gradients of block src travel on with it; after the last step they reach their owner
            if world == 1:
                break
            nxt = (rank - step - 1) % world
            dk_next, dv_next = (t.new_empty(*t.shape[:-2], lengths[nxt], t.shape[-1]) for t in (dk_blk, dv_blk))
            wait_all(exchange([(dk_blk, nxt_rank), (dv_blk, nxt_rank)],
                              [(dk_next, prev_rank), (dv_next, prev_rank)], "dkv", group))
            dk_blk, dv_blk = dk_next, dv_next
            if step < world - 1:
                k_blk, v_blk = k_next, v_next
        return dq.to(q.dtype), dk_blk.to(k.dtype), dv_blk.to(v.dtype), None, None, None, None

