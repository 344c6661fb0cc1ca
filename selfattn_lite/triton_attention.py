"""FlashAttention as a Triton kernel: the tiled algorithm of notebook 08 as a real GPU program.

Taught in notebook 15. ``flash_attention(q, k, v, *, is_causal=False, scale=None, return_lse=False)``
computes softmax(Q K^T * scale + M) V on (B, H, L, D) tensors, like ``efficient.flash_attention`` and
torch's ``scaled_dot_product_attention``, with a FlashAttention-2 forward kernel and a backward pass
(delta = rowsum(dO * O), then dK/dV and dQ from the saved log-sum-exp) wrapped in a
``torch.autograd.Function``. The kernels themselves live in ``selfattn_lite.triton_kernels``.

**Interpreter or GPU: decided once, by the package.** Without CUDA, ``selfattn_lite/__init__`` sets
``TRITON_INTERPRET=1`` (unless you set it yourself) when the package is first imported, so before anything
(this module, torch's profiler, the GPU report's version check) can import Triton, which reads the variable
once. The interpreter executes each program instance with numpy, one after another:
exact, and slow (it checks correctness; it says nothing about speed). Where Triton is not installed,
``available()`` is False and ``flash_attention`` raises an ImportError saying so; the pure-Python
helpers below (loop bounds, grid, traffic formulas) work everywhere.

**On CUDA** each kernel is wrapped in ``@triton.autotune`` with its own table of launch configurations
(``FWD_CONFIGS``, ``DKDV_CONFIGS``, ``ATOMIC_CONFIGS``, ``DQ_CONFIGS``), keyed on (B*H, L, S, D,
is_causal) and the dtype, and pruned before tuning to those that fit the GPU it runs on (``kept_configs``:
shared memory per block, threads and registers, from ``torch.cuda.get_device_properties``; ``GPU_LIMITS``
for the T4, A100, RTX 30/40 and L4, H100/H200); a forward-only call tunes only the forward. In
bfloat16/float16 on a Hopper GPU (capability 9+) the tiles come through tensor descriptors (the Tensor
Memory Accelerator, TMA, ``tma_by_default``); the backward's dQ comes from a second kernel or from atomic
additions, whichever its first call at a size times faster among those that fit (``dq_method_timings``,
``dq_methods_for``). Matmuls (``matmul_instruction``): ``wgmma`` on sm_90, ``mma.sync`` on sm_80 to sm_89,
and below sm_80 (a T4) Triton's FMA path on the CUDA cores: no tensor cores there. float32 inputs use TF32
tensor-core products from sm_80 (``input_precision="tf32"``, 10-bit mantissa, what torch does only when
``torch.backends.cuda.matmul.allow_tf32`` is set, off by default): an exact float32 dot would run without
tensor cores and compile for minutes; below sm_80 they are float32 products (``precision_for``).
``compile_only`` makes the same calls on CPU tensors compile for a GPU that is not there and launch
nothing. Timing and the benchmark live in the
course machinery (``selfattn_lite.course.triton_bench``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import os
import re

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_int, check_positive_int, is_int, shape_str
from .efficient import LOG2_E

TRITON_MIN = (3, 6)                     # pyproject's triton>=3.6: the oldest release the kernels are tested under


def _triton_release_ok() -> bool:
    """Triton installed (no wheel on macOS, Windows) and not older than TRITON_MIN, read without importing it."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        release = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(x) for x in re.findall(r"\d+", release)[:2]) >= TRITON_MIN


HAVE_TRITON = _triton_release_ok()

__all__ = [
    "HAVE_TRITON",
    "UNAVAILABLE",
    "DTYPES",
    "MIN_HEAD_DIM",
    "MAX_HEAD_DIM",
    "FWD_CONFIGS",
    "DKDV_CONFIGS",
    "DQ_CONFIGS",
    "ATOMIC_CONFIGS",
    "DQ_METHODS",
    "DESCRIPTOR_BLOCKS",
    "available",
    "interpreting",
    "best_device",
    "key_block_bounds",
    "key_blocks_visited",
    "query_block_bounds",
    "program_grid",
    "launch_grid",
    "hbm_bytes",
    "program_work",
    "tma_supported",
    "GPU_LIMITS",
    "gpu_limits",
    "device_limits",
    "matmul_instruction",
    "expected_instruction",
    "precision_for",
    "tma_for",
    "smem_estimate",
    "config_fits",
    "kept_configs",
    "dq_methods_for",
    "tma_by_default",
    "dq_method_timings",
    "forward",
    "backward",
    "FlashAttentionFunction",
    "flash_attention",
]

UNAVAILABLE = ("Triton is not installed, or older than 3.6: it ships for Linux only (pip install -e '.[triton]'). "
               "The Triton kernel cannot run here; the rest of the course does not need it.")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
CPU_BLOCKS = (32, 32)                  # under the interpreter: small tiles, few rows of padding at small L
MAX_HEAD_ELEMENTS = 2**31              # one head's L * D (and S * D): row offsets inside a head are int32

# Launch configurations for @triton.autotune on CUDA (never used by the interpreter), one table per kernel,
# pruned before tuning by the GPU's own limits (``kept_configs``, the autotuner's ``early_config_prune``):
# the matmul path each configuration is for (``paths``, see ``matmul_instruction``), shared memory per block,
# threads and registers. The forward keeps BLOCK_M queries and streams keys; dK/dV keeps a large key block
# (BLOCK_N) and streams query blocks; dQ is the reverse. Every configuration each architecture keeps is compiled
# for it on every commit (``course.arch_compile``, tests/course/test_arch_compile.py): no spills on tensor cores.
# ``paths``: the matmul paths a configuration is for (``matmul_instruction``), each with the largest head dim it
# takes there in bfloat16/float16; ``fp32_paths`` the same for float32 where it differs (TF32 operands are twice as
# wide, so tiles that fit the registers in 16 bits spill in 32). Hopper's wgmma reads its operands from shared
# memory and takes large tiles and more stages; mma.sync (sm_80 to sm_89) holds operand fragments in registers,
# so at d = 128 the larger tiles spill there; the FMA path (below sm_80) gets one small tile per kernel and one
# stage (sm_75 has no asynchronous copies to pipeline; a larger FMA tile spills more and keeps ptxas busy for
# minutes). The atomic dK/dV has no FMA configuration: below sm_80 (and where nothing else fits) the backward
# recomputes dQ (``dq_methods_for``).
FWD_CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, paths={"wgmma": 128, "mma.sync": 64}),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, paths={"wgmma": 128}),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, paths={"wgmma": 128, "mma.sync": 64}),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, paths={"wgmma": 128, "mma.sync": 128}),
    dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, paths={"fma": 128}),
]
DKDV_CONFIGS = [                       # (64, 128) spills at d = 128 (Triton 3.9: 104 B of stack)
    dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3, paths={"wgmma": 128, "mma.sync": 64},
         fp32_paths={"wgmma": 128}),
    dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3, paths={"wgmma": 128, "mma.sync": 64},
         fp32_paths={"wgmma": 64, "mma.sync": 64}),
    dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2, paths={"mma.sync": 128}, fp32_paths={"mma.sync": 64}),
    dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2, paths={}, fp32_paths={"mma.sync": 128, "wgmma": 128},
         hopper_mma=True),       # float32 at d = 128 on sm_90: every wgmma tile spills there; this one runs mma.sync
    dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, paths={"fma": 128}),
]
DQ_CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3, paths={"wgmma": 128, "mma.sync": 128}),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, paths={"wgmma": 128}),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, paths={"wgmma": 128}),
    dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=2, paths={"mma.sync": 128}),
    dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, paths={"fma": 128}),
]
ATOMIC_CONFIGS = [                     # dK/dV with ATOMIC_DQ: on wgmma BLOCK_M >= 64 (at 32, 8 warps, the dQ product
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2, paths={"wgmma": 128}, fp32_paths={}),  # falls back to
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=3, paths={"wgmma": 128}, fp32_paths={}),  # mma.sync)
    dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2, paths={"mma.sync": 64}),
]
DQ_METHODS = ("recompute", "atomic")   # dQ by a second kernel (7 matmuls a tile pair) or by atomics (5)
PREPROCESS_BLOCK_M = 64                # rows per program of the delta = rowsum(dO * O) kernel


