"""Starting the processes: ``launch`` (spawned CPU or GPU processes, or in place under torchrun),
the errors of failed ranks collected, and ``attention_worker``, the function notebook 14 launches.

Taught in notebook 14, "Run it for real: processes and torch.distributed".

The same code runs on CPU processes (gloo) and on GPUs (nccl, one GPU per rank). The nccl path
needs as many GPUs as ranks: on a machine with one GPU, ``launch`` uses gloo on the CPU, so the
nccl path is not exercised there (nor in the course's tests).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from .._checks import check_positive_int
from .comm import counters, reset_counters
from .ring import ring_attention
from .sharding import shard
from .ulysses import ulysses_attention

__all__ = ["launch", "device", "choose_backend", "free_port", "under_torchrun", "attention_worker", "METHODS"]


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
    if under_torchrun():
        return _launch_torchrun(fn, world_size, args)
    backend = choose_backend(world_size)
    # forkserver (Linux, macOS): one server process imports torch and this module once, and every launch
    # forks its ranks from it in a fraction of a second; spawn (elsewhere) imports torch in every rank.
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["selfattn_lite.distributed"])
    queue = ctx.Queue()
    port = free_port()
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
        bytes sent by kind, score entries, K/V bytes held at once), "kv_bytes" (bytes of this rank's K/V shard),
        "backend" (the process group's backend, "gloo" or "nccl")} or None. (Peak memory is measured by the
        machinery: ``selfattn_lite.course.distributed_cli.memory_worker``.)
    """
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
        result = {"kv_bytes": k.nbytes + v.nbytes, "backend": str(dist.get_backend(group))}
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


# ---------------------------------------------------------------------------------------------
# Plumbing: ports, environment, one rank's body, torchrun, error collection
# ---------------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for the group's rendezvous)."""
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


def choose_backend(world_size: int) -> str:
    """"nccl" when there is one GPU per rank, else "gloo" (CPU processes; also on a single-GPU machine)."""
    check_positive_int("world_size", world_size)
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


def under_torchrun() -> bool:
    """True in a process that torchrun started (it sets RANK, WORLD_SIZE, MASTER_ADDR)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(n in os.environ for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _launch_torchrun(fn, world_size: int, args) -> list:
    """Under torchrun every process runs this: fn here, every rank's result all-gathered."""
    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise ValueError(f"launch(..., world_size={world_size}) under torchrun with WORLD_SIZE="
                         f"{os.environ['WORLD_SIZE']}: pass the same number")
    created = not dist.is_initialized()
    if created:
        backend = choose_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
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

