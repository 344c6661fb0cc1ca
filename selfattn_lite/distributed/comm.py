"""Communication plumbing shared by ring attention and Ulysses: counted point-to-point exchanges,
the group's rank and size, and the shape agreement every call checks first.

Taught in notebook 14, "Counted, not guessed: what each rank sends".

Every byte a rank sends goes through ``exchange``, which counts it in ``counters`` (per process),
so that notebook 14 can check the bytes against the formulas of ``cost``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from .._checks import check_bool, check_int, check_tensor, shape_str
from .sharding import LAYOUTS, check_layout, shard_lengths

__all__ = ["Counters", "counters", "reset_counters", "exchange", "wait_all", "group_rank_size",
           "exchange_shapes", "check_floats"]


@dataclass
class Counters:
    """What this process did: bytes sent to other ranks by kind, and score entries computed.

    ``sent`` kinds: "kv" (ring forward K/V blocks), "kv_bwd" and "dkv" (ring backward: K/V blocks
    and their gradient accumulators), "all_to_all" (Ulysses, forward and backward), "meta" (the
    shapes every call exchanges first). ``scores`` counts (query row, key row) pairs computed,
    per batch-head (a masked pair inside a computed tile counts; a skipped tile does not).
    ``kv_held`` is the most bytes of K/V blocks the ring forward held at once, by its own list of the blocks
    it holds (``hold``): a count of those tensors, not an allocator's reading.
    ``by_tensor``: the same bytes again, per tensor sent, where the sender names it (Ulysses: "q", "k",
    "v", "out" in the forward, "dq", "dk", "dv", "dout" in the backward).
    """

    sent: dict = field(default_factory=dict)
    by_tensor: dict = field(default_factory=dict)
    scores: int = 0
    kv_held: int = 0

    def add(self, kind: str, nbytes: int, tensor: str | None = None) -> None:
        if not isinstance(kind, str):
            raise ValueError(f"kind must be a str (what was sent, e.g. 'kv'), got {kind!r}")
        if tensor is not None and not isinstance(tensor, str):
            raise ValueError(f"tensor must be None or a str (which tensor was sent, e.g. 'k'), got {tensor!r}")
        check_int("nbytes", nbytes)
        self.sent[kind] = self.sent.get(kind, 0) + int(nbytes)
        if tensor is not None:
            self.by_tensor[tensor] = self.by_tensor.get(tensor, 0) + int(nbytes)

    def hold(self, *tensors: Tensor) -> None:
        """Count the bytes of the distinct tensors named as held now (one named twice counts once); keep the most."""
        for i, t in enumerate(tensors):
            check_tensor(f"tensors[{i}]", t)
        distinct = {t.data_ptr(): t.nbytes for t in tensors}
        self.kv_held = max(self.kv_held, sum(distinct.values()))

    def snapshot(self) -> dict:
        return {"sent": dict(self.sent), "by_tensor": dict(self.by_tensor), "scores": self.scores,
                "kv_held": self.kv_held}


counters = Counters()


def reset_counters() -> None:
    """Zero this process's ``counters``."""
    counters.sent.clear()
    counters.by_tensor.clear()
    counters.scores = 0
    counters.kv_held = 0


def exchange(sends: list[tuple[Tensor, int]], recvs: list[tuple[Tensor, int]], kind: str, group, *,
             tensor: str | None = None) -> list:
    """Post point-to-point sends and receives together (``batch_isend_irecv``), count the sent bytes.

    Args:
        sends: (tensor, destination group rank); recvs: (buffer, source group rank).
        kind: what is sent, the key of ``counters.sent``; tensor: optionally, which tensor it is
            (``counters.by_tensor``).

    Returns:
        The requests; call ``.wait()`` on each before reading the buffers.
    """
    ops = []
    for t, peer in sends:
        ops.append(dist.P2POp(dist.isend, t, dist.get_global_rank(group, peer) if group else peer, group))
        counters.add(kind, t.numel() * t.element_size(), tensor)
    for t, peer in recvs:
        ops.append(dist.P2POp(dist.irecv, t, dist.get_global_rank(group, peer) if group else peer, group))
    return dist.batch_isend_irecv(ops) if ops else []


def wait_all(requests: list) -> None:
    """Wait for every request that ``exchange`` returned."""
    for request in requests:
        request.wait()


_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def group_rank_size(group) -> tuple[int, int]:
    """(this process's rank in ``group``, the group's size); ValueError when there is no process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("no process group: start one with dist.init_process_group (or run the function with "
                         "selfattn_lite.distributed.launch, or under torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _pad(shape, n=8) -> list[int]:
    return list(shape) + [-1] * (n - len(shape))


def exchange_shapes(q: Tensor, k: Tensor, v: Tensor, layout: str, is_causal: bool, group, what: str,
                    local_error: str | None) -> list[int]:
    """All-gather every rank's shapes, check that they agree, return every rank's local length.

    ``local_error`` is what this rank found wrong with its own inputs (None: nothing). It is
    shared in the gathered table, so every rank raises (none is left waiting in a collective).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.dim() < 2:
            raise ValueError(f"{what}: {name} must have at least 2 dims (..., L, E), got shape {shape_str(t)}")
    check_layout(layout)
    check_bool("is_causal", is_causal)
    rank, world = group_rank_size(group)
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


def check_floats(q: Tensor, k: Tensor, v: Tensor, what: str, min_dim: int = 2) -> None:
    """ValueError unless q, k and v are floating tensors with at least ``min_dim`` dims."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < min_dim:
            raise ValueError(f"{what}: {name} must be a floating tensor with at least {min_dim} dims, "
                             f"got {t!r:.60}")

