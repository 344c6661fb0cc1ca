"""Machinery around ``selfattn_lite.distributed``: timing a ring (``timing_worker``, for notebook 14's
last section) and the self-check command line.

    python -m selfattn_lite.course.distributed_cli [W]            # W CPU processes (gloo), default 2
    torchrun --nproc-per-node 2 -m selfattn_lite.course.distributed_cli

The self-check runs ring attention (contiguous and zig-zag) and Ulysses, causal and not, and compares
every rank's rows with single-process SDPA. On a machine with fewer GPUs than ranks (one GPU, say)
``launch`` chooses gloo on the CPU, so the nccl path is exercised only with one GPU per rank.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..distributed import (
    attention_worker,
    block_attention,
    choose_backend,
    device,
    launch,
    merge_partials,
    ring_attention,
    ring_tiles,
    shard,
    shard_segments,
    under_torchrun,
    unshard,
)
from . import bench

__all__ = ["timing_worker", "rank_tiles", "tiles_worker", "memory_worker", "self_check", "main"]


def timing_worker(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, layout: str, budget_s: float = 0.5) -> dict:
    """Time ``ring_attention`` on this rank's shard (``bench.time_fn``), after a barrier.

    No CPU tensor is handed to a collective under nccl (it moves only GPU tensors; a CPU tensor raises
    "No backend type associated with device type cpu"): the shards go to ``device()``, and the number of
    timed calls is agreed with ``all_gather_object``, which places the int where the backend wants it.

    Returns:
        {"seconds": median seconds per call, "min" / "max": the fastest and slowest of its samples,
        "out": this rank's output shard, "backend": the process
        group's backend, "device": the device this rank computed on, "threads": its torch threads}.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    where = device()
    q, k, v = (shard(t, rank, world, layout=layout).to(where) for t in (q, k, v))
    with torch.no_grad():
        out = ring_attention(q, k, v, is_causal=is_causal, layout=layout)
        dist.barrier()
        # every rank must make the same number of calls (each call communicates): agree on the fewest
        # (an object collective: torch moves the int on the device the backend serves, CPU or GPU)
        counts = [None] * world
        dist.all_gather_object(counts, max(3, int(budget_s / max(_once(q, k, v, is_causal, layout), 1e-6))))
        repeat = min(min(counts), 50)
        timing = bench.time_stats(lambda: ring_attention(q, k, v, is_causal=is_causal, layout=layout),
                                  device=q.device, warmup=1, repeat=repeat, number=1)
    return {"seconds": timing.median, "min": timing.min, "max": max(timing.samples), "out": out.cpu(),
            "backend": str(dist.get_backend()), "device": str(where), "threads": torch.get_num_threads()}


def rank_tiles(q_r: Tensor, ks: list[Tensor], vs: list[Tensor], segs: list, r: int, is_causal: bool = True) -> Tensor:
    """Rank r's tiles of a ring against every rank's K/V block, as ``ring_attention``'s forward computes them, with
    no transfer: q_r (..., n_r, E) its queries; ks, vs the W ranks' K/V blocks; segs each rank's runs of positions
    (``shard_segments``). Returns its rows of the output (..., n_r, Ev)."""
    scale = q_r.shape[-1] ** -0.5
    out = q_r.new_zeros(*q_r.shape[:-1], vs[0].shape[-1])                  # (..., n_r, Ev)
    lse = q_r.new_full(q_r.shape[:-1], float("-inf"))                       # (..., n_r)
    for src in range(len(ks)):                                              # the block of rank src
        for rows, cols, _, mask in ring_tiles(segs[r], segs[src], is_causal=is_causal):
            o, lse_o = block_attention(q_r[..., rows, :], ks[src][..., cols, :], vs[src][..., cols, :], scale=scale,
                                       mask=None if mask is None else mask.to(q_r.device))
            out[..., rows, :], lse[..., rows] = merge_partials(out[..., rows, :], lse[..., rows], o, lse_o)
    return out


def tiles_worker(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, layout: str, budget_s: float = 0.5) -> dict:
    """Time this rank's ``rank_tiles`` with every rank's K/V block already here: the ring's work without its
    transfers, the W processes computing at the same time (sharing the machine as the ring's ranks do).

    Sampled as ``timing_worker`` samples: single calls after a barrier, as many as fit ``budget_s`` (3 to 50), the
    count agreed by all ranks. Returns {"seconds", "min", "max", "out", "threads"} as ``timing_worker`` does.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    where = device()
    L = q.shape[-2]
    segs = [shard_segments(L, r, world, layout=layout) for r in range(world)]
    q_r = shard(q, rank, world, layout=layout).to(where)
    ks, vs = ([shard(t, r, world, layout=layout).to(where) for r in range(world)] for t in (k, v))

    def once() -> Tensor:
        return rank_tiles(q_r, ks, vs, segs, rank, is_causal)

    with torch.no_grad():
        start = time.perf_counter()
        out = once()
        if q_r.device.type == "cuda":
            torch.cuda.synchronize(q_r.device)
        first = time.perf_counter() - start
        counts = [None] * world
        dist.all_gather_object(counts, max(3, int(budget_s / max(first, 1e-6))))
        dist.barrier()
        timing = bench.time_stats(once, device=q_r.device, warmup=1, repeat=min(min(counts), 50), number=1)
    return {"seconds": timing.median, "min": timing.min, "max": max(timing.samples), "out": out.cpu(),
            "threads": torch.get_num_threads()}


def memory_worker(q: Tensor, k: Tensor, v: Tensor, method: str = "ring", is_causal: bool = False) -> int:
    """Peak memory (bytes) of this rank's forward of ``method`` ("ring" or "ulysses") on its shard of q, k, v.

    Measured with ``memory.peak_memory`` (the machinery's measurement, so the reference stays free of it).
    """
    from ..distributed import METHODS
    from .memory import peak_memory

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(t, rank, world, layout="contiguous").to(device()) for t in (q, k, v))
    with torch.no_grad():
        return peak_memory(lambda: METHODS[method](q, k, v, is_causal=is_causal))


def _once(q, k, v, is_causal, layout) -> float:
    start = time.perf_counter()
    ring_attention(q, k, v, is_causal=is_causal, layout=layout)
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    return time.perf_counter() - start


def self_check(world_size: int) -> None:
    """Ring (contiguous, zig-zag) and Ulysses on ``world_size`` processes, causal and not, against SDPA."""
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
    if not under_torchrun() or int(os.environ.get("RANK", 0)) == 0:
        print(f"ring (contiguous, zigzag) and Ulysses on {world_size} processes ({choose_backend(world_size)}), "
              f"L = {L}, causal and not: equal to single-process SDPA")


def main(argv=None) -> None:
    from selfattn_lite.course.distributed_cli import self_check as check  # the importable module, not __main__

    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.distributed_cli",
                                     description="Self-check: ring attention (contiguous and zigzag) and Ulysses on "
                                                 "world_size processes, equal to single-process SDPA.")
    parser.add_argument("world_size", nargs="?", type=int, default=2,
                        help="processes to launch (default: 2; under torchrun its WORLD_SIZE wins)")
    args = parser.parse_args(argv)
    check(int(os.environ.get("WORLD_SIZE", args.world_size)))


if __name__ == "__main__":
    main()
