"""Timing notebook 15's Triton kernels against torch SDPA: the numbers behind the GPU report.

``time_ms(fn, device)`` times one call: ``triton.testing.do_bench`` on CUDA (it flushes the L2
cache between calls and returns the median), ``bench.time_fn`` elsewhere. ``benchmark`` times the
Triton forward and forward + backward against SDPA after checking they agree; ``summarize`` reads
off each kernel's time as a multiple of SDPA's. ``python -m selfattn_lite.course.triton_bench``
writes them to JSON (CUDA only). The first call at a new shape runs ``@triton.autotune`` (each
configuration compiled and timed once); ``benchmark`` makes that call before it times anything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import triton_attention as ta
from . import bench, timing

__all__ = ["time_ms", "kernel_peak_tflops", "benchmark", "summarize", "main"]

IMPLS = ("torch SDPA", "triton flash_attention")


def time_ms(fn, device: torch.device | str, *, budget_s: float = 0.3) -> float:
    """Median milliseconds per call of ``fn()``: ``triton.testing.do_bench`` on CUDA (L2 flushed between
    calls, about ``budget_s`` of repetitions), ``bench.time_fn`` on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=max(1, int(1000 * budget_s)), return_mode="median"))
    return 1e3 * bench.time_fn(fn, device=device, budget_s=budget_s)


def kernel_peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """The dense peak (TFLOP/s) of the instruction the Triton kernel's ``tl.dot`` becomes on ``device``.

    From compute capability 8.0 the tensor cores in ``dtype`` (``bench.peak_tflops``); below it (a T4)
    Triton runs the dot as float32 fused multiply-adds on the CUDA cores (``ta.matmul_instruction``
    is "fma"), so the FP32 peak. None on a CPU or an unlisted GPU.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if not ta.device_limits(device)["tensor_cores"]:
        return bench.peak_tflops(device, torch.float32)
    return bench.peak_tflops(device, dtype)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _fwd_bwd(fn, q: Tensor, k: Tensor, v: Tensor, d_out: Tensor, is_causal: bool) -> tuple[Tensor, ...]:
    """One training step of attention: fn's output, then dq, dk, dv for the upstream gradient d_out."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, is_causal=is_causal)
    out.backward(d_out)
    return out, q.grad, k.grad, v.grad


