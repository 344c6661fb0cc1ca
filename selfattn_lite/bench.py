"""Timing helper behind every notebook's last cell.

Each notebook compares what it taught against torch's fused
``scaled_dot_product_attention`` (SDPA) on the best device present:

* CUDA: bfloat16, realistic sizes, synchronized timing with CUDA events, achieved
  TFLOP/s and the share of the device's peak when the device is known.
* CPU: float32, small sizes so that a whole timing cell stays under 10 s.

Every row is checked against the reference output (``torch.testing.assert_close``)
before any time is reported: a fast wrong answer is never printed.

Unit: FLOPs count one multiply-add as 2 FLOPs (as torch's ``FlopCounterMode`` does); the
GFLOP/s and TFLOP/s columns are FLOPs per second in that unit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "BenchRow",
    "attention_flops",
    "best_device",
    "default_sizes",
    "device_name",
    "peak_tflops",
    "time_fn",
    "compare",
    "compare_attention",
    "format_table",
    "print_table",
    "plot_rows",
]

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, TFLOP/s.
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
}


@dataclass
class BenchRow:
    """One timed implementation. ``ratio`` is time / reference time (1.0 for the reference)."""

    name: str
    seconds: float
    flops: float | None
    ratio: float
    max_abs_err: float
    device: str
    dtype: str
    peak_share: float | None = None

    @property
    def ms(self) -> float:
        return self.seconds * 1e3

    @property
    def tflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.seconds / 1e12

    @property
    def gflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.seconds / 1e9


def attention_flops(B: int, H: int, L: int, S: int, D: int, *, causal: bool = False) -> float:
    """Forward FLOPs of attention: two matmuls (QK^T and PV) of L*S*D multiply-adds each, per head.

    One multiply-add = 2 FLOPs, so 2 * L*S*D FLOPs per matmul and 4 * B * H * L * S * D in all,
    halved when causal (a kernel that skips the masked blocks computes about half the scores).
    """
    flops = 4.0 * B * H * L * S * D
    return flops / 2 if causal else flops


def best_device() -> torch.device:
    """CUDA if present, else CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Dense bf16/fp16 tensor-core peak of a known GPU, else None (CPUs: None)."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # most specific first
        if key in name:
            return PEAK_BF16_TFLOPS[key]
    return None


def default_sizes(device: torch.device | str | None = None) -> dict:
    """Attention sizes for a timing cell: realistic on CUDA, small on CPU."""
    device = torch.device(device) if device is not None else best_device()
    if device.type == "cuda":
        # the explicit path materialises (B, H, L, S) float32 scores: 2 GiB at these sizes
        return dict(B=2, H=16, L=4096, S=4096, D=128, dtype=torch.bfloat16)
    return dict(B=1, H=8, L=512, S=512, D=64, dtype=torch.float32)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], *, device: torch.device | str = "cpu",
            warmup: int = 2, repeat: int | None = None, budget_s: float = 0.5) -> float:
    """Median seconds per call of ``fn()``.

    On CUDA each call is bracketed by CUDA events after a synchronize, so the time is
    the GPU's, not the launch's. On CPU, ``time.perf_counter``. Without ``repeat``, as
    many calls as fit in ``budget_s`` (at least 3, at most 100).
    """
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(device)
    if repeat is None:
        start = time.perf_counter()
        fn()
        _sync(device)
        once = max(time.perf_counter() - start, 1e-6)
        repeat = int(min(100, max(3, budget_s / once)))
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.float16, torch.bfloat16):
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-4, rtol=1e-4)


