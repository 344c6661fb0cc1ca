"""Sharding: which rows of the sequence each rank holds.

Taught in notebook 14, "The idea: split the sequence, not the model".

L rows over P parts give the first L % P parts one row more (``split_sizes``).
``layout="contiguous"``: rank r holds part r of W parts. ``layout="zigzag"``: the sequence is cut
into 2W chunks and rank r holds chunks r and 2W - 1 - r, so that under a causal mask every rank has
the same work (torch calls it head-tail load balancing).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_int, check_positive_int, is_int, shape_str

__all__ = ["LAYOUTS", "split_sizes", "shard_segments", "shard_indices", "shard_lengths", "shard", "unshard",
           "check_layout"]

LAYOUTS = ("contiguous", "zigzag")


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
    check_layout(layout)
    check_positive_int("world_size", world_size)
    rank = check_int("rank", rank, low=0, high=world_size - 1)
    parts = world_size if layout == "contiguous" else 2 * world_size
    if not is_int(L) or L < parts:
        raise ValueError(f"a sequence of L={L!r} rows cannot be cut into {parts} non-empty parts "
                         f"(layout={layout!r}, world_size={world_size}): need L >= {parts}")
    L = int(L)
    sizes = split_sizes(L, parts)
    starts = [sum(sizes[:p]) for p in range(parts)]
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return [(starts[c], starts[c] + sizes[c]) for c in chunks]


def shard_indices(L: int, rank: int, world_size: int, *, layout: str = "contiguous") -> Tensor:
    """(n_rank,) int64 global positions of the rows ``rank`` holds, in its local order."""
    return torch.cat([torch.arange(a, b) for a, b in shard_segments(L, rank, world_size, layout=layout)])


def shard_lengths(L: int, world_size: int, *, layout: str = "contiguous") -> list[int]:
    """Rows held by each rank."""
    check_positive_int("world_size", world_size)
    return [sum(b - a for a, b in shard_segments(L, r, world_size, layout=layout)) for r in range(world_size)]


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
    d = _dim(shards[0], dim, "shards[0]")
    first = shards[0]
    for r, s in enumerate(shards):
        if s.dim() != first.dim() or s.dtype != first.dtype or \
                s.shape[:d] + s.shape[d + 1:] != first.shape[:d] + first.shape[d + 1:]:
            raise ValueError(f"shards must agree in every dim but dim {dim}, and in dtype: shards[0] "
                             f"{shape_str(first)} {first.dtype}, shards[{r}] {shape_str(s)} {s.dtype}")
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
# Checks
# ---------------------------------------------------------------------------------------------

def check_layout(layout: str) -> str:
    """``layout`` if it is one of ``LAYOUTS``, else ValueError."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _dim(x: Tensor, dim: int, name: str = "x") -> int:
    if not is_int(dim) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim!r} is out of range for {name} of shape {tuple(x.shape)}")
    return dim % x.dim()
