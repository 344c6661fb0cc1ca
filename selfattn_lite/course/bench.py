"""Timing helper behind every notebook's last cell.

Each notebook compares what it taught against torch's fused
``scaled_dot_product_attention`` (SDPA) on the best device present:

* where, in which dtype and at which sizes: ``timing.timing_setup(notebook)`` decides (CUDA:
  bfloat16 from compute capability 8.0, float16 below, sizes that fit the device's memory; a CPU,
  also on a Mac: float32, small sizes so that a whole timing cell stays under 10 s);
* every table names the device, the dtype and the SDPA backend that ran (``sdpa_backends``), and
  on a GPU the achieved TFLOP/s and the share of the device's published peak (``DEVICE_SPECS``,
  matched by name with ``spec_key``).

Every row is checked against the reference output before any time is reported: a fast
wrong answer is never printed. The agreement required is stated in units in the last
place (ulps) of the output's magnitude, per dtype (``tolerance``, ``assert_close_ulps``),
so one bound serves float32 on a CPU and bfloat16 on a GPU.

Timing (``time_stats``): the first call is timed on its own (it pays for allocation,
autotuning, lazy initialisation), then a few warm-up calls, then ``repeat`` samples of
``number`` back-to-back calls each, read with ``torch.utils.benchmark``'s clock: on a GPU it
synchronizes the device before reading the time, once at each end of a sample (never between
calls), so queued kernels are counted and launch gaps overlap with the GPU's work as they do
in a real program. A row reports the median over samples and their range (min-max).
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
    "spec_key",
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
    """Published dense figures of one GPU, and the data sheet they come from.

    ``bf16_tflops``: bf16 tensor-core TFLOP/s with float32 accumulation, without sparsity (None where the
    GPU has no bf16 tensor cores, the T4); ``fp16_tflops``: the same for float16 (default: the bf16 rate);
    ``fp32_tflops``: plain float32 (CUDA cores, no TF32); ``memory_gbs``: memory bandwidth in GB/s;
    ``source``: the document's name and URL.
    """

    bf16_tflops: float | None
    memory_gbs: float
    source: str
    fp16_tflops: float | None = None
    fp32_tflops: float | None = None

    @property
    def half_tflops(self) -> float | None:
        """The float16 tensor-core rate (the bf16 rate where the sheet gives one figure for both)."""
        return self.fp16_tflops if self.fp16_tflops is not None else self.bf16_tflops


_H100_SHEET = "NVIDIA H100 Tensor Core GPU data sheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_A100_SHEET = ("NVIDIA A100 Tensor Core GPU data sheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
               "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")

# Keyed by the name torch.cuda.get_device_name() returns on each GPU; other spellings of the same part are matched
# by ``device_spec`` (``_SPEC_RULES``). Dense figures: the data sheets print tensor-core rates "with sparsity",
# twice the dense rate, for the A100 and later; the dense figure is given here (sparse / 2). The GeForce
# whitepapers give the rate with float32 accumulation (what torch's matmuls use) apart from float16 accumulation.
DEVICE_SPECS: dict[str, DeviceSpec] = {
    # T4 data sheet: Mixed Precision (FP16/FP32) 65 TFLOPS, Single-Precision 8.1 TFLOPS, 320+ GB/s; no bf16.
    "Tesla T4": DeviceSpec(None, 320.0, "NVIDIA T4 Tensor Core GPU data sheet, https://www.nvidia.com/content/"
                           "dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
                           fp16_tflops=65.0, fp32_tflops=8.1),
    # L4 data sheet: BF16/FP16 Tensor Core 242 TFLOPS with sparsity; FP32 30.3 TFLOPS; 300 GB/s.
    "NVIDIA L4": DeviceSpec(121.0, 300.0, "NVIDIA L4 Tensor Core GPU data sheet, "
                            "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
                            fp32_tflops=30.3),
    # NVIDIA publishes no A10G data sheet (AWS's part); its figures as compared with the A10's data sheet:
    # BF16/FP16 tensor 70 TFLOPS dense, FP32 35 TFLOPS, 600 GB/s.
    "NVIDIA A10G": DeviceSpec(70.0, 600.0, "no NVIDIA data sheet; Baseten, 'NVIDIA A10 vs A10G for ML model "
                              "inference', https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
                              fp32_tflops=35.0),
    # A100 data sheet: BF16 Tensor Core 312 TFLOPS dense (624 sparse), FP32 19.5 TFLOPS; 40GB 1,555 GB/s,
    # 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s.
    "NVIDIA A100-PCIE-40GB": DeviceSpec(312.0, 1555.0, _A100_SHEET + " (40GB PCIe)", fp32_tflops=19.5),
    "NVIDIA A100-SXM4-40GB": DeviceSpec(312.0, 1555.0, _A100_SHEET + " (40GB SXM)", fp32_tflops=19.5),
    "NVIDIA A100 80GB PCIe": DeviceSpec(312.0, 1935.0, _A100_SHEET + " (80GB PCIe)", fp32_tflops=19.5),
    "NVIDIA A100-SXM4-80GB": DeviceSpec(312.0, 2039.0, _A100_SHEET + " (80GB SXM)", fp32_tflops=19.5),
    # GA102 whitepaper, RTX 3090: Peak FP16/BF16 Tensor TFLOPS with FP32 Accumulate 71 (142 sparse); FP32 35.6;
    # 936 GB/s.
    "NVIDIA GeForce RTX 3090": DeviceSpec(71.0, 936.0, "NVIDIA Ampere GA102 GPU Architecture whitepaper, https://www."
                                          "nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
                                          fp32_tflops=35.6),
    # Ada whitepaper, RTX 4090: Peak FP16/BF16 Tensor TFLOPS with FP32 Accumulate 165.2 (330.4 sparse); FP32 82.6;
    # 1,008 GB/s.
    "NVIDIA GeForce RTX 4090": DeviceSpec(165.2, 1008.0, "NVIDIA Ada GPU Architecture whitepaper, https://images.nvidia"
                                          ".com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
                                          fp32_tflops=82.6),
    # L40S data sheet: BF16 Tensor Core 362.05 TFLOPS dense (733 sparse); FP32 91.6; 864 GB/s.
    "NVIDIA L40S": DeviceSpec(362.05, 864.0, "NVIDIA L40S data sheet, https://resources.nvidia.com/en-us-l40s/"
                              "l40s-datasheet-28413", fp32_tflops=91.6),
    # H100 data sheet: BF16 Tensor Core 1,979 (SXM) / 1,513 (PCIe) / 1,671 (NVL) TFLOPS with sparsity; FP32 67 / 51 /
    # 60 TFLOPS; 3.35 / 2 / 3.9 TB/s. The SXM part reports itself as "NVIDIA H100 80GB HBM3".
    "NVIDIA H100 80GB HBM3": DeviceSpec(989.4, 3350.0, _H100_SHEET + " (SXM)", fp32_tflops=67.0),
    "NVIDIA H100 PCIe": DeviceSpec(756.5, 2000.0, _H100_SHEET + " (PCIe)", fp32_tflops=51.0),
    "NVIDIA H100 NVL": DeviceSpec(835.5, 3900.0, _H100_SHEET + " (NVL)", fp32_tflops=60.0),
    # H200 data sheet, H200 SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity; FP32 67 TFLOPS; 4.8 TB/s.
    # (The H200 NVL, "NVIDIA H200 NVL", is another part: not listed, so its peak reads as unknown.)
    "NVIDIA H200": DeviceSpec(989.4, 4800.0, "NVIDIA H200 Tensor Core GPU data sheet, "
                              "https://www.nvidia.com/en-us/data-center/h200/ (SXM)", fp32_tflops=67.0),
}


def _tokens(name: str) -> list[str]:
    """A device name's words, lower case, without the vendor and brand words: "NVIDIA A100-SXM4-80GB" ->
    ["a100", "sxm4", "80gb"]."""
    import re

    words = re.split(r"[\s\-_]+", name.lower())
    return [w for w in words if w and w not in ("nvidia", "tesla", "geforce")]


def spec_key(name: str) -> str | None:
    """The ``DEVICE_SPECS`` key of a device name as torch reports it, matched by its words, or None.

    "NVIDIA A100-SXM4-80GB" and "A100 SXM 80GB" match the same part; a variant with other figures
    ("RTX 3090 Ti", "H200 NVL", "RTX 4090 D") does not match the base part.
    """
    if name in DEVICE_SPECS:
        return name
    words = _tokens(name)
    w = set(words)
    memory = next((x for x in words if x.endswith("gb")), "")
    if w == {"t4"}:
        return "Tesla T4"
    if w == {"l4"}:
        return "NVIDIA L4"
    if w == {"l40s"}:
        return "NVIDIA L40S"
    if w == {"a10g"}:
        return "NVIDIA A10G"
    if "a100" in w and w <= {"a100", "sxm", "sxm4", "pcie", "40gb", "80gb"}:
        form = "pcie" if "pcie" in w else "sxm"
        size = "80GB" if memory == "80gb" else "40GB"
        return {("pcie", "40GB"): "NVIDIA A100-PCIE-40GB", ("sxm", "40GB"): "NVIDIA A100-SXM4-40GB",
                ("pcie", "80GB"): "NVIDIA A100 80GB PCIe", ("sxm", "80GB"): "NVIDIA A100-SXM4-80GB"}[(form, size)]
    if w == {"rtx", "3090"}:
        return "NVIDIA GeForce RTX 3090"
    if w == {"rtx", "4090"}:
        return "NVIDIA GeForce RTX 4090"
    if "h100" in w and w <= {"h100", "sxm", "sxm5", "pcie", "nvl", "80gb", "94gb", "hbm3", "hbm2e"}:
        return ("NVIDIA H100 NVL" if "nvl" in w else "NVIDIA H100 PCIe" if "pcie" in w else "NVIDIA H100 80GB HBM3")
    if "h200" in w and w <= {"h200", "sxm", "141gb", "hbm3e"}:
        return "NVIDIA H200"
    return None


# torch's CUDA SDPA checks each backend's head size (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
# flash takes heads up to 256 (check_head_dim_size_flash); cuDNN up to 128, or 256 only on sm_90 / sm_10x with
# a runtime cuDNN newer than 9.22 and cudnn-frontend >= 1.24 (check_cudnn_tensor_shapes); the memory-efficient
# kernel has no upper bound, only an alignment rule. Wider than 256, SDPA leaves flash for the memory-efficient
# kernel, so a timing would compare kernels, not shapes. On sm_90 / sm_10x with a runtime cuDNN newer than 9.15
# SDPA tries cuDNN before flash (check_prefer_cudnn_attention), so heads of 64 and 256 can run different kernels
# unless the backends are pinned (torch.nn.attention.sdpa_kernel).
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
    """The published figures of a CUDA device (its name matched by ``spec_key``); None if unknown or not CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    key = spec_key(torch.cuda.get_device_name(device))
    return None if key is None else DEVICE_SPECS[key]