def compare(impls: dict[str, Callable[[], object]], *, reference: str, flops: float | None = None,
            device: torch.device | str = "cpu", atol: float | None = None, rtol: float | None = None,
            budget_s: float = 0.5) -> list[BenchRow]:
    """Time zero-argument callables and check each output against ``impls[reference]``.

    Args:
        impls: name -> callable returning a tensor (or a tuple whose first item is one).
        reference: the name of the reference implementation (usually torch SDPA).
        flops: FLOPs of one call, to report FLOP/s (None: not reported).
        atol, rtol: agreement required before timing; default by dtype.

    Returns:
        One ``BenchRow`` per implementation, the reference first.

    Raises:
        AssertionError: if an implementation disagrees with the reference.
    """
    if reference not in impls:
        raise ValueError(f"reference {reference!r} is not one of {list(impls)}")
    device = torch.device(device)
    with torch.no_grad():
        expected = _first(impls[reference]())
        tol = _tolerance(expected.dtype)
        tol = dict(atol=atol if atol is not None else tol["atol"], rtol=rtol if rtol is not None else tol["rtol"])
        errors = {}
        for name, fn in impls.items():
            got = _first(fn())
            torch.testing.assert_close(got, expected, **tol,
                                       msg=lambda m, n=name: f"{n} disagrees with {reference}: {m}")
            errors[name] = (got.float() - expected.float()).abs().max().item()
        times = {name: time_fn(fn, device=device, budget_s=budget_s) for name, fn in impls.items()}
    peak = peak_tflops(device, expected.dtype)
    rows = []
    for name in [reference] + [n for n in impls if n != reference]:
        row = BenchRow(name=name, seconds=times[name], flops=flops, ratio=times[name] / times[reference],
                       max_abs_err=errors[name], device=device_name(device),
                       dtype=str(expected.dtype).replace("torch.", ""))
        if peak is not None and row.tflops is not None:
            row.peak_share = row.tflops / peak
        rows.append(row)
    return rows


def compare_attention(impls: dict[str, Callable[..., object]], *, B: int | None = None, H: int | None = None,
                      L: int | None = None, S: int | None = None, D: int | None = None,
                      causal: bool = False, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None, seed: int = 0,
                      budget_s: float = 0.5) -> list[BenchRow]:
    """Compare attention functions ``fn(q, k, v, is_causal=...)`` against torch SDPA.

    Sizes default to ``default_sizes(device)``; q, k, v are (B, H, L|S, D), seeded.
    The reference row is named "torch SDPA".
    """
    device = torch.device(device) if device is not None else best_device()
    sizes = default_sizes(device)
    B, H, L, D = (sizes[n] if x is None else x for n, x in zip("BHLD", (B, H, L, D)))
    S = L if S is None else S
    dtype = sizes["dtype"] if dtype is None else dtype
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen).to(device=device, dtype=dtype) for n in (L, S, S))

    def run_sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    calls = {"torch SDPA": run_sdpa}
    for name, fn in impls.items():
        calls[name] = (lambda fn=fn: fn(q, k, v, is_causal=causal))
    flops = attention_flops(B, H, L, S, D, causal=causal)
    return compare(calls, reference="torch SDPA", flops=flops, device=device, budget_s=budget_s)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(rows: list[BenchRow]) -> str:
    """A readable fixed-width table of rows."""
    if not rows:
        return "(no rows)"
    tera = rows[0].device.startswith("CPU") is False
    rate = "TFLOP/s" if tera else "GFLOP/s"
    header = f"{'implementation':<28} {'time (ms)':>10} {rate:>9} {'% peak':>7} {'vs ref':>8} {'max |err|':>10}"
    lines = [f"device: {rows[0].device}, dtype: {rows[0].dtype}, reference (first row): {rows[0].name}",
             header, "-" * len(header)]
    for r in rows:
        flops = r.tflops if tera else r.gflops
        share = None if r.peak_share is None else 100 * r.peak_share
        lines.append(f"{r.name:<28} {r.ms:>10.3f} {_fmt(flops, '.1f'):>9} {_fmt(share, '.1f'):>7} "
                     f"{r.ratio:>7.2f}x {r.max_abs_err:>10.2e}")
    return "\n".join(lines)


def print_table(rows: list[BenchRow]) -> None:
    print(format_table(rows))


def plot_rows(rows: list[BenchRow], ax=None, title: str | None = None):
    """Horizontal bar chart of time per implementation (ms), reference first."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(rows)))
    names = [r.name for r in rows][::-1]
    ms = [r.ms for r in rows][::-1]
    bars = ax.barh(names, ms, color="#0072B2")
    for bar, r in zip(bars, rows[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.ratio:.2f}x",
                va="center", fontsize=9)
    ax.set_xlabel("time per call (ms), lower is better")
    ax.set_title(title or f"{rows[0].device}, {rows[0].dtype}")
    ax.margins(x=0.15)
    return ax