def available() -> bool:
    """True when Triton is installed, so ``flash_attention`` can run (on a GPU or the interpreter).

    Taught in notebook 15, "From notebook 08's loop to a grid of programs".
    """
    return HAVE_TRITON


def interpreting() -> bool:
    """True when kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1).

    Taught in notebook 15, "From notebook 08's loop to a grid of programs".
    """
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def best_device() -> torch.device:
    """Where the kernels run here: CUDA when the kernels are compiled, else the CPU (the interpreter).

    Taught in notebook 15, "From notebook 08's loop to a grid of programs".
    """
    return torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")


# ---------------------------------------------------------------------------------------------
# The GPUs the kernels run on, and the launch configurations that fit each
# ---------------------------------------------------------------------------------------------

# What one thread block may use, per compute capability (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"): shared memory per block with the opt-in attribute, 64 K 32-bit registers per SM, at most 255
# a thread, 1,024 threads a block. ``tensor_cores``: whether Triton lowers ``tl.dot`` to tensor-core instructions
# there (below sm_80 it uses FMA on the CUDA cores, see ``matmul_instruction``).
GPU_LIMITS = {
    75: dict(name="T4 (sm_75)", capability=(7, 5), smem_per_block=65_536),
    80: dict(name="A100 (sm_80)", capability=(8, 0), smem_per_block=166_912),
    86: dict(name="RTX 3090, A10G (sm_86)", capability=(8, 6), smem_per_block=101_376),
    89: dict(name="RTX 4090, L4 (sm_89)", capability=(8, 9), smem_per_block=101_376),
    90: dict(name="H100, H200 (sm_90)", capability=(9, 0), smem_per_block=232_448),
}
for _cc, _limits in GPU_LIMITS.items():
    _limits.update(regs_per_sm=65_536, regs_per_thread=255, threads_per_block=1_024, tensor_cores=_cc >= 80)


_KERNELS = ("attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel")
_INSTRUCTIONS = ("wgmma", "mma.sync", "fma")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_limits(limits) -> dict:
    """limits, if it is a dict like ``GPU_LIMITS``' entries (a ``capability`` of two ints, tuple or, as
    read back from JSON, list); else ValueError."""
    cap = limits.get("capability") if isinstance(limits, dict) else None
    if not (isinstance(cap, (tuple, list)) and len(cap) == 2 and all(is_int(c) for c in cap)):
        got = type(limits).__name__ if not isinstance(limits, dict) else f"capability={cap!r}"
        raise ValueError(f"limits must be a dict like GPU_LIMITS[cc] (gpu_limits, device_limits), with a capability "
                         f"(major, minor); got {got}")
    for key in ("smem_per_block", "regs_per_sm", "regs_per_thread", "threads_per_block"):
        if key in limits:
            check_positive_int(f"limits[{key!r}]", limits[key])
    return limits


def _check_launch(kernel=None, config=None, dtype=None, D=None, *, atomic=None, instruction=None) -> None:
    """The common arguments of the launch-planning functions, each checked when given."""
    if kernel is not None:
        check_choice("kernel", kernel, _KERNELS)
    if config is not None:
        if not isinstance(config, dict):
            raise ValueError(f"config must be a dict of BLOCK_M, BLOCK_N (not for the preprocess), num_warps, "
                             f"num_stages, got "
                             f"{type(config).__name__}")
        keys = ("BLOCK_M", "num_warps", "num_stages") + (() if kernel == "attn_bwd_preprocess_kernel" else ("BLOCK_N",))
        for key in keys:
            if key not in config:
                raise ValueError(f"config needs {key!r}, got keys {sorted(config)}")
            check_positive_int(f"config[{key!r}]", config[key])
    if dtype is not None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of torch.float16, torch.bfloat16, torch.float32, got {dtype!r}")
    if D is not None:
        check_positive_int("D", D)
    if atomic is not None:
        check_bool("atomic", atomic)
    if instruction is not None:
        check_choice("instruction", instruction, _INSTRUCTIONS)


def gpu_limits(props) -> dict:
    """The limits a launch must fit, read off a CUDA device's properties (``torch.cuda.get_device_properties``):
    name, capability, shared memory per block (opt-in), registers per SM, multiprocessors; the same keys as
    ``GPU_LIMITS``.

    Taught in notebook 15, "On a GPU".
    """
    cc = 10 * props.major + props.minor
    return dict(name=props.name, capability=(props.major, props.minor),
                smem_per_block=int(getattr(props, "shared_memory_per_block_optin", 0) or
                                   GPU_LIMITS.get(cc, GPU_LIMITS[75])["smem_per_block"]),
                regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 0) or 65_536), regs_per_thread=255,
                threads_per_block=1_024, tensor_cores=cc >= 80,
                multiprocessors=int(getattr(props, "multi_processor_count", 0)))


def device_limits(device=None) -> dict:
    """``gpu_limits`` of the CUDA device the kernels launch on (``device``, or the current one), or inside
    ``compile_only`` the architecture it compiles for (``GPU_LIMITS``).

    Taught in notebook 15, "On a GPU".
    """
    if _COMPILE_ONLY is not None:
        return GPU_LIMITS[10 * _COMPILE_ONLY[0] + _COMPILE_ONLY[1]]
    if device is None or torch.device(device).type != "cuda":
        device = torch.cuda.current_device()
    return gpu_limits(torch.cuda.get_device_properties(device))


def _cc(limits: dict) -> int:
    return 10 * limits["capability"][0] + limits["capability"][1]


def matmul_instruction(limits: dict) -> str:
    """The instruction ``tl.dot`` becomes on that GPU: "wgmma" (Hopper's warpgroup tensor-core matmul, sm_90),
    "mma.sync" (the warp-level tensor-core matmul, sm_80 to sm_89), or "fma" below sm_80: there Triton's
    AccelerateMatmul pass keeps the dot on the CUDA cores ("Dot op using MMA for compute capability 75 has
    been deprecated. It falls back to the FMA path."), so a T4 runs this kernel without tensor cores.

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    cc = _cc(limits)
    return "wgmma" if 90 <= cc < 100 else "mma.sync" if cc >= 80 else "fma"


def precision_for(limits: dict, dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for float32 on that GPU: "tf32" (10-bit mantissa products on the tensor cores)
    from sm_80, where TF32 exists; "ieee" (exact float32 products, FMA) below. bf16/fp16 ignore it.

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(dtype=dtype)
    del dtype
    return "tf32" if _cc(limits) >= 80 else "ieee"


def tma_for(limits: dict, dtype: torch.dtype, D: int) -> bool:
    """Whether a launch on that GPU fetches tiles through tensor descriptors (the Tensor Memory Accelerator):
    sm_90 or later, bfloat16/float16, rows of a multiple of 16 bytes (D a multiple of 8).

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(dtype=dtype, D=D)
    D = int(D)
    return _cc(limits) >= 90 and dtype in (torch.bfloat16, torch.float16) and (D * 2) % 16 == 0


