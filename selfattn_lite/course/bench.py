"""Timing helper behind every notebook's last cell.

Each notebook compares what it taught against torch's fused
``scaled_dot_product_attention`` (SDPA) on the best device present:

* CUDA: bfloat16, realistic sizes, achieved TFLOP/s and the share of the device's peak when
  the device is known (``DEVICE_SPECS``, matched by its exact name), and the SDPA backend
  each row ran (``sdpa_backends``).
* CPU: float32, small sizes so that a whole timing cell stays under 10 s.

Every row is checked against the reference output before any time is reported: a fast
wrong answer is never printed. The agreement required is stated in units in the last
place (ulps) of the output's magnitude, per dtype (``tolerance``, ``assert_close_ulps``),
so one bound serves float32 on a CPU and bfloat16 on a GPU.

Timing (``time_stats``): the first call is timed on its own (it pays for allocation,
autotuning, lazy initialisation), then a few warm-up calls, then ``repeat`` samples of
``number`` back-to-back calls each, read with ``torch.utils.benchmark``'s clock: on a GPU it
synchronizes the device before reading the time, once at each end of a sample (never between
calls), so queued kernels are counted and launch gaps overlap with the GPU's work as they do
in a real program. A row reports the median over samples, the minimum, and the spread (max - min).
The device is inferred from the tensors a call returns.

FLOPs (``attention_flops``) count the multiply-adds a kernel actually performs, one multiply-add
= 2 FLOPs (as torch's ``FlopCounterMode`` counts); the GFLOP/s and TFLOP/s columns are FLOPs per
second in that unit; a row's
``compute_dtype`` is the dtype its matmuls run in (explicit attention upcasts bf16 to
float32), and its share of peak is taken against that dtype's peak.
"""

from __future__ import annotations

import math
import statistics
import timeit
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._checks import check_int, check_positive_int
from ..attention import upcast_dtype  # noqa: F401  (bench.upcast_dtype: the timing cells' name for it)

__all__ = [
    "BenchRow",
    "first_output",
    "Timing",
    "DeviceSpec",
    "DEVICE_SPECS",
    "DEFAULT_ULPS",
    "MAX_FUSED_HEAD_DIM",
    "attention_flops",
    "best_device",
    "infer_device",
    "default_sizes",
    "device_name",
    "device_spec",
    "peak_tflops",
    "peak_bandwidth_gbs",
    "describe_peak",
    "max_head_dim",
    "check_head_dim",
    "upcast_dtype",
    "ulp",
    "tolerance",
    "error_ulps",
    "assert_close_ulps",
    "sdpa_backends",
    "randn",
    "time_stats",
    "time_fn",
    "compare",
    "compare_attention",
    "format_table",
    "print_table",
    "plot_rows",
]


# ---------------------------------------------------------------------------------------------
# Devices and their published peaks
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceSpec:
    """Published figures of one GPU: dense bf16/fp16 tensor-core TFLOP/s, memory GB/s, source."""

    bf16_tflops: float
    memory_gbs: float
    source: str


