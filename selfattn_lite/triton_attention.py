"""FlashAttention as a Triton kernel: the tiled algorithm of notebook 08 as a real GPU program.

``flash_attention(q, k, v, *, is_causal=False, scale=None, return_lse=False)`` computes
softmax(Q K^T * scale + M) V on (B, H, L, D) tensors, like ``efficient.flash_attention`` and torch's
``scaled_dot_product_attention``, with a FlashAttention-2 forward kernel and a backward pass
(dQ, dK, dV recomputed from the saved log-sum-exp) wrapped in a ``torch.autograd.Function``.
The kernels themselves live in ``selfattn_lite.triton_kernels``.

Triton is an optional extra (``pip install -e ".[triton]"``, Linux only). Without a GPU the kernels
run under Triton's interpreter: this module sets ``TRITON_INTERPRET=1`` (unless you set it
yourself) *before* Triton is imported, because Triton reads it when a kernel is decorated. The
interpreter executes each program instance with numpy, one after another: exact, and slow (it
checks correctness; it says nothing about speed). Where Triton is not installed, ``available()``
is False and ``flash_attention`` raises an ImportError saying so; the pure-Python helpers below
(loop bounds, traffic formulas) work everywhere.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch
from torch import Tensor

from ._checks import check_int, check_positive_int, shape_str

if not torch.cuda.is_available():                       # before anything imports triton (see the docstring)
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAVE_TRITON = importlib.util.find_spec("triton") is not None   # False on macOS, Windows: no Triton wheel

__all__ = [
    "HAVE_TRITON",
    "UNAVAILABLE",
    "DTYPES",
    "MIN_HEAD_DIM",
    "MAX_HEAD_DIM",
    "available",
    "interpreting",
    "default_blocks",
    "key_block_bounds",
    "key_blocks_visited",
    "program_grid",
    "hbm_bytes",
    "program_work",
    "forward",
    "backward",
    "FlashAttentionFunction",
    "flash_attention",
    "CUDA_FWD_CONFIGS",
    "CUDA_BWD_CONFIGS",
    "benchmark",
    "summarize",
]

UNAVAILABLE = ("Triton is not installed: it ships for Linux only (pip install -e '.[triton]'). "
               "The Triton kernel cannot run here; the rest of the course does not need it.")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
CPU_BLOCKS = (32, 32)                  # under the interpreter: small tiles, few rows of padding at small L
CUDA_BLOCKS = (128, 64)                # before autotuning: FlashAttention-2's usual forward tile for d = 128
LOG2_E = math.log2(math.e)

# Candidate launch configurations for the small CUDA autotune (never used by the interpreter).
CUDA_FWD_CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
]
CUDA_BWD_CONFIGS = [                   # dK/dV: a large key block stays, query blocks stream; dQ: the reverse
    dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2),
]


def available() -> bool:
    """True when Triton is installed, so ``flash_attention`` can run (on a GPU or the interpreter)."""
    return HAVE_TRITON


def interpreting() -> bool:
    """True when kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _require_triton() -> None:
    if not HAVE_TRITON:
        raise ImportError(UNAVAILABLE)


def _kernels():
    """``selfattn_lite.triton_kernels``, imported on first launch (importing Triton takes a moment, and the
    widget and figures that import this module need none of it)."""
    _require_triton()
    from . import triton_kernels

    return triton_kernels