# What stays in shared memory: the tiles a program keeps (``fixed``) and those it streams through its loop
# (``streamed``), in rows of BLOCK_D elements, as (rows of BLOCK_M, rows of BLOCK_N).
_SMEM_TILES = {                       # kernel: (fixed (M rows, N rows), streamed (M rows, N rows))
    "attn_fwd_kernel": ((1, 0), (0, 2)),         # Q kept; K, V streamed
    "attn_bwd_dkdv_kernel": ((0, 2), (2, 0)),    # K, V kept; Q, dO streamed
    "attn_bwd_dq_kernel": ((2, 0), (0, 2)),      # Q, dO kept; K, V streamed
}
SMEM_SLACK = 4096                      # barriers, layout conversions, the float32 rows of lse and delta


def smem_estimate(kernel: str, config: dict, dtype: torch.dtype, D: int, *, atomic: bool = False,
                  instruction: str = "wgmma") -> int:
    """Bytes of shared memory one program of ``kernel`` needs with ``config`` where ``tl.dot`` becomes
    ``instruction`` (``matmul_instruction``), estimated from its tiles, plus ``SMEM_SLACK``:

    - "wgmma" (sm_90): the kept tiles once and the streamed tiles once per pipeline stage (``num_stages``), in the
      input dtype; with atomic dQ also a float32 (BLOCK_M, BLOCK_D) tile, converted before the atomic additions;
    - "mma.sync" (sm_80 to sm_89): the same with num_stages - 1 buffers of the streamed tiles (at least one), and
      in float32 (TF32) two float32 (BLOCK_M, BLOCK_N) tiles more (P and dS pass through shared memory there);
    - "fma" (below sm_80): the operands of ``tl.dot`` are float32 and pass through shared memory on their way to
      the CUDA cores: the kept and the streamed tiles, in float32.

    ``course.arch_compile`` checks every estimate against what the compiler allocates.

    Taught in notebook 15, "On a GPU".
    """
    _check_launch(kernel, config, dtype, D, atomic=atomic, instruction=instruction)
    D = int(D)
    if kernel == "attn_bwd_preprocess_kernel":
        return SMEM_SLACK
    bm, bn, bd = config["BLOCK_M"], config["BLOCK_N"], _block_d(D)
    (fm, fn), (sm, sn) = _SMEM_TILES[kernel]
    fixed, streamed = fm * bm + fn * bn, sm * bm + sn * bn          # rows of BLOCK_D elements
    if instruction == "fma":
        return 4 * bd * (fixed + streamed) + SMEM_SLACK
    e = torch.empty((), dtype=dtype).element_size()
    buffers = config["num_stages"] if instruction == "wgmma" else max(config["num_stages"] - 1, 1)
    tf32 = 2 * 4 * bm * bn if instruction == "mma.sync" and e == 4 else 0
    rows = 2 * 4 * bm * buffers if kernel == "attn_bwd_dkdv_kernel" else 0       # lse and delta, float32, per stage
    return e * bd * (fixed + buffers * streamed) + (4 * bm * bd if atomic else 0) + tf32 + rows + SMEM_SLACK


def _min_dot_rows(kernel: str, config: dict, atomic: bool) -> int:
    """The fewest rows (M) of any of the kernel's matmuls: BLOCK_M in the forward and dQ, BLOCK_N in dK/dV (and
    BLOCK_M again for its atomic dS K)."""
    if kernel == "attn_bwd_dkdv_kernel":
        return min(config["BLOCK_N"], config["BLOCK_M"]) if atomic else config["BLOCK_N"]
    return config["BLOCK_M"]


def _candidates(kernel: str, atomic: bool) -> list[dict]:
    return {"attn_fwd_kernel": FWD_CONFIGS, "attn_bwd_dq_kernel": DQ_CONFIGS,
            "attn_bwd_dkdv_kernel": ATOMIC_CONFIGS if atomic else DKDV_CONFIGS}[kernel]


def config_fits(kernel: str, config: dict, limits: dict, dtype: torch.dtype, D: int, *, atomic: bool = False) -> bool:
    """Whether a launch of ``kernel`` with ``config`` fits that GPU: made for its matmul path and this head dim
    (``paths`` maps its ``matmul_instruction`` to a largest D), threads within a block's, the register file
    even at 255 registers a thread, ``smem_estimate`` within its shared memory per block; on sm_90 also every
    matmul at least 64 rows, the M of one ``wgmma`` (fewer would fall back to ``mma.sync``).

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(kernel, config, dtype, D, atomic=atomic)
    D = int(D)
    paths = config.get("fp32_paths", config.get("paths", {})) if dtype == torch.float32 else config.get("paths", {})
    if D > paths.get(matmul_instruction(limits), 0):
        return False
    threads = 32 * config["num_warps"]
    if threads > limits["threads_per_block"] or threads * limits["regs_per_thread"] > limits["regs_per_sm"]:
        return False
    instruction = matmul_instruction(limits)
    if smem_estimate(kernel, config, dtype, D, atomic=atomic, instruction=instruction) > limits["smem_per_block"]:
        return False
    return instruction != "wgmma" or _min_dot_rows(kernel, config, atomic) >= 64 or config.get("hopper_mma", False)


def expected_instruction(kernel: str, config: dict, limits: dict, *, atomic: bool = False) -> str:
    """The matmul instruction a kept configuration compiles to on that GPU: ``matmul_instruction``, except on
    sm_90 for a configuration whose smallest matmul has fewer than 64 rows (``hopper_mma``), which runs mma.sync.

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(kernel, config, atomic=atomic)
    instruction = matmul_instruction(limits)
    if instruction == "wgmma" and _min_dot_rows(kernel, config, atomic) < 64:
        return "mma.sync"
    return instruction