def benchmark(device: torch.device | str = "cuda", *, B: int = 4, H: int = 16, ns=(4096,), head_dims=(64, 128),
              dtype: torch.dtype = torch.bfloat16, budget_s: float = 0.3) -> list[dict]:
    """Time the Triton kernels against torch SDPA, forward and forward + backward, causal and not.

    Every case is checked first: the output (and, for fwd+bwd, dq, dk, dv) must agree with SDPA's
    within half-precision tolerance; that first call also runs the autotune. FLOPs: the forward counts
    ``bench.attention_flops``; forward + backward 3.5x that (the backward's five matmuls to the
    forward's two: 2.5x), the convention of FlashAttention's papers.

    Returns:
        JSON-able records, one per (D, n, causal, pass, impl): n, B, H, D, causal, pass ("fwd" or
        "fwd+bwd"), impl ("torch SDPA" or "triton flash_attention"), ms, tflops, peak_share (against the
        peak of the instruction each one's matmuls use, ``kernel_peak_tflops`` for the kernel; None when
        the device's peak is unknown), ratio_vs_sdpa (time / SDPA's), device, dtype.
    """
    if not ta.available():
        raise ImportError(ta.UNAVAILABLE)
    device = torch.device(device)
    peaks = {"torch SDPA": bench.peak_tflops(device, dtype),
             "triton flash_attention": kernel_peak_tflops(device, dtype)}
    impls = {"torch SDPA": _sdpa, "triton flash_attention": ta.flash_attention}
    gen = torch.Generator(device="cpu").manual_seed(0)
    records = []
    for D in head_dims:
        for n in ns:
            q, k, v, d_out = (torch.randn(B, H, n, D, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
            for causal in (False, True):
                flops = bench.attention_flops(B, H, n, n, D, is_causal=causal)
                calls = {}
                for name, fn in impls.items():
                    calls[("fwd", name)] = lambda fn=fn: fn(q, k, v, is_causal=causal)
                    calls[("fwd+bwd", name)] = lambda fn=fn: _fwd_bwd(fn, q, k, v, d_out, causal)
                for pass_ in ("fwd", "fwd+bwd"):
                    with torch.set_grad_enabled(pass_ == "fwd+bwd"):
                        want, got = calls[(pass_, IMPLS[0])](), calls[(pass_, IMPLS[1])]()
                        for w, g in zip(want if pass_ == "fwd+bwd" else (want,), got if pass_ == "fwd+bwd" else (got,)):
                            torch.testing.assert_close(g.float(), w.float(), atol=3e-2, rtol=3e-2)
                        ms = {name: time_ms(calls[(pass_, name)], device, budget_s=budget_s) for name in impls}
                    work = flops if pass_ == "fwd" else 3.5 * flops
                    for name in impls:
                        tflops = work / (ms[name] / 1e3) / 1e12
                        records.append(dict(n=n, B=B, H=H, D=D, causal=causal, impl=name, ms=ms[name],
                                            tflops=tflops,
                                            peak_share=None if peaks[name] is None else tflops / peaks[name],
                                            ratio_vs_sdpa=ms[name] / ms[IMPLS[0]], device=bench.device_name(device),
                                            dtype=str(dtype).replace("torch.", ""), **{"pass": pass_}))
    return records


def summarize(records: list[dict], *, n: int = 4096, D: int = 128) -> dict:
    """The kernel's time relative to SDPA's, per mask, at n and D: t_kernel / t_SDPA (1 = as fast, 2 = twice
    SDPA's time), the course's one ratio convention.

    forward_ratio = Triton's forward time / SDPA's (goal <= 2: at least half SDPA's speed);
    backward_ratio = Triton's backward time / SDPA's (goal <= 3), each backward time being
    (fwd+bwd) - fwd; and each one's share of peak on the forward + backward FLOPs (None on an
    unknown device).
    """
    def find(is_causal, pass_, impl):
        for r in records:
            if (r["n"], r["D"], r["causal"], r["pass"], r["impl"]) == (n, D, is_causal, pass_, impl):
                return r
        raise ValueError(f"no record for n={n}, D={D}, is_causal={is_causal}, pass={pass_}, impl={impl}")

    out = {}
    for causal in (False, True):
        ours = {p: find(causal, p, IMPLS[1]) for p in ("fwd", "fwd+bwd")}
        sdpa = {p: find(causal, p, IMPLS[0]) for p in ("fwd", "fwd+bwd")}
        fwd_ratio = ours["fwd"]["ms"] / sdpa["fwd"]["ms"]
        bwd_ratio = (ours["fwd+bwd"]["ms"] - ours["fwd"]["ms"]) / (sdpa["fwd+bwd"]["ms"] - sdpa["fwd"]["ms"])
        out["causal" if causal else "full"] = dict(
            forward_ratio=fwd_ratio, backward_ratio=bwd_ratio, forward_goal_met=fwd_ratio <= 2.0,
            backward_goal_met=bwd_ratio <= 3.0, triton_peak_share=ours["fwd+bwd"]["peak_share"],
            sdpa_peak_share=sdpa["fwd+bwd"]["peak_share"], triton_fwd_tflops=ours["fwd"]["tflops"],
            sdpa_fwd_tflops=sdpa["fwd"]["tflops"])
    return out


def main(argv: list[str] | None = None) -> None:
    """python -m selfattn_lite.course.triton_bench --out figures/gpu/triton_attention.json (CUDA only)"""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", default="figures/gpu/triton_attention.json")
    parser.add_argument("--budget-s", type=float, default=0.3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the Triton benchmark needs a CUDA GPU (on CPU the interpreter checks correctness only)")
    kernels = timing.timing_setup("kernels")      # this GPU's dtype, and the batch that fits its memory
    records = benchmark("cuda", B=kernels.sizes["B"], H=kernels.sizes["H"], ns=(kernels.sizes["L"],),
                        dtype=kernels.dtype, budget_s=args.budget_s)
    goal = {D: summarize(records, n=kernels.sizes["L"], D=D) for D in sorted({r["D"] for r in records})}
    configs = dict(fwd=ta.FWD_CONFIGS, dkdv=ta.DKDV_CONFIGS, atomic=ta.ATOMIC_CONFIGS, dq=ta.DQ_CONFIGS)
    result = dict(records=records, goal=goal, configs=configs, dq_methods=ta.dq_method_timings())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(goal, indent=1))


if __name__ == "__main__":
    main()