def default_blocks(device: torch.device | str = "cpu") -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) used when none is given: (32, 32) for the interpreter, (128, 64) on CUDA."""
    return CUDA_BLOCKS if torch.device(device).type == "cuda" and not interpreting() else CPU_BLOCKS


# ---------------------------------------------------------------------------------------------
# The arithmetic of the kernel, in plain Python: loop bounds, grid, memory traffic, work
# ---------------------------------------------------------------------------------------------

def _block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of 2 >= 16 (tl.arange and tl.dot need it), got {value!r}")
    return value


def key_block_bounds(q0: int, block_m: int, block_n: int, S: int, is_causal: bool) -> tuple[int, int]:
    """Where one query block's loop over key blocks switches to masking, and where it ends.

    The program of queries q0 ... q0 + block_m - 1 visits key blocks starting at 0, block_n, ...:
    those before ``unmasked_end`` with no mask (every key is visible to every query of the block and
    lies inside S), those from ``unmasked_end`` to ``end`` with the mask. Causal (key j <= query i):
    a key block is whole for every query iff it ends at or before q0, so
    unmasked_end = floor((q0 + 1) / block_n) * block_n, and no query sees a key >= q0 + block_m, so
    end = min(S, q0 + block_m). Not causal: unmasked_end = floor(S / block_n) * block_n, end = S.

    Returns:
        (unmasked_end, end), both key offsets; unmasked_end is a multiple of block_n and <= end.
    """
    for name, value in (("q0", q0), ("block_m", block_m), ("block_n", block_n), ("S", S)):
        if name != "q0":
            check_positive_int(name, value)
    q0 = check_int("q0", q0, low=0)
    if is_causal:
        return min((q0 + 1) // block_n, S // block_n) * block_n, min(S, q0 + block_m)
    return (S // block_n) * block_n, S


def key_blocks_visited(q0: int, block_m: int, block_n: int, S: int, is_causal: bool) -> tuple[int, int]:
    """(unmasked, masked) number of key blocks the program of queries q0 ... loads."""
    unmasked_end, end = key_block_bounds(q0, block_m, block_n, S, is_causal)
    return unmasked_end // block_n, max(0, math.ceil(end / block_n) - unmasked_end // block_n)


def program_grid(B: int, H: int, L: int, block_m: int) -> tuple[int, int]:
    """The launch grid of the forward kernel: (ceil(L / block_m) query blocks, B * H heads)."""
    for name, value in (("B", B), ("H", H), ("L", L), ("block_m", block_m)):
        check_positive_int(name, value)
    return math.ceil(L / block_m), B * H


def hbm_bytes(L: int, S: int, D: int, block_m: int, block_n: int, *, B: int = 1, H: int = 1,
              is_causal: bool = False, bytes_per_element: int = 2) -> dict[str, int]:
    """Bytes the forward kernel moves between HBM and the chip, counted block by block.

    Each program reads its Q block once, then K and V block by block for every key block it
    visits (so K and V are read ceil(L / block_m) times each without a mask, about half as often
    causal), and writes its O block and its log-sum-exp (float32) once. The L x S scores never
    leave the chip. ``explicit`` is what materialising them costs at the least: write S = Q K^T,
    read it for the softmax, write P, read P for P V (4 L S elements), plus reading Q, K, V and
    writing O once.

    Returns:
        dict with q, kv, o (incl. lse) and total bytes of the kernel, and explicit (bytes).
    """
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
    bytes it keeps on chip (its Q block, one K and one V block, the float32 scores and accumulator)."""
    unmasked, masked = key_blocks_visited(q0, block_m, block_n, S, is_causal)
    per_block = 4 * block_m * block_n * D          # S = Q K^T and P V: 2 * block_m * block_n * D each
    on_chip = (block_m * D + 2 * block_n * D) * bytes_per_element + (block_m * block_n + block_m * D + 2 * block_m) * 4
    return dict(key_blocks=unmasked + masked, masked_blocks=masked, flops_per_block=per_block,
                flops=per_block * (unmasked + masked), on_chip_bytes=on_chip)


# ---------------------------------------------------------------------------------------------
# Checking inputs and launching the kernels
# ---------------------------------------------------------------------------------------------

