"""The nccl path without GPUs: one rank of an nccl group played in this process, where every collective
refuses a CPU tensor as nccl does ("No backend type associated with device type cpu"). The rank's GPU is
played by the meta device (tensors with shapes and no data), so a tensor that a worker forgot to put on
``device()`` shows up as a CPU tensor handed to a collective. No process is launched, no GPU needed."""

import importlib

import pytest
import torch
import torch.distributed as dist

from selfattn_lite import distributed as D
from selfattn_lite.course import distributed_cli

launch = importlib.import_module("selfattn_lite.distributed.launch")   # the module (the package exports its function)

GPU = torch.device("meta")                      # plays rank 0's GPU


class Reached(Exception):
    """Raised by the fake all_gather: the first collective got a tensor on the rank's device."""


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from _tensors(item)
    elif isinstance(x, dist.P2POp):
        yield x.tensor


def _refuse_cpu(name, seen):
    def collective(*args, **kwargs):
        for t in _tensors([*args, *kwargs.values()]):
            if t.device.type == "cpu":
                raise RuntimeError(f"{name}: No backend type associated with device type cpu")
        seen.append(name)
    return collective


@pytest.fixture
def nccl_rank(monkeypatch):
    """This process as rank 0 of 2 under nccl; returns the names of the collectives called."""
    seen = []
    for name, value in (("is_initialized", lambda: True), ("get_backend", lambda group=None: "nccl"),
                        ("get_rank", lambda group=None: 0), ("get_world_size", lambda group=None: 2),
                        ("barrier", lambda *a, **k: seen.append("barrier"))):
        monkeypatch.setattr(dist, name, value)
    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter",
                 "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv"):
        monkeypatch.setattr(dist, name, _refuse_cpu(name, seen))

    def all_gather_object(outputs, obj, group=None):             # torch places the object itself
        seen.append("all_gather_object")
        outputs[:] = [obj] * len(outputs)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    return seen


def test_the_fake_refuses_cpu_tensors_as_nccl_does(nccl_rank):
    with pytest.raises(RuntimeError, match="device type cpu"):
        dist.all_reduce(torch.tensor([3]))
    dist.all_reduce(torch.empty(1, device=GPU))
    assert nccl_rank == ["all_reduce"]


def test_device_is_the_rank_gpu_under_nccl(nccl_rank, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert launch.device() == torch.device("cuda", 1)


def test_timing_worker_hands_no_cpu_tensor_to_a_collective(nccl_rank, monkeypatch):
    got = []

    def ring(q, k, v, **kwargs):                                   # the ring's compute, stood in for
        got.append({t.device for t in (q, k, v)})
        return torch.zeros(q.shape)
    monkeypatch.setattr(distributed_cli, "device", lambda: GPU)
    monkeypatch.setattr(distributed_cli, "ring_attention", ring)
    monkeypatch.setattr(distributed_cli.bench, "time_stats",
                        lambda *a, **k: distributed_cli.bench.Timing([1e-3, 2e-3, 3e-3], 1, 1e-3, "cuda"))
    q = torch.randn(1, 2, 8, 4)
    result = distributed_cli.timing_worker(q, q, q, True, "zigzag", 0.01)
    assert got and all(devices == {GPU} for devices in got)        # the shards went to the rank's device
    assert "barrier" in nccl_rank and "all_gather_object" in nccl_rank
    assert result["backend"] == "nccl" and result["device"] == str(GPU)
    assert (result["min"], result["seconds"], result["max"]) == (1e-3, 2e-3, 3e-3)   # the samples' spread, returned


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_the_first_collective_of_ring_and_ulysses_gets_the_inputs_device(nccl_rank, monkeypatch, method):
    def all_gather(table, meta, group=None):
        _refuse_cpu("all_gather", nccl_rank)(table, meta)
        raise Reached
    monkeypatch.setattr(dist, "all_gather", all_gather)
    q = torch.empty(1, 2, 4, 8, device=GPU)                        # rank 0's shard of L = 8 over 2 ranks
    with pytest.raises(Reached):
        D.METHODS[method](q, q, q, is_causal=True)
    assert nccl_rank == ["all_gather"]