def kept_configs(kernel: str, limits: dict, dtype: torch.dtype, D: int, *, atomic: bool = False) -> list[dict]:
    """The configurations of ``kernel``'s table (``FWD_CONFIGS``, ``DKDV_CONFIGS``, ``ATOMIC_CONFIGS`` with
    atomic dQ, ``DQ_CONFIGS``) that ``config_fits`` that GPU: what its autotuner tries. May be empty for the
    atomic dK/dV (``dq_methods_for`` then leaves only "recompute").

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(kernel, None, dtype, D, atomic=atomic)
    D = int(D)
    return [dict(c) for c in _candidates(kernel, atomic) if config_fits(kernel, c, limits, dtype, D, atomic=atomic)]


def dq_methods_for(limits: dict, dtype: torch.dtype, D: int) -> tuple[str, ...]:
    """The dQ methods (``DQ_METHODS``) with at least one configuration that fits that GPU: "recompute" needs the
    dK/dV and dQ kernels, "atomic" the dK/dV kernel with atomic dQ. When one does not fit, the other is used.

    Taught in notebook 15, "On a GPU".
    """
    _check_limits(limits)
    _check_launch(dtype=dtype, D=D)
    D = int(D)
    fits = dict(recompute=bool(kept_configs("attn_bwd_dkdv_kernel", limits, dtype, D) and
                               kept_configs("attn_bwd_dq_kernel", limits, dtype, D)),
                atomic=bool(kept_configs("attn_bwd_dkdv_kernel", limits, dtype, D, atomic=True)))
    return tuple(m for m in DQ_METHODS if fits[m])


_COMPILE_ONLY: tuple[int, int] | None = None      # the capability ``compile_only`` compiles for, inside it


class _CompileOnlyDriver:
    """The part of a Triton driver the JIT and the autotuner ask for: device 0, stream 0, the target GPU, and a
    benchmarker that runs a configuration once (with launches stopped after their compile) and says 1 ms."""

    def __init__(self, capability: tuple[int, int]):
        self.capability = capability

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 10 * self.capability[0] + self.capability[1], 32)

    def get_benchmarker(self):
        def bench(kernel_call, quantiles=None, **_):
            kernel_call()
            return [1.0, 1.0, 1.0] if quantiles else 1.0
        return bench


@contextlib.contextmanager
def compile_only(capability: tuple[int, int] = (9, 0)):
    """Inside this block, calls on CPU tensors compile the kernels for an NVIDIA GPU of compute capability
    ``capability`` (default (9, 0): H100/H200) through Triton's own JIT and autotuner, and launch nothing.

    Taught in notebook 15, "On a GPU".

    Everything a GPU call does happens (the checks, TMA descriptors, the autotuner with its pre-hooks, the
    choice of dQ method, the JIT's argument binding and compile), except that every launch stops after its
    compile (Triton's ``warmup``): outputs and gradients are left unwritten, every timing is 1 ms (so the
    autotuner keeps its first configuration and the backward its first dQ method). Yields a list that, when the
    block ends, holds (kernel name, Triton ``CompiledKernel``) for every kernel compiled; the JIT caches and the
    autotuners are emptied then, so later calls are not served kernels for a GPU that is not there. Needs
    TRITON_INTERPRET=0 before the package is imported (``course.sm90_compile.jit_dry_run`` runs it so) and
    Triton's NVIDIA backend (no GPU, no CUDA driver).
    """
    global _COMPILE_ONLY
    if interpreting():
        raise RuntimeError("compile_only needs the compiler: set TRITON_INTERPRET=0 before importing selfattn_lite")
    if _COMPILE_ONLY is not None:
        raise RuntimeError("compile_only blocks do not nest")
    from triton.runtime import driver
    from triton.runtime.jit import KernelInterface

    kernels = _kernels()
    jitted = [getattr(kernels, name) for name in kernels.__all__ if hasattr(getattr(kernels, name), "device_caches")]
    previous_driver = driver._active                    # None until a driver is first asked for (none on a CPU)
    launch = KernelInterface.__getitem__
    compiled: list = []
    driver.set_active(_CompileOnlyDriver(tuple(capability)))
    KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **kw: self.run(*a, grid=grid, warmup=True, **kw))
    _COMPILE_ONLY = tuple(capability)
    _AUTOTUNED.clear()
    try:
        yield compiled
    finally:
        _COMPILE_ONLY = None
        KernelInterface.__getitem__ = launch
        driver.set_active(previous_driver)
        _AUTOTUNED.clear()
        for fn in jitted:
            for caches in fn.device_caches.values():
                compiled += [(fn.__name__, kernel) for kernel in caches[0].values()]
            fn.device_caches.clear()


def _require_triton() -> None:
    if not HAVE_TRITON:
        raise ImportError(UNAVAILABLE)


def _kernels():
    """``selfattn_lite.triton_kernels``, imported on first launch (importing Triton takes a moment, and the
    widget and figures that import this module need none of it)."""
    _require_triton()
    from . import triton_kernels

    return triton_kernels


# ---------------------------------------------------------------------------------------------
# The arithmetic of the kernel, in plain Python: loop bounds, grid, memory traffic, work
# ---------------------------------------------------------------------------------------------

def _block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of 2 (tl.arange needs it) >= 16 (tl.dot sums over at least 16, "
                         f"and every block size is the summed dimension of some product), got {value!r}")
    return value


def key_block_bounds(q0: int, block_m: int, block_n: int, S: int, is_causal: bool) -> tuple[int, int]:
    """Where one query block's loop over key blocks switches to masking, and where it ends.

    Taught in notebook 15, "The causal loop split".

    The program of queries q0 ... q0 + block_m - 1 visits key blocks starting at 0, block_n, ...:
    those before ``unmasked_end`` with no mask (every key is visible to every query of the block and
    lies inside S), those from ``unmasked_end`` to ``end`` with the mask. Causal (key j <= query i):
    a key block is whole for every query iff it ends at or before q0, so
    unmasked_end = floor((q0 + 1) / block_n) * block_n, and no query sees a key >= q0 + block_m, so
    end = min(S, q0 + block_m). Not causal: unmasked_end = floor(S / block_n) * block_n, end = S.

    This is ``efficient.tile_kind``'s classification in closed form: blocks before unmasked_end are
    FULL (no mask), those up to end PARTIAL (masked; the partial last block of S counts here), the
    rest SKIP (never loaded); ``tests/reference/test_triton_attention.py`` checks the two agree.

    Returns:
        (unmasked_end, end), both key offsets; unmasked_end is a multiple of block_n and <= end.
    """
    check_bool("is_causal", is_causal)
    for name, value in (("q0", q0), ("block_m", block_m), ("block_n", block_n), ("S", S)):
        if name != "q0":
            check_positive_int(name, value)
    q0 = check_int("q0", q0, low=0)
    if is_causal:
        return min((q0 + 1) // block_n, S // block_n) * block_n, min(S, q0 + block_m)
    return (S // block_n) * block_n, S


def query_block_bounds(k0: int, block_m: int, block_n: int, L: int, is_causal: bool) -> tuple[int, int, int]:
    """The dK/dV kernel's three stages for the key block k0 ... k0 + block_n - 1, as query offsets.

    Taught in notebook 15, "The backward kernels".

    Query blocks [start, diag_end) are masked (causal: they straddle the diagonal, some key j > query i);
    [diag_end, full_end) need no mask (every query i >= every key j, and block_m rows inside L);
    [max(diag_end, full_end), L) is the last, partial query block, masked. Query blocks before
    ``start`` see none of these keys and are never loaded. The same classification as
    ``efficient.tile_kind`` (PARTIAL, FULL, SKIP), with the partial tail of L counted as PARTIAL.

    Returns:
        (start, diag_end, full_end), each a multiple of block_m.
    """
    check_bool("is_causal", is_causal)
    for name, value in (("block_m", block_m), ("block_n", block_n), ("L", L)):
        check_positive_int(name, value)
    k0 = check_int("k0", k0, low=0)
    full_end = (L // block_m) * block_m
    if not is_causal:
        return 0, 0, full_end
    start = (k0 // block_m) * block_m
    diag_end = max(min(math.ceil((k0 + block_n) / block_m) * block_m, full_end), start)
    return start, diag_end, full_end


def key_blocks_visited(q0: int, block_m: int, block_n: int, S: int, is_causal: bool) -> tuple[int, int]:
    """(unmasked, masked) number of key blocks the program of queries q0 ... loads.

    Taught in notebook 15, "The causal loop split".
    """
    unmasked_end, end = key_block_bounds(q0, block_m, block_n, S, is_causal)
    return unmasked_end // block_n, max(0, math.ceil(end / block_n) - unmasked_end // block_n)


def program_grid(B: int, H: int, L: int, block_m: int) -> tuple[int, int]:
    """The forward kernel's programs: (ceil(L / block_m) query blocks, B * H heads).

    Taught in notebook 15, "From notebook 08's loop to a grid of programs".

    They are launched on one grid axis (``launch_grid``): CUDA's second and third axes stop at 65,535.
    """
    for name, value in (("B", B), ("H", H), ("L", L), ("block_m", block_m)):
        check_positive_int(name, value)
    return math.ceil(L / block_m), B * H


def launch_grid(B: int, H: int, L: int, block_m: int) -> tuple[int]:
    """The one-dimensional launch grid: ceil(L / block_m) * B * H programs; program pid takes query block
    pid % ceil(L / block_m) of head pid // ceil(L / block_m), so one head's programs sit next to each other
    and are likely to run side by side, sharing its K and V in the L2 cache (CUDA promises no order).

    Taught in notebook 15, "From notebook 08's loop to a grid of programs".
    """
    blocks, heads = program_grid(B, H, L, block_m)
    return (blocks * heads,)


def hbm_bytes(L: int, S: int, D: int, block_m: int, block_n: int, *, B: int = 1, H: int = 1,
              is_causal: bool = False, bytes_per_element: int = 2) -> dict[str, int]:
    """Bytes the forward kernel moves between HBM and the chip, counted block by block.

    Taught in notebook 15, "Where the memory traffic goes".

    Each program reads its Q block once, then K and V block by block for every key block it
    visits (so K and V are read ceil(L / block_m) times each without a mask, about half as often
    causal), and writes its O block and its log-sum-exp (float32) once. The L x S scores never
    leave the chip. ``explicit`` is what materialising them costs at the least: write S = Q K^T,
    read it for the softmax, write P, read P for P V (4 L S elements), plus reading Q, K, V and
    writing O once.

    Returns:
        dict with q, kv, o (incl. lse) and total bytes of the kernel, and explicit (bytes).
    """
    check_bool("is_causal", is_causal)
    for name, value in (("L", L), ("S", S), ("D", D), ("B", B), ("H", H)):
        check_positive_int(name, value)
    check_positive_int("block_m", block_m)
    check_positive_int("block_n", block_n)
    e = bytes_per_element
    q = L * D * e
    key_rows = 0                       # key rows loaded, summed over the query blocks
    for q0 in range(0, L, block_m):
        _, end = key_block_bounds(q0, block_m, block_n, S, is_causal)
        key_rows += min(S, math.ceil(end / block_n) * block_n)
    kv = 2 * key_rows * D * e
    o = L * D * e + L * 4
    heads = B * H
    explicit = heads * ((L + 2 * S) * D * e + 4 * L * S * e + L * D * e)
    return dict(q=heads * q, kv=heads * kv, o=heads * o, total=heads * (q + kv + o), explicit=explicit)


def program_work(block_m: int, block_n: int, D: int, S: int, *, is_causal: bool = False, q0: int = 0,
                 bytes_per_element: int = 2) -> dict[str, int]:
    """What one forward program does: FLOPs of its two matmuls per key block and in all, and the
    bytes it keeps on chip (its Q block, one K and one V block, the float32 scores and accumulator).

    Taught in notebook 15, "Where the memory traffic goes".
    """
    check_bool("is_causal", is_causal)
    check_positive_int("D", D)
    check_positive_int("bytes_per_element", bytes_per_element)
    unmasked, masked = key_blocks_visited(q0, block_m, block_n, S, is_causal)
    per_block = 4 * block_m * block_n * D          # S = Q K^T and P V: 2 * block_m * block_n * D each
    on_chip = (block_m * D + 2 * block_n * D) * bytes_per_element + (block_m * block_n + block_m * D + 2 * block_m) * 4
    return dict(key_blocks=unmasked + masked, masked_blocks=masked, flops_per_block=per_block,
                flops=per_block * (unmasked + masked), on_chip_bytes=on_chip)


# ---------------------------------------------------------------------------------------------
# Checking inputs and launching the kernels
# ---------------------------------------------------------------------------------------------

def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    """ValueError naming the shape or dtype that does not fit (the device: ``_check_device``, last)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, L, D), 4 dims, got shape {shape_str(t)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype of float32, bfloat16, float16, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, H, S, D), got k {shape_str(k)} and v {shape_str(v)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, L, D) and k (B, H, S, D) must share B, H and D, got q {shape_str(q)} "
                         f"and k {shape_str(k)}")
    if not MIN_HEAD_DIM <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {q.shape[3]} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM} (q {shape_str(q)})")
    if q.shape[0] * q.shape[1] == 0 or q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"need at least one head, one query and one key, got q {shape_str(q)} and k {shape_str(k)}")
    if max(q.shape[2], k.shape[2]) * q.shape[3] >= MAX_HEAD_ELEMENTS:
        raise ValueError(f"one head holds L * D or S * D >= 2^31 elements (q {shape_str(q)}, k {shape_str(k)}): "
                         "offsets inside a head are int32")


