"""Attention across devices: ring attention and DeepSpeed-Ulysses on ``torch.distributed``.

When one sequence no longer fits one device, every device (a *rank*) holds a shard of the
sequence: some rows of q, k and v (dim -2). Two ways to still compute exact attention:

* **Ring attention** (Liu et al. 2023): the K/V shards travel around a ring of ranks with
  point-to-point sends. At step s rank r holds the K/V block of rank (r - s) mod W, attends its
  own queries to it, and merges the partial result with the log-sum-exp rule

      lse = log(exp(lse1) + exp(lse2)),   out = out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)

  (the online softmax of notebook 08, one block of keys at a time). After W steps every query
  has seen every key; no rank ever held more than two K/V blocks.
* **Ulysses** (Jacobs et al. 2023): an all-to-all turns "all heads, some rows" into "some heads,
  all rows"; each rank runs ordinary attention on its heads; a second all-to-all turns it back.

The same code runs on CPU processes (gloo) and on GPUs (nccl). ``launch`` starts the processes;
``shard``/``unshard`` cut a full tensor into the ranks' parts and glue them back. Every byte a
rank sends goes through ``_exchange``, which counts it in ``counters`` (per process), and every
score tile computed is counted there too, so notebook 14 can check both against formulas.

Uneven lengths: L rows over P parts give the first L % P parts one row more
(``split_sizes``). ``layout="contiguous"``: rank r holds part r of W parts. ``layout="zigzag"``:
the sequence is cut into 2W chunks and rank r holds chunks r and 2W - 1 - r, so that under a
causal mask every rank has the same work (torch calls it head-tail load balancing).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_int, check_positive_int
from .attention import HALF_DTYPES

__all__ = [
    "LAYOUTS",
    "split_sizes",
    "shard_segments",
    "shard_indices",
    "shard_lengths",
    "shard",
    "unshard",
    "Counters",
    "counters",
    "reset_counters",
    "block_attention",
    "merge_partials",
    "ring_attention",
    "ulysses_attention",
    "ring_bytes_per_rank",
    "ulysses_bytes_per_rank",
    "causal_work",
    "ring_schedule",
    "max_sequence_length",
    "launch",
    "attention_worker",
    "timing_worker",
]

LAYOUTS = ("contiguous", "zigzag")


# ---------------------------------------------------------------------------------------------
# Sharding: which rows of the sequence each rank holds
# ---------------------------------------------------------------------------------------------

def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` consecutive pieces of n rows: the first n % parts get one row more.

    >>> split_sizes(10, 4)
    [3, 3, 2, 2]
    """
    n = check_int("n", n, low=0)
    check_positive_int("parts", parts)
    return [n // parts + (1 if p < n % parts else 0) for p in range(parts)]


def shard_segments(L: int, rank: int, world_size: int, *, layout: str = "contiguous") -> list[tuple[int, int]]:
    """The runs of global positions [start, stop) that ``rank`` holds, in its local order.

    contiguous: one run, part ``rank`` of ``split_sizes(L, world_size)``.
    zigzag: two runs, chunks ``rank`` and ``2 * world_size - 1 - rank`` of ``split_sizes(L, 2 * world_size)``.

    Raises:
        ValueError: a bad layout or rank, or a sequence too short to give every part a row
            (L < world_size, or L < 2 * world_size for zigzag).
    """
    _check_layout(layout)
    check_positive_int("world_size", world_size)
    rank = check_int("rank", rank, low=0, high=world_size - 1)
    parts = world_size if layout == "contiguous" else 2 * world_size
    if isinstance(L, bool) or not isinstance(L, int) or L < parts:
        raise ValueError(f"a sequence of L={L!r} rows cannot be cut into {parts} non-empty parts "
                         f"(layout={layout!r}, world_size={world_size}): need L >= {parts}")
    sizes = split_sizes(L, parts)
    starts = [sum(sizes[:p]) for p in range(parts)]
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return [(starts[c], starts[c] + sizes[c]) for c in chunks]


def shard_indices(L: int, rank: int, world_size: int, *, layout: str = "contiguous") -> Tensor:
    """(n_rank,) int64 global positions of the rows ``rank`` holds, in its local order."""
    return torch.cat([torch.arange(a, b) for a, b in shard_segments(L, rank, world_size, layout=layout)])


def shard_lengths(L: int, world_size: int, *, layout: str = "contiguous") -> list[int]:
    """Rows held by each rank."""
    return [sum(b - a for a, b in shard_segments(L, r, world_size, layout=layout)) for r in range(world_size)]


def _dim(x: Tensor, dim: int) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def shard(x: Tensor, rank: int, world_size: int, *, layout: str = "contiguous", dim: int = -2) -> Tensor:
    """This rank's part of a full tensor: the rows ``shard_indices(x.shape[dim], ...)`` along ``dim``.

    Args:
        x: the full tensor, e.g. (B, h, L, dk) with the sequence at dim -2.
        rank, world_size: which part, of how many.
        layout: "contiguous" or "zigzag" (see ``shard_segments``).

    Returns:
        (B, h, n_rank, dk): a new tensor (contiguous in memory, ready to send).
    """
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    d = _dim(x, dim)
    segments = shard_segments(x.shape[d], rank, world_size, layout=layout)
    return torch.cat([x.narrow(d, a, b - a) for a, b in segments], dim=d).contiguous()


def unshard(shards: list[Tensor], *, layout: str = "contiguous", dim: int = -2) -> Tensor:
    """The full tensor back from every rank's part (``shards[r]`` is rank r's ``shard``).

    Raises:
        ValueError: when the parts' lengths along ``dim`` are not those ``layout`` gives.
    """
    if not isinstance(shards, (list, tuple)) or not shards or not all(isinstance(s, Tensor) for s in shards):
        raise ValueError("shards must be a non-empty list of tensors, one per rank")
    world_size = len(shards)
    d = _dim(shards[0], dim)
    lengths = [s.shape[d] for s in shards]
    L = sum(lengths)
    try:
        want = shard_lengths(L, world_size, layout=layout)
    except ValueError as error:
        raise ValueError(f"cannot unshard parts of lengths {lengths}: {error}") from None
    if lengths != want:
        raise ValueError(f"parts of lengths {lengths} along dim {dim} are not a {layout!r} split of L={L} "
                         f"over {world_size} ranks, which is {want}")
    order = torch.cat([shard_indices(L, r, world_size, layout=layout) for r in range(world_size)])
    glued = torch.cat(list(shards), dim=d)                # rows in rank order
    return glued.index_select(d, torch.argsort(order).to(glued.device))   # back to position order


# ---------------------------------------------------------------------------------------------
# Counting: bytes sent and score tiles computed, per process
# ---------------------------------------------------------------------------------------------

@dataclass
class Counters:
    """What this process did: bytes sent to other ranks by kind, and score entries computed.

    ``sent`` kinds: "kv" (ring forward K/V blocks), "kv_bwd" and "dkv" (ring backward: K/V blocks
    and their gradient accumulators), "all_to_all" (Ulysses, forward and backward), "meta" (the
    shapes every call exchanges first). ``scores`` counts (query row, key row) pairs computed,
    per batch-head (a masked pair inside a computed tile counts; a skipped tile does not).
    """

    sent: dict = field(default_factory=dict)
    scores: int = 0

    def add(self, kind: str, nbytes: int) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + int(nbytes)

    def snapshot(self) -> dict:
        return {"sent": dict(self.sent), "scores": self.scores}


counters = Counters()


def reset_counters() -> None:
    """Zero this process's ``counters``."""
    counters.sent.clear()
    counters.scores = 0


def _exchange(sends: list[tuple[Tensor, int]], recvs: list[tuple[Tensor, int]], kind: str, group) -> list:
    """Post point-to-point sends and receives together (``batch_isend_irecv``), count the sent bytes.

    Args:
        sends: (tensor, destination group rank); recvs: (buffer, source group rank).

    Returns:
        The requests; call ``.wait()`` on each before reading the buffers.
    """
    ops = []
    for t, peer in sends:
        ops.append(dist.P2POp(dist.isend, t, dist.get_global_rank(group, peer) if group else peer, group))
        counters.add(kind, t.numel() * t.element_size())
    for t, peer in recvs:
        ops.append(dist.P2POp(dist.irecv, t, dist.get_global_rank(group, peer) if group else peer, group))
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


# ---------------------------------------------------------------------------------------------
# One block of keys: attention with its log-sum-exp, and merging two partial results
# ---------------------------------------------------------------------------------------------

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
    compute = torch.float32 if q.dtype in HALF_DTYPES else q.dtype
    s = (q.to(compute) @ k.to(compute).transpose(-2, -1)) * scale        # (..., Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                     # (..., Lq)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    p = torch.exp(s - safe.unsqueeze(-1))                                # exp(-inf) = 0 for masked pairs
    return p @ v.to(compute), lse


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
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    w1, w2 = torch.exp(lse1 - safe).unsqueeze(-1), torch.exp(lse2 - safe).unsqueeze(-1)   # (..., L, 1)
    return out1 * w1 + out2 * w2, lse


# ---------------------------------------------------------------------------------------------
# Ring attention
# ---------------------------------------------------------------------------------------------

_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _group_rank_size(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("no process group: start one with dist.init_process_group (or run the function with "
                         "selfattn_lite.distributed.launch, or under torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _pad(shape, n=8) -> list[int]:
    return list(shape) + [-1] * (n - len(shape))


def _exchange_shapes(q: Tensor, k: Tensor, v: Tensor, layout: str, is_causal: bool, group, what: str,
                     local_error: str | None) -> list[int]:
    """All-gather every rank's shapes, check that they agree, return every rank's local length.

    ``local_error`` is what this rank found wrong with its own inputs (None: nothing). It is
    shared in the gathered table, so every rank raises (none is left waiting in a collective).
    """
    rank, world = _group_rank_size(group)
    if max(q.dim(), k.dim(), v.dim()) > 8:
        local_error = local_error or f"at most 8 dims, got q {tuple(q.shape)}"
    rest = lambda t: _pad(t.shape[:-2] + t.shape[-1:]) if t.dim() <= 8 else _pad([])   # noqa: E731
    meta = torch.tensor([int(local_error is None), q.shape[-2], k.shape[-2], v.shape[-2],
                         _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1, LAYOUTS.index(layout),
                         int(is_causal), *rest(q), *rest(k), *rest(v)], dtype=torch.int64, device=q.device)
    table = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(table, meta, group=group)
    counters.add("meta", (world - 1) * meta.numel() * meta.element_size())   # (as a ring all-gather sends)
    rows = [t.tolist() for t in table]
    if local_error is not None:
        raise ValueError(f"{what} on rank {rank}: {local_error}")
    if failed := [r for r, row in enumerate(rows) if row[0] == 0]:
        raise ValueError(f"{what}: the inputs of rank(s) {failed} do not fit (see the error there)")
    for r, row in enumerate(rows):
        if row[4:] != rows[0][4:]:
            raise ValueError(f"{what}: ranks 0 and {r} disagree on dtype, layout, is_causal or the shapes "
                             f"(all but the sequence dim must match): {rows[0][4:]} vs {row[4:]}")
    lengths = [row[1] for row in rows]
    if any(row[1] != row[2] or row[1] != row[3] for row in rows):
        raise ValueError(f"{what}: q, k and v must hold the same rows on each rank; (q, k, v) rows per rank: "
                         f"{[tuple(row[1:4]) for row in rows]}")
    L = sum(lengths)
    want = shard_lengths(L, world, layout=layout) if L >= (world if layout == "contiguous" else 2 * world) else None
    if lengths != want:
        raise ValueError(f"{what}: the ranks hold {lengths} rows, but a {layout!r} split of L={L} over {world} "
                         f"ranks is {want}: shard with selfattn_lite.distributed.shard(x, rank, {world}, "
                         f"layout={layout!r})")
    return lengths


def _check_floats(q: Tensor, k: Tensor, v: Tensor, what: str, min_dim: int = 2) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < min_dim:
            raise ValueError(f"{what}: {name} must be a floating tensor with at least {min_dim} dims, "
                             f"got {t!r:.60}")


def _tile_kind(q_seg: tuple[int, int], k_seg: tuple[int, int], is_causal: bool) -> str:
    """'skip' (every key after every query), 'full' (no mask needed) or 'partial' (mask)."""
    if not is_causal:
        return "full"
    (qa, qb), (ka, kb) = q_seg, k_seg
    if ka > qb - 1:
        return "skip"
    return "full" if kb - 1 <= qa else "partial"


def _tiles(q_segs, k_segs, is_causal):
    """Yield (q rows slice, k rows slice, mask or None) for every tile that must be computed."""
    qo = 0
    for qa, qb in q_segs:
        ko = 0
        for ka, kb in k_segs:
            kind = _tile_kind((qa, qb), (ka, kb), is_causal)
            if kind != "skip":
                mask = None
                if kind == "partial":                         # key position <= query position
                    mask = torch.arange(ka, kb)[None, :] <= torch.arange(qa, qb)[:, None]
                yield slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), mask
            ko += kb - ka
        qo += qb - qa


def _blocks(x: Tensor, lengths: list[int]) -> list[Tensor]:
    """Receive buffers shaped like x with n = lengths[r] rows."""
    return [x.new_empty(*x.shape[:-2], n, x.shape[-1]) for n in lengths]


class _RingAttention(torch.autograd.Function):
    """Forward: K/V blocks go around the ring; backward: K/V blocks and their gradients do."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, layout, group, lengths):
        rank, world = _group_rank_size(group)
        L = sum(lengths)
        segs = [shard_segments(L, r, world, layout=layout) for r in range(world)]
        scale = 1.0 / math.sqrt(q.shape[-1])
        compute = torch.float32 if q.dtype in HALF_DTYPES else q.dtype
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=compute, device=q.device)    # (..., n, Ev)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=compute, device=q.device)   # (..., n)
        k_blk, v_blk = k, v
        for step in range(world):
            src = (rank - step) % world                       # whose K/V block we hold now
            requests = []
            if step < world - 1:                              # post the next transfer, then compute
                nxt = (rank - step - 1) % world
                k_next, v_next = (t.new_empty(*t.shape[:-2], lengths[nxt], t.shape[-1]) for t in (k, v))
                requests = _exchange([(k_blk, (rank + 1) % world), (v_blk, (rank + 1) % world)],
                                     [(k_next, (rank - 1) % world), (v_next, (rank - 1) % world)], "kv", group)
            for rows, cols, mask in _tiles(segs[rank], segs[src], is_causal):
                o, s = block_attention(q[..., rows, :], k_blk[..., cols, :], v_blk[..., cols, :], scale=scale,
                                       mask=None if mask is None else mask.to(q.device))
                out[..., rows, :], lse[..., rows] = merge_partials(out[..., rows, :], lse[..., rows], o, s)
                counters.scores += (rows.stop - rows.start) * (cols.stop - cols.start)
            _wait(requests)
            if step < world - 1:
                k_blk, v_blk = k_next, v_next
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (is_causal, layout, group, lengths, scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, layout, group, lengths, scale = ctx.setup
        rank, world = _group_rank_size(group)
        segs = [shard_segments(sum(lengths), r, world, layout=layout) for r in range(world)]
        compute = out.dtype
        qc, do = q.to(compute), grad_out.to(compute)
        delta = (do * out).sum(-1)                            # (..., n)  D_i = sum_e dO_ie O_ie
        safe_lse = lse.masked_fill(torch.isneginf(lse), float("inf"))   # a row that saw nothing: p = 0
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
                requests = _exchange([(k_blk, nxt_rank), (v_blk, nxt_rank)],
                                     [(k_next, prev_rank), (v_next, prev_rank)], "kv_bwd", group)
            kc, vc = k_blk.to(compute), v_blk.to(compute)
            for rows, cols, mask in _tiles(segs[rank], segs[src], is_causal):
                s = (qc[..., rows, :] @ kc[..., cols, :].transpose(-2, -1)) * scale   # (..., r, c)
                if mask is not None:
                    s = s.masked_fill(~mask.to(q.device), float("-inf"))
                p = torch.exp(s - safe_lse[..., rows].unsqueeze(-1))                   # the final softmax
                dv_blk[..., cols, :] += p.transpose(-2, -1) @ do[..., rows, :]
                dp = do[..., rows, :] @ vc[..., cols, :].transpose(-2, -1)
                ds = p * (dp - delta[..., rows].unsqueeze(-1))
                dq[..., rows, :] += (ds @ kc[..., cols, :]) * scale
                dk_blk[..., cols, :] += (ds.transpose(-2, -1) @ qc[..., rows, :]) * scale
                counters.scores += (rows.stop - rows.start) * (cols.stop - cols.start)
            _wait(requests)
            # the gradients of block src travel on with it; after the last step they reach their owner
            if world == 1:
                break
            nxt = (rank - step - 1) % world
            dk_next, dv_next = (t.new_empty(*t.shape[:-2], lengths[nxt], t.shape[-1]) for t in (dk_blk, dv_blk))
            _wait(_exchange([(dk_blk, nxt_rank), (dv_blk, nxt_rank)],
                            [(dk_next, prev_rank), (dv_next, prev_rank)], "dkv", group))
            dk_blk, dv_blk = dk_next, dv_next
            if step < world - 1:
                k_blk, v_blk = k_next, v_next
        return dq.to(q.dtype), dk_blk.to(k.dtype), dv_blk.to(v.dtype), None, None, None, None


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
    _check_layout(layout)
    _check_floats(q, k, v, "ring_attention")
    problem = None
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2] and q.dtype == k.dtype == v.dtype):
        problem = (f"q (..., n, E), k (..., n, E), v (..., n, Ev) must share the leading dims, E and dtype; got "
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    lengths = _exchange_shapes(q, k, v, layout, is_causal, group, "ring_attention", problem)
    return _RingAttention.apply(q, k, v, bool(is_causal), layout, group, lengths)


# ---------------------------------------------------------------------------------------------
# Ulysses: all-to-all from sequence shards to head shards and back
# ---------------------------------------------------------------------------------------------

def _all_to_all(x: Tensor, split_dim: int, cat_dim: int, send_sizes: list[int], recv_sizes: list[int],
                group) -> Tensor:
    """Send piece j of x (cut along split_dim into send_sizes) to rank j; glue the pieces received
    from every rank along cat_dim (rank j's piece has recv_sizes[j] there). Built from
    point-to-point sends, which (unlike gloo's all_to_all) allow unequal pieces."""
    rank, world = _group_rank_size(group)
    pieces = [p.contiguous() for p in torch.split(x, send_sizes, dim=split_dim)]
    received = []
    for j in range(world):
        shape = list(x.shape)
        shape[split_dim], shape[cat_dim] = send_sizes[rank], recv_sizes[j]
        received.append(pieces[j] if j == rank else x.new_empty(shape))
    others = [j for j in range(world) if j != rank]
    _wait(_exchange([(pieces[j], j) for j in others], [(received[j], j) for j in others], "all_to_all", group))
    return torch.cat(received, dim=cat_dim)


class _AllToAll(torch.autograd.Function):
    """The all-to-all, differentiable: its backward is the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, send_sizes, recv_sizes, group):
        ctx.setup = (split_dim, cat_dim, send_sizes, recv_sizes, group)
        return _all_to_all(x, split_dim, cat_dim, send_sizes, recv_sizes, group)

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim, send_sizes, recv_sizes, group = ctx.setup
        return _all_to_all(grad.contiguous(), cat_dim, split_dim, recv_sizes, send_sizes, group), \
            None, None, None, None, None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, group=None) -> Tensor:
    """Exact attention with heads, not keys, split across ranks (DeepSpeed-Ulysses).

    Every rank holds all h heads of its contiguous rows. An all-to-all sends heads
    [j h/W, (j+1) h/W) of those rows to rank j, so rank j ends with h/W heads of the *whole*
    sequence; it runs ordinary attention (torch SDPA) on them; a second all-to-all returns each
    rank's rows. Differentiable (the backward runs the all-to-alls in reverse).

    Args:
        q: (..., h, n_r, E), k: (..., h_kv, n_r, E), v: (..., h_kv, n_r, Ev): this rank's contiguous shard
            (``shard(x, rank, W)``; lengths need not divide). h and h_kv must be divisible by W
            (h_kv < h is grouped-query attention).
        is_causal: global causal mask.
        group: the process group (default: the whole world).

    Returns:
        (..., h, n_r, Ev): this rank's rows of the output.

    Raises:
        ValueError: head counts not divisible by the group size, or shapes that do not fit.
    """
    rank, world = _group_rank_size(group)
    _check_floats(q, k, v, "ulysses_attention", min_dim=3)
    h, h_kv = q.shape[-3], k.shape[-3]
    problem = None
    if h % world or h_kv % world or h % h_kv or v.shape[-3] != h_kv:
        problem = (f"heads are split over {world} ranks: q has {h} heads, k {h_kv}, v {v.shape[-3]}; each must be "
                   f"divisible by {world} (and h by h_kv)")
    elif not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3] and q.shape[-1] == k.shape[-1]
              and k.shape[-2] == v.shape[-2] and q.dtype == k.dtype == v.dtype):
        problem = (f"q (..., h, n, E), k (..., h_kv, n, E), v (..., h_kv, n, Ev) must share the leading dims, E "
                   f"and dtype; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    lengths = _exchange_shapes(q, k, v, "contiguous", is_causal, group, "ulysses_attention", problem)
    heads = [h // world] * world
    heads_kv = [h_kv // world] * world
    q_h = _AllToAll.apply(q, -3, -2, heads, lengths, group)          # (..., h/W, L, E): all rows, some heads
    k_h = _AllToAll.apply(k, -3, -2, heads_kv, lengths, group)
    v_h = _AllToAll.apply(v, -3, -2, heads_kv, lengths, group)
    out_h = F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=is_causal, enable_gqa=h != h_kv)
    return _AllToAll.apply(out_h, -2, -3, lengths, heads, group)     # (..., h, n_r, Ev): own rows, all heads


# ---------------------------------------------------------------------------------------------
# The formulas the counters are checked against
# ---------------------------------------------------------------------------------------------

def ring_schedule(world_size: int) -> list[list[int]]:
    """schedule[step][rank]: whose K/V block ``rank`` holds at ``step``, i.e. (rank - step) mod W."""
    check_positive_int("world_size", world_size)
    return [[(r - s) % world_size for r in range(world_size)] for s in range(world_size)]


def ring_bytes_per_rank(L: int, world_size: int, *, layout: str = "contiguous", batch_heads: int = 1,
                        head_dim: int, value_dim: int | None = None, itemsize: int = 4,
                        grad_itemsize: int | None = None) -> list[dict]:
    """Bytes each rank sends in one ``ring_attention`` call, forward ("kv") and backward ("kv_bwd", "dkv").

    Forward: at steps 0 .. W-2 rank r forwards the block it holds, the blocks of ranks
    r, r-1, ..., r-W+2: every K/V block but that of rank r+1. Each block of n rows costs
    batch_heads * n * (E + Ev) * itemsize bytes. With L divisible by W that is
    2 (W - 1) (L / W) * batch_heads * d * itemsize for E = Ev = d. The backward sends the same
    K/V blocks again, and the gradient accumulators (dK, dV) of all W blocks, one hop each.

    Returns:
        One dict per rank: {"kv": bytes, "kv_bwd": bytes, "dkv": bytes}.
    """
    value_dim = head_dim if value_dim is None else value_dim
    grad_itemsize = itemsize if grad_itemsize is None else grad_itemsize
    lengths = shard_lengths(L, world_size, layout=layout)
    row = batch_heads * (head_dim + value_dim)
    result = []
    for r in range(world_size):
        forwarded = sum(lengths[(r - s) % world_size] for s in range(world_size - 1))
        result.append({"kv": forwarded * row * itemsize, "kv_bwd": forwarded * row * itemsize,
                       "dkv": (L * row * grad_itemsize) if world_size > 1 else 0})
    return result


def ulysses_bytes_per_rank(L: int, world_size: int, *, batch: int = 1, heads: int, kv_heads: int | None = None,
                           head_dim: int, value_dim: int | None = None, itemsize: int = 4) -> list[dict]:
    """Bytes each rank sends in one ``ulysses_attention`` call.

    Forward: rank r keeps 1/W of the heads of its n_r rows and sends the rest:
    (W-1)/W of its q, k and v shards; then it returns the output rows of the other ranks,
    h/W heads x (L - n_r) rows. The backward sends the same amounts in reverse.

    Returns:
        One dict per rank: {"qkv": bytes, "out": bytes, "forward": bytes, "backward": bytes}.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    value_dim = head_dim if value_dim is None else value_dim
    lengths = shard_lengths(L, world_size)
    w = world_size
    result = []
    for n in lengths:
        qkv = batch * n * ((heads - heads // w) * head_dim + (kv_heads - kv_heads // w) * (head_dim + value_dim))
        out = batch * (heads // w) * (L - n) * value_dim
        bwd = batch * ((heads - heads // w) * n * value_dim
                       + (heads // w) * (L - n) * head_dim + (kv_heads // w) * (L - n) * (head_dim + value_dim))
        result.append({"qkv": qkv * itemsize, "out": out * itemsize, "forward": (qkv + out) * itemsize,
                       "backward": bwd * itemsize})
    return result


def causal_work(L: int, world_size: int, *, layout: str = "contiguous", is_causal: bool = True) -> list[int]:
    """Score entries (query row x key row, per batch-head) each rank computes in ``ring_attention``.

    A tile of (query run) x (key run) is skipped when every key comes after every query and
    computed in full (masked inside) otherwise. Contiguous: rank r computes the blocks of ranks
    0..r, so the last rank works about twice the average. Zigzag: every rank holds one early and
    one late chunk and the work is (nearly) equal.
    """
    segs = [shard_segments(L, r, world_size, layout=layout) for r in range(world_size)]
    return [sum((rows.stop - rows.start) * (cols.stop - cols.start)
                for src in range(world_size) for rows, cols, _ in _tiles(segs[r], segs[src], is_causal))
            for r in range(world_size)]


def max_sequence_length(n_devices: int, gib_per_device: float, *, d_model: int, n_layers: int,
                        n_heads: int, n_kv_heads: int | None = None, bytes_per_value: int = 2,
                        reserved_gib: float = 0.0) -> dict:
    """The longest sequence whose attention tensors fit, per strategy, on paper.

    Assumptions (a model of the attention tensors only, stated so it can be argued with):
    for training, every layer keeps its q, out (d_model each) and k, v (d_kv = d_model *
    n_kv_heads / n_heads each) per token for the backward, and attention itself runs fused
    (FlashAttention: no L x L matrix). ``reserved_gib`` per device is taken first for everything
    else (weights, optimizer state, MLP activations). Per device:

    * single: L * n_layers * (2 d_model + 2 d_kv) * b <= M
    * ring:   (L/N) * [n_layers * (2 d_model + 2 d_kv) + 2 * 2 d_kv] * b <= M
              (its shard, plus the K/V block it computes with and the one arriving)
    * ulysses: (L/N) * n_layers * (2 d_model + 2 d_kv) * b + L * (2 d_model + 2 d_kv) / N * b <= M
              (its shard, plus one layer's q, k, v, out for h/N heads of all L rows);
              only when N divides n_kv_heads, else None: heads cap Ulysses' degree.

    Returns:
        {"single": L, "ring": L, "ulysses": L or None}, rounded down to a multiple of 2N (single: of 2).
    """
    check_positive_int("n_devices", n_devices)
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_kv = d_model * n_kv_heads // n_heads
    budget = (gib_per_device - reserved_gib) * 2**30
    if budget <= 0:
        raise ValueError(f"nothing left: {gib_per_device} GiB per device, {reserved_gib} GiB reserved")
    per_token = n_layers * (2 * d_model + 2 * d_kv) * bytes_per_value     # kept for the backward
    n = n_devices
    step = 2 * n

    def down(x: float) -> int:
        return int(x) // step * step

    ring = budget * n / (per_token + 2 * 2 * d_kv * bytes_per_value)
    ulysses = None
    if n_kv_heads % n == 0:
        ulysses = down(budget * n / (per_token + (2 * d_model + 2 * d_kv) * bytes_per_value))
    return {"single": int(budget / per_token) // 2 * 2, "ring": down(ring), "ulysses": ulysses}


# ---------------------------------------------------------------------------------------------
# Starting the processes
# ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _environ(**values):
    """Set environment variables while the children start (they copy the parent's environment)."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(value) for name, value in values.items()})
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _backend(world_size: int) -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"


def device() -> torch.device:
    """The device this rank computes on: its GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _run_rank(fn, args, rank: int, world_size: int, port: int, backend: str, queue) -> None:
    """Body of one spawned process: join the group, run fn, send back torch.save(result)."""
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=60))
        try:
            result = fn(*args)
        finally:
            dist.destroy_process_group()
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, "ok", buffer.getvalue()))
    except BaseException:   # noqa: BLE001  (reported to the parent, which raises)
        queue.put((rank, "error", traceback.format_exc()))


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or all(n in os.environ for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _launch_torchrun(fn, world_size: int, args) -> list:
    """Under torchrun every process runs this: fn here, every rank's result all-gathered."""
    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise ValueError(f"launch(..., world_size={world_size}) under torchrun with WORLD_SIZE="
                         f"{os.environ['WORLD_SIZE']}: pass the same number")
    created = not dist.is_initialized()
    if created:
        backend = _backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    try:
        result = fn(*args)
        results = [None] * world_size
        dist.all_gather_object(results, result)
        return results
    finally:
        if created:
            dist.destroy_process_group()


def _raise_rank_errors(world_size: int, errors: dict, queue) -> None:
    """Raise the most telling error of the failed ranks: one rank's ValueError makes its peers fail
    with "connection closed", so collect what arrives in the next second and prefer the cause."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and len(errors) < world_size:
        try:
            rank, status, payload = queue.get(timeout=0.1)
        except Exception:   # queue.Empty
            continue
        if status == "error":
            errors[rank] = payload
    value_errors = {r: tb for r, tb in errors.items() if tb.rstrip().splitlines()[-1].startswith("ValueError")}
    rank, tb = min((value_errors or errors).items())
    message = f"rank {rank} of {world_size} failed:\n{tb}"
    if value_errors:
        raise ValueError(tb.rstrip().splitlines()[-1].removeprefix("ValueError: ") + f"\n\n({message})")
    raise RuntimeError(message)


def launch(fn: Callable, world_size: int, *args, timeout: float = 120.0) -> list:
    """Run ``fn(*args)`` in ``world_size`` processes that form one process group; return their results.

    Each process joins a fresh group (gloo on CPU; nccl when there are ``world_size`` GPUs, rank r
    on GPU r) on a free local port, runs ``fn(*args)`` (inside it ``dist.get_rank()`` says which
    rank it is), and destroys the group. Processes are started with "spawn", so ``fn`` must be
    importable: a function of a module (such as the workers below), not one defined in a notebook.
    Under ``torchrun`` (one process per rank already started) it runs ``fn`` in this process and
    all-gathers the results instead.

    Args:
        fn: a module-level function; its result must be what ``torch.save`` stores (tensors,
            numbers, strings, lists, tuples, dicts).
        world_size: number of processes.
        args: passed to fn in every process (tensors are copied to the children).
        timeout: seconds before the processes are stopped and an error raised.

    Returns:
        [result of rank 0, result of rank 1, ...].

    Raises:
        ValueError: fn not importable, a bad world_size, or a ValueError raised in a rank (bad
        input: its message first, the rank's traceback after). RuntimeError: a rank failed otherwise
        (its traceback is in the message) or the run timed out. No process is left running.
    """
    import torch.multiprocessing as mp

    check_positive_int("world_size", world_size)
    if not callable(fn) or getattr(fn, "__module__", "__main__") == "__main__" or "<" in fn.__qualname__:
        raise ValueError(f"launch needs a function defined at the top level of an importable module (spawned "
                         f"processes import it), got {fn!r}; put it in a module, e.g. next to "
                         "selfattn_lite.distributed.attention_worker")
    if _under_torchrun():
        return _launch_torchrun(fn, world_size, args)
    backend = _backend(world_size)
    # forkserver (Linux, macOS): one server process imports torch and this module once, and every launch
    # forks its ranks from it in a fraction of a second; spawn (elsewhere) imports torch in every rank.
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["selfattn_lite.distributed"])
    queue = ctx.Queue()
    port = _free_port()
    processes = [ctx.Process(target=_run_rank, args=(fn, args, rank, world_size, port, backend, queue),
                             daemon=True) for rank in range(world_size)]
    results: dict[int, object] = {}
    try:
        with _environ(OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE")):
            for p in processes:
                p.start()
        deadline = time.monotonic() + timeout
        while len(results) < world_size:
            try:
                rank, status, payload = queue.get(timeout=0.2)
            except Exception:   # queue.Empty: check that nobody died silently
                dead = [r for r, p in enumerate(processes) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} exited with code(s) "
                                       f"{[processes[r].exitcode for r in dead]} without a result") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"launch timed out after {timeout} s; ranks done: {sorted(results)}") from None
                continue
            if status == "error":
                _raise_rank_errors(world_size, {rank: payload}, queue)
            results[rank] = torch.load(io.BytesIO(payload), weights_only=True)
    finally:
        for p in processes:
            p.join(timeout=5 if len(results) == world_size else 0.1)
        for p in processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        queue.close()
        queue.join_thread()
    return [results[r] for r in range(world_size)]


# ---------------------------------------------------------------------------------------------
# Workers: functions that run inside the launched processes (importable, so spawn can find them)
# ---------------------------------------------------------------------------------------------

METHODS = {"ring": ring_attention, "ulysses": ulysses_attention}


def attention_worker(cases: list[dict]) -> list:
    """Run every case on this rank; return, per case, this rank's shards and counters (None if not in it).

    Each case is a dict: "method" ("ring" or "ulysses"), full "q", "k", "v", "grad" (the gradient
    of the output; None: forward only), "is_causal", "layout" (ring only), "ranks" (a list of
    global ranks forming the group; None: all). Every rank builds the groups in the same order.

    Returns:
        Per case: {"out", "dq", "dk", "dv" (this rank's shards), "forward" / "backward" (counters:
        bytes sent by kind and score entries), "kv_bytes" (bytes of this rank's K/V shard),
        "peak_bytes" (peak memory of the forward, when the case asks "measure_memory")} or None.
    """
    from .course.memory import peak_memory

    groups = {}
    for case in cases:
        ranks = case.get("ranks")
        if ranks is not None and tuple(ranks) not in groups:
            groups[tuple(ranks)] = dist.new_group(list(ranks))
    me = dist.get_rank()
    results = []
    for case in cases:
        ranks = case.get("ranks")
        group = groups[tuple(ranks)] if ranks is not None else None
        if ranks is not None and me not in ranks:
            results.append(None)
            continue
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        method, layout = case.get("method", "ring"), case.get("layout", "contiguous")
        kwargs = {"is_causal": case.get("is_causal", False), "group": group}
        if method == "ring":
            kwargs["layout"] = layout
        where = device()
        q, k, v = (shard(case[n], rank, world, layout=layout).to(where).requires_grad_(case.get("grad") is not None)
                   for n in ("q", "k", "v"))
        result = {"kv_bytes": k.nbytes + v.nbytes}
        if case.get("measure_memory"):
            with torch.no_grad():
                result["peak_bytes"] = peak_memory(lambda: METHODS[method](q, k, v, **kwargs))
        reset_counters()
        out = METHODS[method](q, k, v, **kwargs)
        result["forward"] = counters.snapshot()
        result["out"] = out.detach().cpu()
        if case.get("grad") is not None:
            reset_counters()
            out.backward(shard(case["grad"], rank, world, layout=layout).to(where))
            result["backward"] = counters.snapshot()
            result.update(dq=q.grad.cpu(), dk=k.grad.cpu(), dv=v.grad.cpu())
        results.append(result)
    return results


def timing_worker(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, layout: str, budget_s: float = 0.5) -> dict:
    """Time ``ring_attention`` on this rank's shard (``bench.time_fn``), after a barrier.

    Returns:
        {"seconds": median seconds per call, "out": this rank's output shard}.
    """
    from .course import bench

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(t, rank, world, layout=layout).to(device()) for t in (q, k, v))
    with torch.no_grad():
        out = ring_attention(q, k, v, is_causal=is_causal, layout=layout)
        dist.barrier()
        # every rank must make the same number of calls (each call communicates): fix the repeats
        repeat = torch.tensor([max(3, int(budget_s / max(_once(q, k, v, is_causal, layout), 1e-6)))])
        dist.all_reduce(repeat, op=dist.ReduceOp.MIN)
        seconds = bench.time_fn(lambda: ring_attention(q, k, v, is_causal=is_causal, layout=layout),
                                device=q.device, warmup=1, repeat=min(int(repeat), 50), number=1)
    return {"seconds": seconds, "out": out.cpu()}


def _once(q, k, v, is_causal, layout) -> float:
    start = time.perf_counter()
    ring_attention(q, k, v, is_causal=is_causal, layout=layout)
    return time.perf_counter() - start


def _self_check(world_size: int) -> None:
    """``python -m selfattn_lite.distributed [W]`` (or under torchrun): ring and Ulysses vs SDPA."""
    gen = torch.Generator().manual_seed(0)
    L = 4 * world_size + 3
    q, k, v, grad = (torch.randn(2, world_size * 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    cases = [dict(method=m, q=q, k=k, v=v, grad=grad, is_causal=c, layout=lay)
             for m, lay in (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous"))
             for c in (False, True)]
    per_rank = launch(attention_worker, world_size, cases)
    for i, case in enumerate(cases):
        got = unshard([r[i]["out"] for r in per_rank], layout=case["layout"])
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"]))
    if not _under_torchrun() or int(os.environ.get("RANK", 0)) == 0:
        print(f"ring (contiguous, zigzag) and Ulysses on {world_size} processes ({_backend(world_size)}), "
              f"L = {L}, causal and not: equal to single-process SDPA")


def main(argv=None) -> None:
    import argparse

    from selfattn_lite.distributed import _self_check as check  # the importable module, not __main__

    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.distributed",
                                     description="Self-check: ring attention (contiguous and zigzag) and Ulysses on "
                                                 "world_size processes, equal to single-process SDPA.")
    parser.add_argument("world_size", nargs="?", type=int, default=2,
                        help="processes to launch (default: 2; under torchrun its WORLD_SIZE wins)")
    args = parser.parse_args(argv)
    check(int(os.environ.get("WORLD_SIZE", args.world_size)))


if __name__ == "__main__":
    main()
