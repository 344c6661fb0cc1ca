"""The ring's communication pattern replayed with its tile work replaced by sleeps, for tests/reference/test_distributed.py.

Notebook 14 models how long the ring takes from the step table work[s][r] (a recurrence over each rank's
dependencies on its neighbours). These workers run the exact posting order of ``_RingAttention`` through the
package's own ``exchange`` and ``wait_all`` on gloo processes, each step's tiles replaced by
``sleep(work[s][rank] * unit)``, so the test can compare the measured finish of every rank with the model.
(A module of its own: ``launch`` needs a function that the spawned processes can import.)
"""

import time

import torch
import torch.distributed as dist

from selfattn_lite.distributed.comm import exchange, wait_all


def _median_finish(step_loop, work, unit, reps):
    rank = dist.get_rank()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        step_loop(rank, dist.get_world_size(), work, unit)
        times.append(time.perf_counter() - t0)
        dist.barrier()
    return sorted(times)[len(times) // 2]


def _forward(rank, W, work, unit):
    """As ``_RingAttention.forward``: post the next K/V transfer, compute the held block, wait."""
    blk = torch.zeros(2, 512)
    for s in range(W):
        requests = []
        if s < W - 1:
            nxt = torch.empty_like(blk)
            requests = exchange([(blk, (rank + 1) % W)], [(nxt, (rank - 1) % W)], "kv", None)
        time.sleep(work[s][rank] * unit)
        wait_all(requests)
        if s < W - 1:
            blk = nxt


def _backward(rank, W, work, unit):
    """As ``_RingAttention.backward``: post the K/V transfer, compute, wait; then send dK, dV on and wait at once."""
    blk, dkv = torch.zeros(2, 512), torch.zeros(2, 512)
    for s in range(W):
        requests = []
        if s < W - 1:
            nxt = torch.empty_like(blk)
            requests = exchange([(blk, (rank + 1) % W)], [(nxt, (rank - 1) % W)], "kv_bwd", None)
        time.sleep(work[s][rank] * unit)
        wait_all(requests)
        dkv_next = torch.empty_like(dkv)
        wait_all(exchange([(dkv, (rank + 1) % W)], [(dkv_next, (rank - 1) % W)], "dkv", None))
        dkv = dkv_next
        if s < W - 1:
            blk = nxt


def replay_worker(work, unit, reps):
    """(median seconds of the forward's pattern, of the backward's) on this rank."""
    return _median_finish(_forward, work, unit, reps), _median_finish(_backward, work, unit, reps)
