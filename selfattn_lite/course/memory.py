"""Peak memory of a call: what notebooks 07, 08, 09 and 11 measure, on the CPU and on CUDA.

    peak_memory(fn, device) = max over the call of (bytes allocated now - bytes allocated before)

CUDA reads the caching allocator's own counters; the CPU has none, so the profiler's allocation
log is replayed in time order (``cpu_peak_bytes``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager

import torch

__all__ = ["peak_memory", "cpu_peak_bytes", "quiet_stderr"]


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before.

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (the caching
    allocator's own count). CPU: torch's profiler with ``profile_memory=True`` logs every
    allocation and free of the CPU allocator, including the scratch buffers inside fused
    kernels, in the trace it exports; we replay them in time order and keep the highest running total. The result
    (typically the output) is kept alive until the measurement ends, so it counts.
    Tensors created before the call (the inputs) do not count.
    """
    device = torch.device(device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            result = fn()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - before
        else:
            peak, result = cpu_peak_bytes(fn)
    del result
    return int(peak)



@contextmanager
def quiet_stderr():
    """Silence C++ writes to file descriptor 2 (the profiler's start/stop log lines)."""
    try:
        fd = os.dup(2)
    except OSError:       # no real stderr (some embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def cpu_peak_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    """(peak bytes the CPU allocator held above the start while ``fn()`` ran, its result)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    # The trace (Chrome trace format) logs every allocation (+bytes) and free (-bytes) the CPU
    # allocator made as a "[memory]" event. prof.events() only keeps each op's net change, which
    # hides the scratch buffers an op frees before it returns; the trace keeps every one.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    events.sort(key=lambda e: float(e["ts"]))
    live = peak = 0
    for e in events:
        live += e["args"]["Bytes"]
        peak = max(peak, live)
    return peak, result