def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, L, D), 4 dims, got shape {shape_str(t)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype of float32, bfloat16, float16, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, H, S, D), got k {shape_str(k)} and v {shape_str(v)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, L, D) and k (B, H, S, D) must share B, H and D, got q {shape_str(q)} "
                         f"and k {shape_str(k)}")
    if not MIN_HEAD_DIM <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {q.shape[3]} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM} (q {shape_str(q)})")
    if q.shape[0] * q.shape[1] == 0 or q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"need at least one head, one query and one key, got q {shape_str(q)} and k {shape_str(k)}")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"q is on {q.device}: Triton kernels run on CUDA tensors, or on CPU tensors under "
                         "the interpreter (set TRITON_INTERPRET=1 before triton is imported)")


def _scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _blocks(block_m, block_n, device) -> tuple[int, int]:
    dm, dn = default_blocks(device)
    return _block("block_m", dm if block_m is None else block_m), _block("block_n", dn if block_n is None else block_n)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"    # fp32 exact (no TF32); half inputs ignore it


def _block_d(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())            # tl.arange needs a power of 2: pad D, mask the rest


def _upcast(dtype: torch.dtype) -> bool:
    return interpreting() and dtype == torch.bfloat16     # see triton_kernels.dot


def _launch_options(device: torch.device, config: dict | None) -> dict:
    if device.type != "cuda" or interpreting() or config is None:
        return {}
    return dict(num_warps=config["num_warps"], num_stages=config["num_stages"])


def forward(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, scale: float | None = None,
            block_m: int | None = None, block_n: int | None = None, config: dict | None = None
            ) -> tuple[Tensor, Tensor]:
    """The forward kernel, no autograd: one program per (query block, batch * head).

    Args:
        q: (B, H, L, D); k, v: (B, H, S, D); D in 16..128; float32, bfloat16 or float16.
        is_causal: key j <= query i (top-left aligned, as torch's is_causal).
        scale: default 1 / sqrt(D).
        block_m, block_n: queries per program, keys per loop step (powers of 2 >= 16);
            default ``default_blocks(q.device)``, or ``config``'s (a CUDA launch configuration).

    Returns:
        out (B, H, L, D) in q's dtype, and lse (B, H, L) float32: the natural log-sum-exp of each
        query's scaled scores, log sum_j exp(q_i . k_j * scale + M_ij).
    """
    _require_triton()
    _check(q, k, v)
    B, H, L, D = q.shape
    S = k.shape[2]
    scale = _scale(scale, D)
    if config is not None:
        block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    block_m, block_n = _blocks(block_m, block_n, q.device)
    q3, k3, v3 = (t.reshape(B * H, t.shape[2], D).contiguous() for t in (q, k, v))   # (N, L|S, D)
    out = torch.empty_like(q3)                                                     # (N, L, D)
    lse2 = torch.empty(B * H, L, dtype=torch.float32, device=q.device)             # (N, L), base 2
    grid = program_grid(B, H, L, block_m)
    _kernels().attn_fwd_kernel[grid](q3, k3, v3, out, lse2, L, S, D, scale * LOG2_E,
                                  IS_CAUSAL=bool(is_causal), BLOCK_M=block_m, BLOCK_N=block_n,
                                  BLOCK_D=_block_d(D), PRECISION=_precision(q.dtype), UPCAST=_upcast(q.dtype),
                                  **_launch_options(q.device, config))
    return out.reshape(B, H, L, D), (lse2 * math.log(2.0)).reshape(B, H, L)


def backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *, is_causal: bool = False,
             scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
             config: dict | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the saved log-sum-exp, as FlashAttention-2 does it (notebook 11 derives it).

    D_i = rowsum(dO * O) is computed first (one float32 number per query); then one kernel with a
    program per key block accumulates dK and dV over the query blocks, and one with a program per
    query block accumulates dQ over the key blocks. P is recomputed tile by tile as
    exp(q_i . k_j * scale - lse_i): the L x S matrix is never stored, in the backward pass either.

    Args:
        do: (B, H, L, D) gradient of the output; out, lse: what ``forward`` returned.

    Returns:
        dq (B, H, L, D), dk, dv (B, H, S, D), in the inputs' dtype.
    """
    _require_triton()
    _check(q, k, v)
    B, H, L, D = q.shape
    S = k.shape[2]
    if do.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"do and out must be {shape_str(q)} and lse {tuple(q.shape[:3])}, got do {shape_str(do)}, "
                         f"out {shape_str(out)}, lse {shape_str(lse)}")
    scale = _scale(scale, D)
    if config is not None:
        block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    block_m, block_n = _blocks(block_m, block_n, q.device)
    q3, k3, v3, do3 = (t.reshape(B * H, t.shape[2], D).contiguous() for t in (q, k, v, do.to(q.dtype)))
    delta = (do3.float() * out.reshape(B * H, L, D).float()).sum(-1)          # (N, L) D_i = rowsum(dO * O)
    lse2 = (lse.reshape(B * H, L).float() * LOG2_E).contiguous()             # (N, L) base 2, as the kernels use
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = dict(IS_CAUSAL=bool(is_causal), BLOCK_M=block_m, BLOCK_N=block_n,
                  BLOCK_D=_block_d(D), PRECISION=_precision(q.dtype), UPCAST=_upcast(q.dtype),
                  **_launch_options(q.device, config))
    _kernels().attn_bwd_dkdv_kernel[(math.ceil(S / block_n), B * H)](
        q3, k3, v3, do3, lse2, delta, dk, dv, L, S, D, scale * LOG2_E, scale, **common)
    _kernels().attn_bwd_dq_kernel[(math.ceil(L / block_m), B * H)](
        q3, k3, v3, do3, lse2, delta, dq, L, S, D, scale * LOG2_E, scale, **common)
    return dq.reshape(B, H, L, D), dk.reshape(B, H, S, D), dv.reshape(B, H, S, D)


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward saves q, k, v, out and lse (O(n) extra), backward runs the two
    backward kernels. Gradients flow through ``out`` only; the returned lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, block_m, block_n, fwd_config, bwd_config):
        out, lse = forward(q, k, v, is_causal=is_causal, scale=scale, block_m=block_m, block_n=block_n,
                           config=fwd_config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = dict(is_causal=is_causal, scale=scale, config=bwd_config,
                           block_m=None if bwd_config else block_m, block_n=None if bwd_config else block_n)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(dout, q, k, v, out, lse, **ctx.options)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, scale: float | None = None,
                    return_lse: bool = False):
    """softmax(Q K^T * scale + M) V with the Triton FlashAttention-2 kernels, differentiable.

    Same semantics as ``efficient.flash_attention`` and ``F.scaled_dot_product_attention`` on
    (B, H, L, D) inputs: ``is_causal`` lets query i see keys j <= i (top-left aligned), L and S may
    differ and need not divide the block sizes. The softmax statistics and the accumulators are
    float32 whatever the input dtype. On CUDA the block sizes come from a small autotune per shape
    (``CUDA_FWD_CONFIGS``, ``CUDA_BWD_CONFIGS``); under the interpreter ``default_blocks``.

    Args:
        q: (B, H, L, D); k, v: (B, H, S, D); D in 16..128; float32, bfloat16 or float16.
        scale: default 1 / sqrt(D).
        return_lse: also return lse (B, H, L), float32, the natural log-sum-exp of each row.

    Returns:
        out (B, H, L, D) in q's dtype, or (out, lse) with ``return_lse``.

    Raises:
        ImportError: Triton is not installed. ValueError: shapes, dtypes or head dims that do not fit.
    """
    _require_triton()
    _check(q, k, v)
    scale = _scale(scale, q.shape[-1])
    fwd_config = bwd_config = None
    if q.device.type == "cuda" and not interpreting():
        fwd_config, bwd_config = _tuned(q, k, v, bool(is_causal), scale)
    out, lse = FlashAttentionFunction.apply(q, k, v, bool(is_causal), scale, None, None, fwd_config, bwd_config)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# CUDA only: a small autotune and the benchmark behind the GPU report (never run under the interpreter)
# ---------------------------------------------------------------------------------------------

_TUNED: dict[tuple, tuple[dict, dict]] = {}


def _tuned(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float) -> tuple[dict, dict]:
    """The fastest forward and backward configurations for this shape, timed once and cached."""
    from .course import bench

    key = (q.shape[2], k.shape[2], q.shape[3], q.dtype, is_causal, bench.device_name(q.device))
    if key not in _TUNED:
        with torch.no_grad():
            fwd_time = {}
            for i, cfg in enumerate(CUDA_FWD_CONFIGS):
                try:
                    fwd_time[i] = bench.time_fn(lambda cfg=cfg: forward(q, k, v, is_causal=is_causal, scale=scale,
                                                                        config=cfg), device=q.device, warmup=1,
                                                repeat=5)
                except Exception:      # a configuration the device cannot fit (shared memory): skip it
                    continue
            fwd = CUDA_FWD_CONFIGS[min(fwd_time, key=fwd_time.get)]
            out, lse = forward(q, k, v, is_causal=is_causal, scale=scale, config=fwd)
            do = torch.randn_like(out)
            bwd_time = {}
            for i, cfg in enumerate(CUDA_BWD_CONFIGS):
                try:
                    bwd_time[i] = bench.time_fn(lambda cfg=cfg: backward(do, q, k, v, out, lse, is_causal=is_causal,
                                                                         scale=scale, config=cfg),
                                                device=q.device, warmup=1, repeat=5)
                except Exception:
                    continue
            _TUNED[key] = (fwd, CUDA_BWD_CONFIGS[min(bwd_time, key=bwd_time.get)])
    return _TUNED[key]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False) -> Tensor:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _fwd_bwd(fn, q: Tensor, k: Tensor, v: Tensor, d_out: Tensor, is_causal: bool) -> tuple[Tensor, ...]:
    """One training step of attention: fn's output, then dq, dk, dv for the upstream gradient d_out."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, is_causal=is_causal)
    out.backward(d_out)
    return out, q.grad, k.grad, v.grad