# Keyed by the exact string torch.cuda.get_device_name() returns. Dense figures (NVIDIA's data
# sheets print bf16 "with sparsity", twice the dense rate; the sparse figure is halved here).
# A device that is not listed (for example "NVIDIA H200 NVL", whose data-sheet figures could not
# be checked for this table) reports "unknown peak": `make gpu-report` measures the peak instead.
DEVICE_SPECS: dict[str, DeviceSpec] = {
    # NVIDIA H200 data sheet, H200 SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity; 4.8 TB/s HBM3e.
    "NVIDIA H200": DeviceSpec(989.4, 4800.0, "NVIDIA H200 data sheet (SXM): 1,979 sparse / 2 TFLOP/s, 4.8 TB/s"),
    # NVIDIA H100 data sheet, SXM column (reported as "NVIDIA H100 80GB HBM3"): 1,979 sparse; 3,350 GB/s.
    "NVIDIA H100 80GB HBM3": DeviceSpec(989.4, 3350.0,
                                        "NVIDIA H100 data sheet (SXM): 1,979 sparse / 2 TFLOP/s, 3.35 TB/s"),
    # NVIDIA H100 data sheet, PCIe column: 1,513 sparse; 2,000 GB/s.
    "NVIDIA H100 PCIe": DeviceSpec(756.5, 2000.0, "NVIDIA H100 data sheet (PCIe): 1,513 sparse / 2 TFLOP/s, 2 TB/s"),
    # NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS dense (624 sparse); 80GB SXM 2,039 GB/s, 40GB 1,555 GB/s.
    "NVIDIA A100-SXM4-80GB": DeviceSpec(312.0, 2039.0, "NVIDIA A100 data sheet (80GB SXM): 312 TFLOP/s, 2,039 GB/s"),
    "NVIDIA A100-SXM4-40GB": DeviceSpec(312.0, 1555.0, "NVIDIA A100 data sheet (40GB SXM): 312 TFLOP/s, 1,555 GB/s"),
    # NVIDIA L40S data sheet: BF16 Tensor Core 362.05 TFLOPS dense (733 sparse); 864 GB/s GDDR6.
    "NVIDIA L40S": DeviceSpec(362.05, 864.0, "NVIDIA L40S data sheet: 362.05 TFLOP/s, 864 GB/s"),
}

# torch's flash kernel takes head sizes up to 256 (its cuDNN kernel: 128, or 256 on Hopper with cuDNN >= 9.10;
# the memory-efficient kernel has no upper bound, only an alignment rule: aten/src/ATen/native/transformers/
# cuda/sdp_utils.cpp). A wider head pushes SDPA off the flash kernel, so a timing would compare kernels.
MAX_FUSED_HEAD_DIM = 256


def best_device() -> torch.device:
    """CUDA if present, else CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def infer_device(*objs) -> torch.device | None:
    """The device of the first tensor found in ``objs`` (tensors, tuples, lists, dicts), else None."""
    for t in _tensors(objs):
        return t.device
    return None


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def device_spec(device: torch.device | str) -> DeviceSpec | None:
    """The published figures of a CUDA device, matched by its exact name; None if unknown or not CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return DEVICE_SPECS.get(torch.cuda.get_device_name(device))


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Dense bf16/fp16 tensor-core peak of a listed GPU (exact name), else None (CPUs, float32: None)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    spec = device_spec(device)
    return None if spec is None else spec.bf16_tflops


def peak_bandwidth_gbs(device: torch.device | str) -> float | None:
    """Published memory bandwidth (GB/s) of a listed GPU, else None."""
    spec = device_spec(device)
    return None if spec is None else spec.memory_gbs