def _peak_of(spec: DeviceSpec | None, dtype: torch.dtype) -> float | None:
    if spec is None:
        return None
    if dtype == torch.bfloat16:
        return spec.bf16_tflops
    if dtype == torch.float16:
        return spec.half_tflops
    if dtype == torch.float32:
        return spec.fp32_tflops
    return None


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Dense peak of a listed GPU in ``dtype`` (bf16/fp16 tensor cores, or plain float32); None on a CPU or unknown."""
    return _peak_of(device_spec(device), dtype)


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
        raise ValueError(f"head size D={D} > {cap}: on CUDA torch's flash kernel takes heads up to {cap} wide "
                         f"(cuDNN's limit is 128 unless a recent cuDNN on sm_90/sm_10x raises it to 256); a wider "
                         f"head falls back to another SDPA backend. Use more, narrower heads.")


def default_sizes(device: torch.device | str | None = None) -> dict:
    """Attention sizes for a timing cell: notebook 01's plan (``timing.timing_setup("nb01")``).

    On CUDA: the largest of its candidate sizes that fits the device's memory, in bfloat16 from
    compute capability 8.0, float16 below; on a CPU: B=1, H=8, L=S=512, D=64, float32.
    """
    from . import timing

    device = torch.device(device) if device is not None else best_device()
    info = timing.DeviceInfo.probe() if device.type == "cuda" else timing.DeviceInfo("cpu", device_name("cpu"))
    plan = timing.timing_setup("nb01", info)
    sizes = plan.sizes
    return dict(B=sizes["B"], H=sizes["H"], L=sizes["L"], S=sizes.get("S", sizes["L"]), D=sizes["D"],
                dtype=plan.dtype)


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

# The aten op torch's scaled_dot_product_attention dispatches to, by backend: the names the profiler records
# (torch 2.13's ops, ``torch.ops.aten._scaled_dot_product_*``; ``_scaled_dot_product_attention_math`` is the math
# fallback, ``_scaled_dot_product_flash_attention_for_cpu`` the CPU's fused kernel).
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
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
    ``backend``: the SDPA backend(s) the row ran (asked of torch's profiler: ``sdpa_backends``), "" if none.
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
        record_backend: record the SDPA backend per row (default True; it costs one profiled call per row).

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
        record_backend = True
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


def _device_line(rows: list[BenchRow]) -> str:
    """"device: NVIDIA H200, bfloat16; SDPA backend: flash" (on a Mac: why the CPU)."""
    from . import timing

    ref = rows[0]
    line = f"device: {ref.device}, {ref.dtype}"
    if ref.backend:                                  # the reference ran SDPA: which kernel served it
        line += f"; SDPA backend: {ref.backend}"
    if ref.device.startswith("CPU"):
        note = timing.device_note()
        if note:
            line += f"; {note}"
    return line


def format_table(rows: list[BenchRow], *, versus: str | None = None) -> str:
    """The table a timing cell prints: what ran, then per row its median time, min-max, time / the reference's, error.

    The device line names the device, the dtype and the SDPA backend that served the reference row
    (the first); the next line states the ratio's convention (this row's time / the reference's:
    1 = as fast, 2 = twice its time). Columns: implementation, the dtype a row computes in
    (only when some row computes in another), median ms, min-max ms over the samples, the ratio,
    the error against the reference in ulps of the output's dtype at its magnitude (``ulp``,
    defined in notebook 01), and on a GPU TFLOP/s and the share of the device's published peak
    (``DEVICE_SPECS``). A row whose SDPA backend differs from the reference's names it.

    ``versus`` names the ratio column; by default "vs SDPA" when the reference row's name mentions SDPA,
    "vs ref" otherwise. Name it after the reference where that row is more than an SDPA call (notebook 12's
    reference is plain RoPE followed by SDPA, so a bare SDPA row would read as SDPA against itself).
    """
    if not rows:
        return "(no rows)"
    ref = rows[0]
    gpu = not ref.device.startswith("CPU")
    if versus is None:
        versus = "vs SDPA" if "SDPA" in ref.name else "vs ref"
    vw = max(8, len(versus))                                      # the ratio column's width
    lines = [_device_line(rows)]
    convention = (f"{versus} = this row's time / {ref.name}'s (1 = as fast, 2 = twice the time); "
                  f"err = max |this row - {ref.name}| in {ref.dtype} ulps")
    lines.append(convention)
    if gpu:
        key = spec_key(ref.device)
        spec = DEVICE_SPECS.get(key) if key else None
        if spec is None:
            lines.append("% peak: unknown peak (device not in bench.DEVICE_SPECS)")
        else:
            lines.append(f"% peak: of the dense peak of the row's dtype ({spec.source})")
    precision = any(r.precision != r.dtype for r in rows)
    backends = any(r.backend and r.backend != ref.backend for r in rows[1:])   # another kernel served a row
    w = max(24, *(len(r.name) for r in rows))
    header = f"{'implementation':<{w}} "
    if precision:
        header += f"{'computes in':<20} "
    header += f"{'median ms':>10} {'min-max ms':>17} {versus:>{vw}} {'err (ulps)':>10}"
    if gpu:
        header += f" {'TFLOP/s':>8} {'% peak':>7}"
    if backends:
        header += "  SDPA backend"
    lines += [header, "-" * len(header)]
    for r in rows:
        line = f"{r.name:<{w}} "
        if precision:
            line += f"{r.precision:<20} "
        if r.min_seconds is not None and r.spread_seconds is not None:
            lo, hi = 1e3 * r.min_seconds, 1e3 * (r.min_seconds + r.spread_seconds)
            span = f"{lo:.3f}-{hi:.3f}"
        else:
            span = "-"
        line += f"{r.ms:>10.3f} {span:>17} {r.ratio:>{vw - 1}.2f}x {_fmt(r.err_ulps, '.1f'):>10}"
        if gpu:
            share = None if r.peak_share is None else 100 * r.peak_share
            line += f" {_fmt(r.tflops, '.1f'):>8} {_fmt(share, '.1f'):>7}"
        if backends:
            line += f"  {r.backend or '-'}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def print_table(rows: list[BenchRow], *, versus: str | None = None) -> None:
    print(format_table(rows, versus=versus))


def plot_rows(rows: list[BenchRow], ax=None, title: str | None = None):
    """Horizontal bar chart of time per implementation (ms), reference first: the median, and a black
    line over each bar from the fastest sample to the slowest (where the rows record them), so a ratio
    inside overlapping ranges is not read as a ranking."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(rows)))
    names = [r.name if r.precision == r.dtype else r.label for r in rows][::-1]
    ms = [r.ms for r in rows][::-1]
    ranged = all(r.min_seconds is not None and r.spread_seconds is not None for r in rows)
    xerr = None
    if ranged:                                       # (2, n): median - min, max - median, in ms
        lo = [1e3 * (r.seconds - r.min_seconds) for r in rows][::-1]
        hi = [1e3 * (r.min_seconds + r.spread_seconds - r.seconds) for r in rows][::-1]
        xerr = [[max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]]
    bars = ax.barh(names, ms, color="#0072B2", xerr=xerr, ecolor="black", capsize=3)
    ends = [m + (xerr[1][i] if xerr else 0.0) for i, m in enumerate(ms)]   # the label goes past the range line
    for bar, end, r in zip(bars, ends, rows[::-1]):
        ax.text(end, bar.get_y() + bar.get_height() / 2, f" {r.ratio:.2f}x", va="center", fontsize=9)
    ax.set_xlabel("time per call (ms), lower is better")
    ax.set_title(title or f"{rows[0].device}, {rows[0].dtype}")
    ax.margins(x=0.15)
    return ax