def _check_device(*tensors: Tensor) -> None:
    """Called after every other check: a CPU tensor on a GPU machine is the last thing to complain about."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"q, k, v (and the gradients) must be on one device, got {sorted(map(str, devices))}")
    device = tensors[0].device
    if device.type != "cuda" and not interpreting() and _COMPILE_ONLY is None:
        raise ValueError(f"q is on {device}: Triton kernels run on CUDA tensors, or on CPU tensors under "
                         "the interpreter (set TRITON_INTERPRET=1 before triton is imported)")


def _check_gpu_dtype(q: Tensor) -> None:
    """bfloat16 is native from sm_80 (A100 and later); below (a T4) the kernels take float16 or float32."""
    if q.dtype == torch.bfloat16 and _compiled(q.device):
        limits = device_limits(q.device)
        if _cc(limits) < 80:
            raise ValueError(f"bfloat16 needs a GPU of compute capability 8.0 or more; the {limits['name']} runs "
                             "the kernels in float16 or float32")


def _scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _precision(dtype: torch.dtype, device: torch.device | None = None) -> str:
    """tl.dot's input precision: on a GPU ``precision_for`` it (TF32 for float32 from sm_80, float32 products
    below); under the interpreter, whose dot multiplies in numpy's float32, "ieee". bf16/fp16 ignore it."""
    if device is not None and _compiled(device):
        return precision_for(device_limits(device), dtype)
    return "ieee"


def _block_d(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())            # tl.arange needs a power of 2: pad D, mask the rest


def _upcast(dtype: torch.dtype) -> bool:
    return interpreting() and dtype == torch.bfloat16     # see triton_kernels.dot


