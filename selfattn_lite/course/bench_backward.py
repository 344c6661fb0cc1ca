"""Notebook 11's benchmark: forward + backward of explicit, tiled and fused attention, time and memory.

    python -m selfattn_lite.course.bench_backward --out figures/bench_backward_cpu.json

writes a JSON of every measurement and, next to it, a plot (same name, .png). One training
step of attention is timed: the forward, then the backward for a fixed dO, returning dQ, dK
and dV. Before anything is timed, the three implementations' gradients are checked against
torch SDPA's with ``assert_close``.

* explicit: ``selfattn_lite.scaled_dot_product_attention`` under autograd, which keeps the
  (B, h, n, n) weights (and more) for the backward;
* tiled: ``efficient.flash_attention``, whose backward recomputes P tile by tile from the
  saved log-sum-exp and keeps only O(n) per head;
* torch SDPA: ``F.scaled_dot_product_attention`` (its fused CPU kernel has its own tiled backward).

Peak memory comes from ``memory.peak_memory`` (CPU: the profiler's allocation log;
CUDA: the caching allocator's peak), above the inputs; the gradients themselves count.

The targets (issue 14), at n = 4096, B = 1, h = 8, dk = 64, float32 on CPU: the tiled version's
peak memory at most 1/8 of explicit attention's, its time within 3x of SDPA's. Run as a script,
the benchmark checks them and says PASSED or FAILED; no test times anything.

As everywhere in the package, ``OMP_WAIT_POLICY`` is PASSIVE unless set otherwise (idle OpenMP
threads then sleep instead of spinning on a shared machine).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..efficient import flash_attention
from . import bench
from .bench_efficient import EXPLICIT, SDPA, TILED, attention_inputs, command_line, provenance, save, target_ratios
from .memory import peak_memory

__all__ = ["TARGET_MEMORY_RATIO", "TARGET_TIME_RATIO", "forward_backward", "implementations", "step_flops",
           "measure", "check_targets", "run", "main"]

TARGET_MEMORY_RATIO, TARGET_TIME_RATIO = 1 / 8, 3.0


def forward_backward(attn, q, k, v, grad_out, **kwargs) -> tuple:
    """One training step of attention: out = attn(q, k, v, **kwargs), then (dq, dk, dv) for dO = grad_out.

    Works under ``torch.no_grad()`` too (it turns grad on for itself), so ``bench.compare``
    and ``peak_memory`` can call it.
    """
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = attn(q, k, v, **kwargs)
        return torch.autograd.grad(out, (q, k, v), grad_out)


def _explicit(q, k, v, **kwargs):
    return scaled_dot_product_attention(q, k, v, **kwargs)[0]


def implementations(q, k, v, grad_out, *, is_causal: bool = False, block_size=None,
                    explicit: bool = True) -> dict:
    """name -> zero-argument callable returning (dq, dk, dv), for ``bench.compare`` and ``peak_memory``."""
    calls = {SDPA: lambda: forward_backward(F.scaled_dot_product_attention, q, k, v, grad_out, is_causal=is_causal),
             TILED: lambda: forward_backward(flash_attention, q, k, v, grad_out, is_causal=is_causal,
                                             block_size=block_size)}
    if explicit:
        calls[EXPLICIT] = lambda: forward_backward(_explicit, q, k, v, grad_out, is_causal=is_causal)
    return calls


def step_flops(B: int, H: int, n: int, D: int, *, is_causal: bool = False) -> dict:
    """name -> FLOPs of one forward + backward of self-attention at length n, as each implementation does it.

    The forward is two matrix products (S = Q Kᵀ, O = P V), ``bench.attention_flops``. Explicit
    attention's backward is four more (dV, dP, dQ, dK): 3x the forward, and it computes every score
    whether or not a causal mask hides it (the full count). The tiled and fused kernels recompute S
    in the backward, five products: 3.5x the forward, with a causal mask's scores counted as half
    (the usual convention). What each kernel computes differs from that count: the tiled kernel skips
    the tiles above the diagonal and trims the key columns of a diagonal tile that no query in it may
    see (``efficient.tile_plan``; 3/4 of the scores at n = 512 in 256 x 512 tiles); SDPA's CPU kernel
    skips whole kv blocks of kv_split = 512 keys but computes every score of the blocks it visits
    (``FlashAttentionKernel.cpp``), so at n <= 512, one block, it computes them all.
    """
    full = bench.attention_flops(B, H, n, n, D)
    skipping = bench.attention_flops(B, H, n, n, D, is_causal=is_causal)
    return {SDPA: 3.5 * skipping, TILED: 3.5 * skipping, EXPLICIT: 3.0 * full}


def _check_all_grads(calls: dict, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """dq, dk and dv of every implementation agree with torch SDPA's (``bench.compare`` checks dq only)."""
    expected = calls[SDPA]()
    for name, fn in calls.items():
        for which, got, want in zip("qkv", fn(), expected, strict=True):
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol,
                                       msg=lambda m, n=name, w=which: f"{n}: d{w} disagrees with SDPA's: {m}")