def describe_peak(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> str:
    """One line: the peak a row's share is measured against and its source, or "unknown peak"."""
    device = torch.device(device)
    if device.type != "cuda":
        return "no peak (CPU)"
    peak = peak_tflops(device, dtype)
    if peak is None:
        return f"unknown peak ({torch.cuda.get_device_name(device)}, {str(dtype).replace('torch.', '')})"
    return f"peak {peak:g} TFLOP/s ({device_spec(device).source})"


def max_head_dim(device: torch.device | str) -> int | None:
    """The widest head a timing should use on ``device``: 256 on CUDA (the flash kernel's cap), None on CPU."""
    return MAX_FUSED_HEAD_DIM if torch.device(device).type == "cuda" else None


def check_head_dim(D: int, device: torch.device | str) -> None:
    """Raise ValueError if a head of width D would push CUDA SDPA off its fused kernels."""
    cap = max_head_dim(device)
    if cap is not None and D > cap:
        raise ValueError(f"head size D={D} > {cap}: on CUDA torch's flash and cuDNN kernels take heads up to "
                         f"{cap} wide; a wider head falls back to another SDPA backend. Use more, narrower heads.")


def default_sizes(device: torch.device | str | None = None) -> dict:
    """Attention sizes for a timing cell: realistic on CUDA, small on CPU."""
    device = torch.device(device) if device is not None else best_device()
    if device.type == "cuda":
        # the explicit path materialises (B, H, L, S) float32 scores: 2 GiB at these sizes
        return dict(B=2, H=16, L=4096, S=4096, D=128, dtype=torch.bfloat16)
    return dict(B=1, H=8, L=512, S=512, D=64, dtype=torch.float32)


def randn(*shape: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
          generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """Standard-normal tensor drawn on ``device`` itself (no host copy of a large tensor).

    Seeded with ``seed`` (a generator on that device) or ``generator``. The numbers differ
    between devices for the same seed: use it for timing inputs, not for printed values.
    """
    device = torch.device(device)
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=generator, device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------

def attention_flops(B: int, H: int, L: int, S: int, D: int, *, is_causal: bool = False) -> float:
    """Forward FLOPs of attention: two matmuls (QK^T and PV) of 2*L*S*D each, per head.

    4 * B * H * L * S * D. ``is_causal=True`` halves it: the count for a kernel that *skips*
    the masked half (torch's fused SDPA with ``is_causal=True``, the tiled kernel). A row that
    computes every score and then masks it (explicit attention, SDPA with a boolean mask)
    does the full count whatever the mask: pass ``is_causal=False`` for it.
    """
    flops = 4.0 * B * H * L * S * D
    return flops / 2 if is_causal else flops


# ---------------------------------------------------------------------------------------------
# Tolerances in ulps
# ---------------------------------------------------------------------------------------------

# Default agreement, in ulps of the output's magnitude. Half precision: explicit attention rounds
# once from float32 (0.5 ulp), fused kernels also round P to bf16/fp16 before P @ V (about 1 ulp);
# 8 leaves room without hiding a real bug (a wrong mask moves outputs by many hundreds of ulps).
# float32: different summation orders over S keys (measured: under 10 ulps at S = 512).
DEFAULT_ULPS = {torch.bfloat16: 8.0, torch.float16: 8.0, torch.float32: 256.0, torch.float64: 256.0}


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """The spacing of ``dtype``'s numbers at ``magnitude``: eps * 2^floor(log2 |magnitude|).

    bf16 has 8 significant bits (eps = 2^-7): ulp(bf16, 3.6) = 2^1 * 2^-7 = 0.0156.
    """
    info = torch.finfo(dtype)
    magnitude = max(abs(float(magnitude)), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(magnitude))


def tolerance(dtype: torch.dtype, magnitude: float, ulps: float | None = None) -> dict:
    """``assert_close`` arguments allowing ``ulps`` ulps of ``dtype`` at the output's magnitude.

    Returns:
        dict(atol=ulps * ulp(dtype, magnitude), rtol=0.0). ``ulps`` defaults to ``DEFAULT_ULPS[dtype]``.
    """
    ulps = DEFAULT_ULPS.get(dtype, 256.0) if ulps is None else ulps
    return dict(atol=ulps * ulp(dtype, magnitude), rtol=0.0)


def _magnitude(expected: torch.Tensor) -> float:
    finite = expected[torch.isfinite(expected)]
    return finite.abs().max().item() if finite.numel() else 1.0


def error_ulps(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """max |actual - expected| in ulps of ``dtype`` (default: actual's) at expected's magnitude."""
    dtype = actual.dtype if dtype is None else dtype
    err = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    return err / ulp(dtype, _magnitude(expected))


def assert_close_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: float | None = None, *,
                      dtype: torch.dtype | None = None, msg: str | None = None) -> float:
    """Assert max |actual - expected| <= ulps ulps of ``dtype`` at max |expected|; return the error in ulps.

    Args:
        actual, expected: same shape; expected may be a higher-precision reference.
        ulps: allowed error; default ``DEFAULT_ULPS[dtype]``.
        dtype: whose ulps (default actual.dtype).

    Raises:
        AssertionError: naming the error, the bound and both in ulps.
    """
    dtype = actual.dtype if dtype is None else dtype
    tol = tolerance(dtype, _magnitude(expected), ulps)
    prefix = f"{msg}: " if msg else ""
    torch.testing.assert_close(actual.to(expected.dtype), expected, **tol, check_dtype=False,
                               msg=lambda m: f"{prefix}{m}\n(bound: {tol['atol']:.3g} = "
                                             f"{tol['atol'] / ulp(dtype, _magnitude(expected)):g} ulps of "
                                             f"{str(dtype).replace('torch.', '')} at {_magnitude(expected):.3g})")
    return error_ulps(actual, expected, dtype)


# ---------------------------------------------------------------------------------------------
# Which SDPA backend ran
# ---------------------------------------------------------------------------------------------

# The aten op torch's scaled_dot_product_attention dispatches to, by backend (names from the
# profiler's record of aten ops; the same on every device).
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math (MPS)",
}


def sdpa_backends(fn: Callable[[], object], *, grad: bool = False) -> list[str]:
    """The SDPA backends one call of ``fn()`` ran, in order of first use ([] if it called no SDPA).

    Runs ``fn`` once under ``torch.profiler`` (CPU activity: the aten ops are recorded on the
    host for every device) and reads the fused op each ``scaled_dot_product_attention`` became.
    Under ``torch.no_grad()``, unless ``grad``: a forward that records a graph for a backward
    may pick another backend (not every fused kernel has a backward for every input).
    """
    from contextlib import nullcontext

    from torch.profiler import ProfilerActivity, profile

    from .memory import quiet_stderr

    with nullcontext() if grad else torch.no_grad(), quiet_stderr(), \
            profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    found = []
    for event in prof.events():
        backend = SDPA_OPS.get(event.name)
        if backend is not None and backend not in found:
            found.append(backend)
    return found


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

@dataclass
class Timing:
    """Seconds per call of one function: ``samples`` of ``number`` back-to-back calls each."""

    samples: list[float]
    number: int
    first: float
    device: str

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def spread(self) -> float:
        """max - min over the samples, seconds per call."""
        return max(self.samples) - min(self.samples)


def _synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (torch.accelerator where torch has it, >= 2.6)."""
    accelerator = getattr(torch, "accelerator", None)
    if hasattr(accelerator, "synchronize"):
        accelerator.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()
    else:
        torch.cuda.synchronize()


def _clock(device: torch.device | None) -> Callable[[], float]:
    """The clock a timing reads: on an accelerator, synchronize the device, then read ``timeit``'s
    clock (what ``torch.utils.benchmark.timer`` does; written out because importing
    ``torch.utils.benchmark`` needs setuptools, which a bare GPU machine's Python may lack); for CPU
    work, the plain ``timeit`` clock (as torch's docs advise: nothing to wait for).
    Device unknown: synchronize a GPU only if one is in use."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    if device is None or device.type in ("cpu", "meta"):
        return timeit.default_timer

    def clock() -> float:
        _synchronize(device)
        return timeit.default_timer()

    return clock


def time_stats(fn: Callable[[], object], *, device: torch.device | str | None = None, warmup: int = 2,
               repeat: int | None = None, number: int | None = None, budget_s: float = 0.5) -> Timing:
    """Time ``fn()``: its first call apart, then ``repeat`` samples of ``number`` back-to-back calls.

    Args:
        fn: zero-argument callable.
        device: where it runs; None: the device of the tensors the first call returns (CPU if
            none; if CUDA is initialised and no tensor says otherwise, CUDA is synchronised).
        warmup: calls after the first, untimed.
        repeat: samples (default 5).
        number: calls per sample; default as many as fit ``budget_s / repeat`` (1 to 1000).
            ``fn`` runs exactly 1 + warmup + repeat * number times (ranks that communicate in
            ``fn`` rely on it).
        budget_s: time to spend on the samples.

    Returns:
        ``Timing``: per-call seconds of each sample (on a GPU: one synchronize at each end of a
        sample), the first call's seconds, the number per sample.
    """
    warmup = check_int("warmup", warmup)
    repeat = 5 if repeat is None else check_positive_int("repeat", repeat)
    device = torch.device(device) if device is not None else None
    # The first call, on its own: benchmark.Timer always warms up before it measures, so it
    # cannot time a cold call. Two clock reads (synchronizing where the work runs) around it.
    start = _clock(device)()
    out = fn()
    if device is None:
        device = infer_device(out)
    clock = _clock(device)
    first = clock() - start
    del out
    # The samples: what benchmark.Timer runs inside (timeit.Timer with torch's clock; garbage
    # collection paused while timing), called directly because Timer.timeit adds max(number // 100, 2)
    # warm-up calls before every sample (number=1 would make three calls a sample; ranks running
    # collective ops need exact counts) and sets torch's thread count to its own (default 1).
    timer = timeit.Timer(fn, timer=clock)
    once = max(timer.timeit(warmup) / warmup if warmup else first, 1e-7)
    if number is None:
        number = int(min(1000, max(1, budget_s / repeat / once)))
    number = check_positive_int("number", number)
    samples = [total / number for total in timer.repeat(repeat, number)]
    return Timing(samples=samples, number=number, first=first, device=str(device) if device else "cpu")


def time_fn(fn: Callable[[], object], *, device: torch.device | str | None = None,
            warmup: int = 2, repeat: int | None = None, budget_s: float = 0.5, number: int | None = None) -> float:
    """Median seconds per call of ``fn()`` (see ``time_stats`` for the method and arguments)."""
    return time_stats(fn, device=device, warmup=warmup, repeat=repeat, number=number, budget_s=budget_s).median


# ---------------------------------------------------------------------------------------------
# Comparing implementations
# ---------------------------------------------------------------------------------------------

@dataclass
class BenchRow:
    """One timed implementation. ``ratio`` is time / reference time (1.0 for the reference).

    ``dtype`` is the tensors' dtype, ``compute_dtype`` the dtype the row's matmuls run in (the
    label shows both when they differ); ``peak_share`` is against the compute dtype's peak.
    ``err_ulps``: max |error| vs the reference in ulps of ``dtype`` at the reference's magnitude.
    ``backend``: the SDPA backend(s) the row ran (recorded on CUDA), "" if none.
    """

    name: str
    seconds: float
    flops: float | None
    ratio: float
    max_abs_err: float
    device: str
    dtype: str
    peak_share: float | None = None
    compute_dtype: str | None = None
    err_ulps: float | None = None
    backend: str | None = None
    min_seconds: float | None = None
    spread_seconds: float | None = None
    first_seconds: float | None = None

    @property
    def ms(self) -> float:
        return self.seconds * 1e3

    @property
    def tflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.seconds / 1e12

    @property
    def gflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.seconds / 1e9

    @property
    def precision(self) -> str:
        """"bfloat16", or "bfloat16 -> float32" when the row computes in another dtype."""
        compute = self.compute_dtype or self.dtype
        return self.dtype if compute == self.dtype else f"{self.dtype} -> {compute}"

    @property
    def label(self) -> str:
        """The name with the compute dtype: "explicit [bfloat16 -> float32]"."""
        return f"{self.name} [{self.precision}]"


def first_output(out):
    """The output of an attention call: ``out`` itself, or ``out[0]`` of an (output, weights) pair."""
    return out[0] if isinstance(out, (tuple, list)) else out




def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tolerance(dtype: torch.dtype, magnitude: float = 1.0) -> dict:
    return tolerance(dtype, magnitude)


def compare(impls: dict[str, Callable[[], object]], *, reference: str,
            flops: float | dict[str, float | None] | None = None,
            device: torch.device | str | None = None, atol: float | None = None, rtol: float | None = None,
            budget_s: float = 0.5, ulps: float | None = None,
            compute_dtypes: dict[str, torch.dtype] | None = None,
            record_backend: bool | None = None) -> list[BenchRow]:
    """Time zero-argument callables and check each output against ``impls[reference]``.

    Args:
        impls: name -> callable returning a tensor (or a tuple whose first item is one).
        reference: the name of the reference implementation (usually torch SDPA).
        flops: FLOPs of one call (all rows), or name -> FLOPs per row (missing: not reported).
        device: where they run; None: inferred from the reference's output.
        atol, rtol: agreement required before timing; default ``tolerance(dtype, max |ref|, ulps)``.
        ulps: the default bound in ulps (``DEFAULT_ULPS[dtype]`` when None).
        compute_dtypes: name -> dtype a row's matmuls run in, when not the output's dtype
            (e.g. float32 for explicit attention on bf16 inputs); used for the label and the peak.
        record_backend: record the SDPA backend per row (default: on CUDA only; it costs one
            profiled call per row).

    Returns:
        One ``BenchRow`` per implementation, the reference first.

    Raises:
        AssertionError: if an implementation disagrees with the reference.
    """
    if reference not in impls:
        raise ValueError(f"reference {reference!r} is not one of {list(impls)}")
    compute_dtypes = compute_dtypes or {}
    unknown = set(compute_dtypes) - set(impls)
    if unknown:
        raise ValueError(f"compute_dtypes names {sorted(unknown)}, not among {list(impls)}")
    with torch.no_grad():
        expected = first_output(impls[reference]())
        device = torch.device(device) if device is not None else expected.device
        floating = expected.is_floating_point()
        tol = tolerance(expected.dtype, _magnitude(expected), ulps) if floating else dict(atol=0.0, rtol=0.0)
        tol = dict(atol=atol if atol is not None else tol["atol"], rtol=rtol if rtol is not None else tol["rtol"])
        errors, err_ulps = {}, {}
        for name, fn in impls.items():
            got = first_output(fn())
            torch.testing.assert_close(got, expected, **tol,
                                       msg=lambda m, n=name: f"{n} disagrees with {reference}: {m}")
            errors[name] = (got.float() - expected.float()).abs().max().item()
            err_ulps[name] = error_ulps(got, expected, expected.dtype) if floating else None
        del got
        timings = {name: time_stats(fn, device=device, budget_s=budget_s) for name, fn in impls.items()}
    if record_backend is None:
        record_backend = device.type == "cuda"
    backends = {name: ", ".join(sdpa_backends(fn)) for name, fn in impls.items()} if record_backend else {}
    rows = []
    for name in [reference] + [n for n in impls if n != reference]:
        t = timings[name]
        row_flops = flops.get(name) if isinstance(flops, dict) else flops
        compute = compute_dtypes.get(name, expected.dtype)
        row = BenchRow(name=name, seconds=t.median, flops=row_flops, ratio=t.median / timings[reference].median,
                       max_abs_err=errors[name], device=device_name(device), dtype=_dtype_name(expected.dtype),
                       compute_dtype=_dtype_name(compute), err_ulps=err_ulps[name], backend=backends.get(name),
                       min_seconds=t.min, spread_seconds=t.spread, first_seconds=t.first)
        peak = peak_tflops(device, compute)
        if peak is not None and row.tflops is not None:
            row.peak_share = row.tflops / peak
        rows.append(row)
    return rows


def compare_attention(impls: dict[str, Callable[..., object]], *, B: int | None = None, H: int | None = None,
                      L: int | None = None, S: int | None = None, D: int | None = None,
                      is_causal: bool = False, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None, seed: int = 0,
                      budget_s: float = 0.5, skips_masked: Collection[str] = (),
                      compute_dtypes: dict[str, torch.dtype] | None = None,
                      ulps: float | None = None) -> list[BenchRow]:
    """Compare attention functions ``fn(q, k, v, is_causal=...)`` against torch SDPA.

    Sizes default to ``default_sizes(device)``; q, k, v are (B, H, L|S, D), seeded, drawn on
    the device. The reference row is named "torch SDPA". FLOPs per row: with ``is_causal``, torch
    SDPA and the rows named in ``skips_masked`` get the halved count (they skip the masked
    half), every other row the full count (it computes every score, then masks).
    On CUDA the head size must be at most ``MAX_FUSED_HEAD_DIM``.
    """
    device = torch.device(device) if device is not None else best_device()
    sizes = default_sizes(device)
    B, H, L, D = (sizes[n] if x is None else x for n, x in zip("BHLD", (B, H, L, D)))
    S = L if S is None else S
    dtype = sizes["dtype"] if dtype is None else dtype
    check_head_dim(D, device)
    unknown = set(skips_masked) - set(impls)
    if unknown:
        raise ValueError(f"skips_masked names {sorted(unknown)}, not among {list(impls)}")
    if device.type == "cpu":        # the CPU generator: the same numbers as before on every CPU
        gen = torch.Generator(device="cpu").manual_seed(seed)
        q, k, v = (torch.randn(B, H, n, D, generator=gen).to(dtype=dtype) for n in (L, S, S))
    else:                           # drawn on the device: no large host tensor, no copy
        gen = torch.Generator(device=device).manual_seed(seed)
        q, k, v = (randn(B, H, n, D, device=device, dtype=dtype, generator=gen) for n in (L, S, S))

    def run_sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    calls = {"torch SDPA": run_sdpa}
    for name, fn in impls.items():
        calls[name] = (lambda fn=fn: fn(q, k, v, is_causal=is_causal))
    full, halved = attention_flops(B, H, L, S, D), attention_flops(B, H, L, S, D, is_causal=is_causal)
    flops = {name: halved if name == "torch SDPA" or name in skips_masked else full for name in calls}
    return compare(calls, reference="torch SDPA", flops=flops, device=device, budget_s=budget_s,
                   compute_dtypes=compute_dtypes, ulps=ulps)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(rows: list[BenchRow]) -> str:
    """A readable fixed-width table of rows: median time, min, spread, rate, share of peak, error in ulps."""
    if not rows:
        return "(no rows)"
    tera = rows[0].device.startswith("CPU") is False
    rate = "TFLOP/s" if tera else "GFLOP/s"
    spec = DEVICE_SPECS.get(rows[0].device)
    peak = "" if not tera else (f", peak {spec.bf16_tflops:g} TFLOP/s bf16 ({spec.source})" if spec
                                else ", unknown peak (device not in bench.DEVICE_SPECS)")
    backends = any(r.backend for r in rows)
    w = max(28, *(len(r.name) for r in rows))
    header = (f"{'implementation':<{w}} {'precision':<20} {'median ms':>10} {'min ms':>9} {'spread':>7} "
              f"{rate:>8} {'% peak':>7} {'vs ref':>7} {'err ulps':>8}" + ("  SDPA backend" if backends else ""))
    lines = [f"device: {rows[0].device}{peak}; reference (first row): {rows[0].name}", header, "-" * len(header)]
    for r in rows:
        flops = r.tflops if tera else r.gflops
        share = None if r.peak_share is None else 100 * r.peak_share
        spread = None if r.spread_seconds is None else 100 * r.spread_seconds / r.seconds
        min_ms = None if r.min_seconds is None else 1e3 * r.min_seconds
        line = (f"{r.name:<{w}} {r.precision:<20} {r.ms:>10.3f} {_fmt(min_ms, '.3f'):>9} "
                f"{_fmt(spread, '.0f') + ('%' if spread is not None else ''):>7} {_fmt(flops, '.1f'):>8} "
                f"{_fmt(share, '.1f'):>7} {r.ratio:>6.2f}x {_fmt(r.err_ulps, '.1f'):>8}")
        if backends:
            line += f"  {r.backend or '-'}"
        lines.append(line)
    return "\n".join(lines)


def print_table(rows: list[BenchRow]) -> None:
    print(format_table(rows))


def plot_rows(rows: list[BenchRow], ax=None, title: str | None = None):
    """Horizontal bar chart of time per implementation (ms), reference first."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(rows)))
    names = [r.name if r.precision == r.dtype else r.label for r in rows][::-1]
    ms = [r.ms for r in rows][::-1]
    bars = ax.barh(names, ms, color="#0072B2")
    for bar, r in zip(bars, rows[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.ratio:.2f}x",
                va="center", fontsize=9)
    ax.set_xlabel("time per call (ms), lower is better")
    ax.set_title(title or f"{rows[0].device}, {rows[0].dtype}")
    ax.margins(x=0.15)
    return ax