def _compiled(device: torch.device) -> bool:
    """True where the kernels are compiled for a GPU (and autotuned), False under the interpreter; inside
    ``compile_only`` CPU tensors count as on the GPU it compiles for."""
    return not interpreting() and (device.type == "cuda" or _COMPILE_ONLY is not None)


def _config(config: dict | None, block_m, block_n, device: torch.device) -> dict | None:
    """The launch settings of one call: ``config`` as given, or the block sizes (with Triton's default warps
    and stages), or None to let the autotuner choose (CUDA only; the interpreter takes ``CPU_BLOCKS``)."""
    if config is not None:
        return dict(config)
    if block_m is None and block_n is None and _compiled(device):
        return None
    block_m = CPU_BLOCKS[0] if block_m is None else block_m
    block_n = CPU_BLOCKS[1] if block_n is None else block_n
    return dict(BLOCK_M=_block("block_m", block_m), BLOCK_N=_block("block_n", block_n))


def tma_supported(*tensors: Tensor) -> bool:
    """True where the kernels can fetch tiles through tensor descriptors (the Tensor Memory Accelerator, TMA, of
    Hopper): bfloat16 or float16, rows of a multiple of 16 bytes (D a multiple of 8), 16-byte aligned data;
    compiled on a GPU of compute capability 9 or more (``tma_for``), or under the interpreter (which emulates
    descriptors, so the CPU tests run the path).

    Taught in notebook 15, "On a GPU".
    """
    _check_tensors(tensors)
    t = tensors[0]
    if t.dtype not in (torch.bfloat16, torch.float16) or (t.shape[-1] * t.element_size()) % 16:
        return False
    if any(x.data_ptr() % 16 for x in tensors):
        return False
    if interpreting():
        return True
    if _COMPILE_ONLY is None and t.device.type != "cuda":
        return False
    return tma_for(device_limits(t.device), t.dtype, t.shape[-1])


def tma_by_default(*tensors: Tensor) -> bool:
    """Whether ``forward`` and ``backward`` fetch these tensors' tiles through descriptors when ``tma`` is
    left at None: where the kernels are compiled (a GPU, not the interpreter) and ``tma_supported``.

    Taught in notebook 15, "On a GPU".
    """
    _check_tensors(tensors)
    return _compiled(tensors[0].device) and tma_supported(*tensors)


def _check_tensors(tensors) -> None:
    if not tensors:
        raise ValueError("tensors: pass at least one tensor (q, k, v ...)")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise ValueError(f"tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")


def _use_tma(tma, *tensors: Tensor) -> bool:
    """tma None: descriptors where ``tma_supported`` and the kernels are compiled (the interpreter runs the
    pointer path unless asked); True: required (ValueError where unsupported); False: pointers."""
    if tma is None:
        return tma_by_default(*tensors)
    if tma and not tma_supported(*tensors):
        raise ValueError(f"tma=True needs bfloat16/float16 with D a multiple of 8 on an sm_90+ GPU or the "
                         f"interpreter, got {tensors[0].dtype}, D = {tensors[0].shape[-1]} on {tensors[0].device}")
    return bool(tma)


# Which block each descriptor argument of a kernel moves: rows of BLOCK_M (queries) or BLOCK_N (keys); the sm_90
# compile (course.sm90_compile) builds its signatures from the same table.
DESCRIPTOR_BLOCKS = {
    "attn_fwd_kernel": dict(Q="BLOCK_M", K="BLOCK_N", V="BLOCK_N", O="BLOCK_M"),
    "attn_bwd_dkdv_kernel": dict(Q="BLOCK_M", DO="BLOCK_M", K="BLOCK_N", V="BLOCK_N", DK="BLOCK_N", DV="BLOCK_N"),
    "attn_bwd_dq_kernel": dict(Q="BLOCK_M", DO="BLOCK_M", DQ="BLOCK_M", K="BLOCK_N", V="BLOCK_N"),
}


def _descriptor(t: Tensor):
    """A tensor descriptor of the (N, rows, D) tensor t; its block shape is set per launch (``_set_blocks``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16, 16])


def _set_blocks(name: str, nargs: dict) -> None:
    """Give each descriptor argument of kernel ``name`` its block (1, BLOCK_M or BLOCK_N, BLOCK_D), from the
    launch's meta-parameters in ``nargs``: before a direct launch, and as the autotuner's per-config pre-hook."""
    for arg, block in DESCRIPTOR_BLOCKS[name].items():
        desc = nargs.get(arg)
        if desc is not None and not isinstance(desc, Tensor):
            desc.block_shape = [1, nargs[block], nargs["BLOCK_D"]]


_AUTOTUNED: dict[tuple, object] = {}       # (kernel name, atomic dQ, dtype) -> autotuner


def _autotuned(name: str, atomic: bool = False, dtype: torch.dtype | None = None):
    """Kernel ``name`` of ``triton_kernels`` under ``@triton.autotune`` with its own configurations
    (``ATOMIC_CONFIGS`` for the dK/dV kernel when it also adds dQ), one autotuner per input dtype.

    Keyed on (N = B*H, L, S, D, IS_CAUSAL); the dtype picks the autotuner (Triton adds the dtypes of tensor
    arguments to its key itself, but a tensor descriptor has none, so with TMA bf16 and fp16 would share one
    tuning). Before tuning, ``_pruner`` drops the configurations that do not fit the GPU (``config_fits``).
    Triton's autotuner skips a configuration that runs out of resources and re-raises any other error
    (a compile error, an illegal memory access) as it is. A per-config pre-hook sets the descriptors' block
    shapes; with atomics, DQ_ACC is zeroed before each timed run.
    """
    if (name, atomic, dtype) not in _AUTOTUNED:
        import triton

        configs = {"attn_fwd_kernel": FWD_CONFIGS, "attn_bwd_dkdv_kernel": ATOMIC_CONFIGS if atomic else DKDV_CONFIGS,
                   "attn_bwd_dq_kernel": DQ_CONFIGS}[name]
        tuned = [triton.Config(dict(BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"]), num_warps=c["num_warps"],
                               num_stages=c["num_stages"], pre_hook=lambda nargs: _set_blocks(name, nargs))
                 for c in configs]
        prune = {"early_config_prune": _pruner(name, atomic)}
        _AUTOTUNED[name, atomic, dtype] = triton.autotune(configs=tuned, key=["N", "L", "S", "D", "IS_CAUSAL"],
                                                          prune_configs_by=prune,
                                                          reset_to_zero=["DQ_ACC"] if atomic else None)(
            getattr(_kernels(), name))
    return _AUTOTUNED[name, atomic, dtype]


def _as_dict(config, name: str = "attn_fwd_kernel", atomic: bool = False) -> dict:
    """A ``triton.Config`` of kernel ``name`` as its entry in ``FWD_CONFIGS`` or the other tables."""
    fields = dict(BLOCK_M=config.kwargs["BLOCK_M"], BLOCK_N=config.kwargs["BLOCK_N"], num_warps=config.num_warps,
                  num_stages=config.num_stages)
    for entry in _candidates(name, atomic):
        if all(entry[key] == value for key, value in fields.items()):
            return dict(entry)
    return fields


def _pruner(name: str, atomic: bool):
    """The autotuner's ``early_config_prune`` for kernel ``name``: the configurations that ``config_fits`` the
    GPU the launch runs on (its properties, read once per key), for the launch's dtype and D."""
    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        q = args["Q"]
        tensor = getattr(q, "base", q)                                  # Q: a tensor or its descriptor
        limits = device_limits(tensor.device)
        kept = [c for c in configs
                if config_fits(name, _as_dict(c, name, atomic), limits, tensor.dtype, args["D"], atomic=atomic)]
        if not kept:
            raise ValueError(f"no launch configuration of {name} fits the {limits['name']} "
                             f"({limits['smem_per_block']} B of shared memory per block) at D = {args['D']} in "
                             f"{tensor.dtype}")
        return kept
    return prune