def benchmark(device: torch.device | str = "cuda", *, B: int = 1, H: int = 16, ns=(1024, 2048, 4096),
              head_dims=(64, 128), dtype: torch.dtype = torch.bfloat16, budget_s: float = 0.5) -> list[dict]:
    """Time the Triton kernels against torch SDPA, forward and forward + backward, causal and not.

    For the GPU report (``make gpu-report``). The goal at n = 4096, h = 16, d = 128, bf16: the forward
    within 2x of SDPA's time, forward + backward within 3x. Every configuration is checked first: the
    output (and, for fwd+bwd, dq, dk, dv) must agree with SDPA's within bf16 tolerance. FLOPs: the forward
    counts ``bench.attention_flops``; forward + backward 3.5x that (the backward has five matmuls to the
    forward's two: 2.5x), the convention of FlashAttention's papers.

    Returns:
        JSON-able records, one per (D, n, causal, pass, impl): n, B, H, D, causal, pass ("fwd" or
        "fwd+bwd"), impl ("torch SDPA" or "triton flash_attention"), ms, tflops, peak_share (None when
        the device's peak is unknown), ratio_vs_sdpa, device, dtype.
    """
    from .course import bench

    _require_triton()
    device = torch.device(device)
    peak = bench.peak_tflops(device, dtype)
    impls = {"torch SDPA": _sdpa, "triton flash_attention": flash_attention}
    gen = torch.Generator(device="cpu").manual_seed(0)
    records = []
    for D in head_dims:
        for n in ns:
            q, k, v, d_out = (torch.randn(B, H, n, D, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
            for causal in (False, True):
                flops = bench.attention_flops(B, H, n, n, D, causal=causal)
                calls = {}
                for name, fn in impls.items():
                    calls[("fwd", name)] = lambda fn=fn: fn(q, k, v, is_causal=causal)
                    calls[("fwd+bwd", name)] = lambda fn=fn: _fwd_bwd(fn, q, k, v, d_out, causal)
                for pass_ in ("fwd", "fwd+bwd"):
                    with torch.set_grad_enabled(pass_ == "fwd+bwd"):
                        want, got = calls[(pass_, "torch SDPA")](), calls[(pass_, "triton flash_attention")]()
                        for w, g in zip(want if pass_ == "fwd+bwd" else (want,), got if pass_ == "fwd+bwd" else (got,)):
                            torch.testing.assert_close(g.float(), w.float(), atol=3e-2, rtol=3e-2)
                        seconds = {name: bench.time_fn(calls[(pass_, name)], device=device, budget_s=budget_s)
                                   for name in impls}
                    work = flops if pass_ == "fwd" else 3.5 * flops
                    for name in impls:
                        tflops = work / seconds[name] / 1e12
                        records.append(dict(n=n, B=B, H=H, D=D, causal=causal, impl=name, ms=1e3 * seconds[name],
                                            tflops=tflops, peak_share=None if peak is None else tflops / peak,
                                            ratio_vs_sdpa=seconds[name] / seconds["torch SDPA"],
                                            device=bench.device_name(device),
                                            dtype=str(dtype).replace("torch.", ""), **{"pass": pass_}))
    return records


def summarize(records: list[dict], *, n: int = 4096, D: int = 128) -> dict:
    """The performance goal read off ``benchmark`` records, per mask, at n and D.

    forward_ratio = Triton's forward time / SDPA's (goal <= 2); backward_ratio = Triton's backward time /
    SDPA's (goal <= 3), each backward time being (fwd+bwd) - fwd; and each one's share of peak on the
    forward + backward FLOPs (None on an unknown device).
    """
    def ms(causal, pass_, impl):
        for r in records:
            if (r["n"], r["D"], r["causal"], r["pass"], r["impl"]) == (n, D, causal, pass_, impl):
                return r
        raise ValueError(f"no record for n={n}, D={D}, causal={causal}, pass={pass_}, impl={impl}")

    out = {}
    for causal in (False, True):
        ours = {p: ms(causal, p, "triton flash_attention") for p in ("fwd", "fwd+bwd")}
        sdpa = {p: ms(causal, p, "torch SDPA") for p in ("fwd", "fwd+bwd")}
        fwd_ratio = ours["fwd"]["ms"] / sdpa["fwd"]["ms"]
        bwd_ratio = (ours["fwd+bwd"]["ms"] - ours["fwd"]["ms"]) / (sdpa["fwd+bwd"]["ms"] - sdpa["fwd"]["ms"])
        out["causal" if causal else "full"] = dict(
            forward_ratio=fwd_ratio, backward_ratio=bwd_ratio, forward_goal_met=fwd_ratio <= 2.0,
            backward_goal_met=bwd_ratio <= 3.0, triton_peak_share=ours["fwd+bwd"]["peak_share"],
            sdpa_peak_share=sdpa["fwd+bwd"]["peak_share"], triton_fwd_tflops=ours["fwd"]["tflops"],
            sdpa_fwd_tflops=sdpa["fwd"]["tflops"])
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m selfattn_lite.triton_attention --out figures/gpu/triton_attention.json`` (CUDA only)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", default="figures/gpu/triton_attention.json")
    parser.add_argument("--budget-s", type=float, default=0.3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the Triton benchmark needs a CUDA GPU (on CPU the interpreter checks correctness only)")
    records = benchmark("cuda", budget_s=args.budget_s)
    result = dict(records=records, goal=summarize(records), fwd_configs=CUDA_FWD_CONFIGS, bwd_configs=CUDA_BWD_CONFIGS)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["goal"], indent=1))


if __name__ == "__main__":
    main()