def _inputs(B, H, n, D, dtype=torch.float32, device="cpu"):
    q, k, v = attention_inputs(B, H, n, D, dtype=dtype, device=device)
    grad_out = attention_inputs(B, H, n, D, dtype=dtype, device=device, seed=1)[0]
    return q, k, v, grad_out


def measure(ns, *, B: int = 1, H: int = 8, D: int = 64, dtype=torch.float32, device="cpu",
            is_causal: bool = False, block_size=None, budget_s: float = 0.5) -> list[dict]:
    """Time and peak memory of forward + backward of the three implementations at each n.

    Returns:
        One dict per (n, implementation): n, impl, ms, ratio_vs_sdpa, peak_mib, max_abs_err (of dq).
    """
    device = torch.device(device)
    records = []
    for n in ns:
        q, k, v, grad_out = _inputs(B, H, n, D, dtype, device)
        flops = step_flops(B, H, n, D, is_causal=is_causal)                      # name -> FLOPs of one step
        calls = implementations(q, k, v, grad_out, is_causal=is_causal, block_size=block_size)
        _check_all_grads(calls, **({} if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)))
        rows = bench.compare(calls, reference=SDPA, flops=flops, device=device, budget_s=budget_s)
        for row in rows:
            peak = peak_memory(calls[row.name], device) / 2**20
            records.append(dict(n=n, impl=row.name, ms=row.ms, ratio_vs_sdpa=row.ratio, peak_mib=peak,
                                max_abs_err=row.max_abs_err, flops=flops[row.name], device=row.device,
                                dtype=row.dtype, gflops=row.gflops))
        del q, k, v, grad_out, calls
    return records


def check_targets(*, n: int = 4096, B: int = 1, H: int = 8, D: int = 64, rounds: int = 3,
                  block_size=None, budget_s: float = 1.0) -> dict:
    """The CPU targets at n = 4096, float32: memory and time ratios of forward + backward.

    The time ratio tiled / SDPA is measured ``rounds`` times (each one ``bench.compare`` run,
    so both see the same machine load); the median is reported with every round.
    """
    q, k, v, grad_out = _inputs(B, H, n, D)
    calls = implementations(q, k, v, grad_out, block_size=block_size)
    _check_all_grads(calls)
    return target_ratios(calls, dict(n=n, B=B, H=H, D=D), rounds=rounds, block_size=block_size, budget_s=budget_s,
                         memory_target=TARGET_MEMORY_RATIO, time_target=TARGET_TIME_RATIO)


def run(out: str | Path, *, device: str | None = None, ns=None, targets: bool = True,
        budget_s: float = 0.5) -> dict:
    """Measure, write ``out`` (JSON) and the plot next to it; return the results."""
    device = torch.device(device) if device is not None else bench.best_device()
    if device.type == "cuda":
        B, H, D, dtype, default_ns = 1, 16, 128, torch.bfloat16, [1024, 2048, 4096, 8192]
    else:
        B, H, D, dtype, default_ns = 1, 8, 64, torch.float32, [256, 512, 1024, 2048, 4096]
    ns = list(ns) if ns is not None else default_ns
    records = measure(ns, B=B, H=H, D=D, dtype=dtype, device=device, budget_s=budget_s)
    result = dict(what="forward + backward", **provenance(device, B, H, D, dtype), records=records)
    if targets and device.type == "cpu":
        result["targets"] = check_targets()
    save(out, result, title=f"forward + backward: {result['device']}, {result['dtype']}, B={B}, h={H}, dk={D}",
         time_title=TIME_TITLE)
    return result


TIME_TITLE = ("Time: all three grow like n²; the tiled and fused ones recompute S "
              "(3.5× the forward's FLOPs, explicit 3×)")


def main(argv=None) -> None:
    command_line("selfattn_lite.course.bench_backward", __doc__.splitlines()[0], run, argv,
                 what=" (forward + backward)")


if __name__ == "__main__":
    main()