def _launch(name: str, rows: int, N: int, config: dict | None, args: dict, meta: dict) -> None:
    """Run kernel ``name`` on the one-dimensional grid of ceil(rows / block) * N programs.

    ``rows`` is what the kernel's programs split (queries for the forward and dQ, keys for dK/dV); ``args``
    the kernel's runtime arguments by name (tensors, or tensor descriptors with TMA), ``meta`` its other
    constexprs; config None: the autotuned kernel, which picks the block sizes itself.
    """
    block = "BLOCK_N" if name == "attn_bwd_dkdv_kernel" else "BLOCK_M"
    if config is None:
        dtype = getattr(args["Q"], "base", args["Q"]).dtype                      # Q: a tensor or its descriptor
        tuned = _autotuned(name, bool(meta.get("ATOMIC_DQ")), dtype)
        tuned[lambda m: (math.ceil(rows / m[block]) * N,)](**args, **meta)
        return
    options = {key: config[key] for key in ("num_warps", "num_stages") if key in config}
    blocks = dict(BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"])
    _set_blocks(name, {**args, **meta, **blocks})
    grid = (math.ceil(rows / config[block]) * N,)
    getattr(_kernels(), name)[grid](**args, **blocks, **meta, **options)


def forward(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, scale: float | None = None,
            block_m: int | None = None, block_n: int | None = None, config: dict | None = None,
            tma: bool | None = None) -> tuple[Tensor, Tensor]:
    """The forward kernel, no autograd: one program per (query block, batch * head).

    Taught in notebook 15, "The forward kernel".

    Args:
        q: (B, H, L, D); k, v: (B, H, S, D); D in 16..128; float32, bfloat16 or float16.
        is_causal: key j <= query i (top-left aligned, as torch's is_causal).
        scale: default 1 / sqrt(D).
        block_m, block_n: queries per program, keys per loop step (powers of 2 >= 16). Default: the
            autotuner's choice on CUDA, ``CPU_BLOCKS`` under the interpreter.
        config: one launch configuration (BLOCK_M, BLOCK_N and optionally num_warps, num_stages), as in
            ``FWD_CONFIGS``; overrides block_m, block_n.
        tma: fetch tiles through tensor descriptors (Hopper's TMA). None: where ``tma_supported`` on a GPU;
            True: also under the interpreter (ValueError where unsupported); False: pointer loads.

    Returns:
        out (B, H, L, D) in q's dtype, and lse (B, H, L) float32: the natural log-sum-exp of each
        query's scaled scores, log sum_j exp(q_i . k_j * scale + M_ij).
    """
    _require_triton()
    _check(q, k, v)
    B, H, L, D = q.shape
    S = k.shape[2]
    scale = _scale(scale, D)
    config = _config(config, block_m, block_n, q.device)
    _check_device(q, k, v)
    _check_gpu_dtype(q)
    q3, k3, v3 = (t.reshape(B * H, t.shape[2], D).contiguous() for t in (q, k, v))   # (N, L|S, D)
    out = torch.empty_like(q3)                                                     # (N, L, D)
    lse = torch.empty(B * H, L, dtype=torch.float32, device=q.device)              # (N, L), natural log
    use_tma = _use_tma(tma, q3, k3, v3, out)
    wrap = _descriptor if use_tma else (lambda t: t)
    args = dict(Q=wrap(q3), K=wrap(k3), V=wrap(v3), O=wrap(out), LSE=lse, N=B * H, L=L, S=S, qk_scale=scale * LOG2_E)
    _launch("attn_fwd_kernel", L, B * H, config, args,
            dict(D=D, IS_CAUSAL=bool(is_causal), BLOCK_D=_block_d(D), PRECISION=_precision(q.dtype, q.device),
                 UPCAST=_upcast(q.dtype), TMA=use_tma))
    return out.reshape(B, H, L, D), lse.reshape(B, H, L)


_DQ_TIMINGS: dict[tuple, dict] = {}


_DQ_KEY = ("N", "L", "S", "D", "causal", "dtype", "tma")       # what a problem is, for the dQ-method choice


def dq_method_timings() -> list[dict]:
    """What ``backward``'s automatic choice of dQ method measured on this GPU, one dict per problem:
    N (= B*H), L, S, D, causal, dtype, tma, then "recompute" and "atomic" (ms per backward) and "chosen".

    Taught in notebook 15, "The backward kernels".
    """
    return [dict(zip(_DQ_KEY, key), **t) for key, t in _DQ_TIMINGS.items()]


def _cuda_ms(run, repeat: int = 3) -> float:
    """Milliseconds per call of ``run()`` on the current CUDA stream (after one warm-up call that tunes);
    inside ``compile_only`` one call (it compiles) and 1 ms."""
    run()
    if _COMPILE_ONLY is not None:
        return 1.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def _choose_dq_method(key: tuple, run, timer=None, methods: tuple[str, ...] = DQ_METHODS) -> str:
    """The faster of ``methods`` (``DQ_METHODS`` that fit the GPU) for this problem, timed once (``run(method)``
    runs the dK/dV and dQ kernels that way) and remembered: FlashAttention-2's atomics save two matmuls a tile
    pair and pay in L2 atomic traffic, and which side wins depends on the GPU, D and the mask. A single method
    (the other has no configuration that fits) is taken untimed; the other's time is then None."""
    timer = _cuda_ms if timer is None else timer
    if key not in _DQ_TIMINGS:
        ms = {method: timer(lambda: run(method)) if len(methods) > 1 and method in methods else None
              for method in DQ_METHODS}
        chosen = methods[0] if len(methods) == 1 else min(methods, key=ms.get)
        _DQ_TIMINGS[key] = dict(ms, chosen=chosen)
    return _DQ_TIMINGS[key]["chosen"]


def backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
             is_causal: bool = False, scale: float | None = None, block_m: int | None = None,
             block_n: int | None = None, dkdv_config: dict | None = None, dq_config: dict | None = None,
             dq_method: str | None = None, tma: bool | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the saved log-sum-exp, as FlashAttention-2 does it (notebook 11 derives it).

    Taught in notebook 15, "The backward kernels".

    First delta_i = rowsum(dO * O) (a small kernel, one float32 per query; ``D`` is the head dim). Then one program
    per key block accumulates dK and dV over the query blocks (4 matmuls a tile). dQ two ways (``dq_method``):
    "recompute", a second kernel with one program per query block accumulating dQ over the key blocks
    (3 more matmuls a tile: it recomputes Q K^T and dO V^T), deterministic; or "atomic", FlashAttention-2's
    way, where the dK/dV programs also add each tile's dS K into a float32 dQ with atomics (1 more matmul;
    the order of the additions, and so the last bits of dQ, vary from run to run). P is recomputed tile by
    tile as exp(q_i . k_j * scale - lse_i): the L x S matrix is never stored, in the backward pass either.
    Causal, only the tiles on the diagonal build a mask.

    Args:
        q, k, v: the forward's inputs; out, lse: what ``forward`` returned (lse in natural log);
        grad_out: (B, H, L, D) gradient of the output.
        block_m, block_n: both kernels' block sizes (default as in ``forward``); dkdv_config,
            dq_config: one launch configuration each, as in ``DKDV_CONFIGS`` (or ``ATOMIC_CONFIGS``), ``DQ_CONFIGS``.
        dq_method: "recompute" or "atomic"; None: "recompute" under the interpreter, and on a GPU the faster
            of the two, timed once per problem size (``dq_method_timings``) when the kernels are autotuned.
        tma: as in ``forward``.

    Returns:
        dq (B, H, L, D), dk, dv (B, H, S, D), in the inputs' dtype.
    """
    _require_triton()
    _check(q, k, v)
    B, H, L, D = q.shape
    S = k.shape[2]
    if grad_out.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"grad_out and out must be {shape_str(q)} and lse {tuple(q.shape[:3])}, got grad_out "
                         f"{shape_str(grad_out)}, out {shape_str(out)}, lse {shape_str(lse)}")
    if dq_method is not None and dq_method not in DQ_METHODS:
        raise ValueError(f"dq_method must be one of {DQ_METHODS} or None, got {dq_method!r}")
    scale = _scale(scale, D)
    dkdv_config = _config(dkdv_config, block_m, block_n, q.device)
    dq_config = _config(dq_config, block_m, block_n, q.device)
    _check_device(q, k, v, out, lse, grad_out)
    _check_gpu_dtype(q)
    N = B * H
    q3, k3, v3, do3, out3 = (t.reshape(N, t.shape[2], D).contiguous() for t in (q, k, v, grad_out.to(q.dtype), out))
    lse2d = lse.reshape(N, L).float().contiguous()                               # (N, L), natural log
    delta = torch.empty(N, L, dtype=torch.float32, device=q.device)              # (N, L) delta_i = rowsum(dO * O)
    _kernels().attn_bwd_preprocess_kernel[(math.ceil(L / PREPROCESS_BLOCK_M) * N,)](
        out3, do3, delta, N, L, D=D, BLOCK_M=PREPROCESS_BLOCK_M, BLOCK_D=_block_d(D))
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    use_tma = _use_tma(tma, q3, k3, v3, do3, dq, dk, dv)
    wrap = _descriptor if use_tma else (lambda t: t)
    Q, K, V, DO = wrap(q3), wrap(k3), wrap(v3), wrap(do3)
    meta = dict(D=D, IS_CAUSAL=bool(is_causal), BLOCK_D=_block_d(D), PRECISION=_precision(q.dtype, q.device),
                UPCAST=_upcast(q.dtype), TMA=use_tma)
    sizes = dict(N=N, L=L, S=S, qk_scale=scale * LOG2_E, scale=scale)

    def run(method: str) -> None:
        if method == "atomic":
            dq_acc = torch.zeros(N, L, D, dtype=torch.float32, device=q.device)  # (N, L, D) sum of dS K * scale
            _launch("attn_bwd_dkdv_kernel", S, N, dkdv_config, dict(Q=Q, K=K, V=V, DO=DO, LSE=lse2d, DELTA=delta,
                    DK=wrap(dk), DV=wrap(dv), DQ_ACC=dq_acc, **sizes), dict(meta, ATOMIC_DQ=True))
            dq.copy_(dq_acc)
        else:
            _launch("attn_bwd_dkdv_kernel", S, N, dkdv_config, dict(Q=Q, K=K, V=V, DO=DO, LSE=lse2d, DELTA=delta,
                    DK=wrap(dk), DV=wrap(dv), DQ_ACC=None, **sizes), dict(meta, ATOMIC_DQ=False))
            _launch("attn_bwd_dq_kernel", L, N, dq_config, dict(Q=Q, K=K, V=V, DO=DO, LSE=lse2d, DELTA=delta,
                    DQ=wrap(dq), **sizes), meta)

    if dq_method is None:
        if _compiled(q.device) and dkdv_config is None and dq_config is None:
            methods = dq_methods_for(device_limits(q.device), q.dtype, D)     # those with a configuration that fits
            if not methods:
                raise ValueError(f"neither dQ method has a launch configuration that fits the "
                                 f"{device_limits(q.device)['name']} at D = {D} in {q.dtype}")
            key = (N, L, S, D, bool(is_causal), str(q.dtype).removeprefix("torch."), use_tma)
            dq_method = _choose_dq_method(key, run, methods=methods)
        else:
            dq_method = "recompute"
    run(dq_method)
    return dq.reshape(B, H, L, D), dk.reshape(B, H, S, D), dv.reshape(B, H, S, D)


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward saves q, k, v, out and lse (O(n) extra), backward runs the backward kernels.

    ``apply(q, k, v, is_causal, scale, blocks)``: blocks None (autotuned on CUDA, ``CPU_BLOCKS`` under
    the interpreter) or (block_m, block_n) for all kernels. Gradients flow through ``out`` only; the
    returned lse is not differentiable.

    Taught in notebook 15, "The backward kernels".
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, blocks):
        block_m, block_n = (None, None) if blocks is None else blocks
        out, lse = forward(q, k, v, is_causal=is_causal, scale=scale, block_m=block_m, block_n=block_n)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = dict(is_causal=is_causal, scale=scale, block_m=block_m, block_n=block_n)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, grad_out, **ctx.options)
        return dq, dk, dv, None, None, None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, scale: float | None = None,
                    return_lse: bool = False):
    """softmax(Q K^T * scale + M) V with the Triton FlashAttention-2 kernels, differentiable.

    Taught in notebook 15, "The forward kernel".

    Same semantics as ``efficient.flash_attention`` and ``F.scaled_dot_product_attention`` on
    (B, H, L, D) inputs: ``is_causal`` lets query i see keys j <= i (top-left aligned), L and S may
    differ and need not divide the block sizes. The softmax statistics and the accumulators are
    float32 whatever the input dtype; float32 inputs on CUDA multiply in TF32. On CUDA the block
    sizes, warps and pipeline stages come from ``@triton.autotune`` per kernel and shape; under the
    interpreter ``CPU_BLOCKS``.

    Args:
        q: (B, H, L, D); k, v: (B, H, S, D); D in 16..128; float32, bfloat16 or float16.
        scale: default 1 / sqrt(D).
        return_lse: also return lse (B, H, L), float32, the natural log-sum-exp of each row.

    Returns:
        out (B, H, L, D) in q's dtype, or (out, lse) with ``return_lse``.

    Raises:
        ImportError: Triton is not installed. ValueError: shapes, dtypes, head dims or devices that do not fit.
    """
    _require_triton()
    _check(q, k, v)
    scale = _scale(scale, q.shape[-1])
    _check_device(q, k, v)
    out, lse = FlashAttentionFunction.apply(q, k, v, bool(is_causal), scale, None)
    return (out, lse) if return_lse else out
