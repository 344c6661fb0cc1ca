"""Notebook 08's benchmark: explicit, tiled and fused attention at growing n, time and memory.

    python -m selfattn_lite.course.bench_efficient --out figures/bench_efficient_cpu.json

writes a JSON of every measurement and, next to it, a plot (same name, .png). On CUDA
(bf16, or fp16 before compute capability 8.0; n up to 16k) or on CPU (float32, n up to 4k), whichever is
present, or ``--device``.

Each size is one ``bench.compare`` run: the three implementations are checked against torch
SDPA with ``assert_close`` first, then timed one after the other, so their ratios come from
the same minute of the same machine. Peak memory comes from ``memory.peak_memory``
(CUDA: the caching allocator's peak counter; CPU: the profiler's allocation log).

The performance targets (issue 7), checked at n = 4096, B = 1, h = 8, dk = 64, float32 on CPU:
the tiled version's peak memory at most 1/8 of explicit attention's, its time within 2x of SDPA.

Importing ``selfattn_lite`` sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads OpenMP, unless it is
already set (``OMP_WAIT_POLICY=ACTIVE`` keeps OpenMP spinning). With OpenMP's default, torch's idle
CPU threads spin while they wait for a sibling; on a machine shared with other jobs that sibling is
often descheduled, and a kernel made of many small ops (the tiled one, ~7 parallel regions per tile)
loses far more time to it than one fused op (SDPA): measured on this course's shared 2-core machine
at load ~3, tiled/SDPA went from 1.3x to 12x. The JSON records the setting and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..efficient import default_block_size, flash_attention
from . import bench
from .memory import peak_memory

__all__ = ["IMPLS", "default_config", "attention_inputs", "implementations", "interleaved_times",
           "interleaved_min_times", "measure", "bench_rows", "check_targets",
           "plot_scaling", "run", "main"]

EXPLICIT, TILED, SDPA = "explicit (selfattn_lite)", "tiled (flash_attention)", "torch SDPA"
IMPLS = (EXPLICIT, TILED, SDPA)
COLORS = {EXPLICIT: "#D55E00", TILED: "#0072B2", SDPA: "#009E73"}   # Okabe-Ito
TARGET_MEMORY_RATIO, TARGET_TIME_RATIO = 1 / 8, 2.0


def default_config(device: torch.device | str | None = None) -> dict:
    """Sizes of the full benchmark: CUDA up to 16k tokens, CPU float32 up to 4k.

    On CUDA the dtype is ``timing.timing_dtype``'s: bfloat16 from compute capability 8.0, float16 below
    (a T4's fused SDPA kernels take float16, not bfloat16; without one SDPA would form the n x n scores).
    """
    from .timing import DeviceInfo, timing_dtype

    device = torch.device(device) if device is not None else bench.best_device()
    if device.type == "cuda":
        dtype = timing_dtype(DeviceInfo.probe())          # device 0, the one timed
        return dict(B=1, H=16, D=128, dtype=dtype, ns=[1024, 2048, 4096, 8192, 16384])
    return dict(B=1, H=8, D=64, dtype=torch.float32, ns=[256, 512, 1024, 2048, 4096])


def attention_inputs(B: int, H: int, n: int, D: int, *, dtype=torch.float32, device="cpu", seed: int = 0):
    """Seeded q, k, v of shape (B, H, n, D)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=gen).to(device=device, dtype=dtype) for _ in range(3))


def implementations(q, k, v, *, is_causal: bool = False, block_size=None,
                    explicit: bool = True) -> dict:
    """name -> zero-argument callable, for ``bench.compare`` and ``peak_memory``."""
    calls = {SDPA: lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
             TILED: lambda: flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)}
    if explicit:
        calls[EXPLICIT] = lambda: scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]
    return calls


def interleaved_times(calls: dict, *, rounds: int = 3, device="cpu") -> dict:
    """Seconds of every round for each zero-argument callable: name -> list of ``rounds`` floats.

    Each round times every callable once, in turn (after one warm-up call each), so a burst of
    load from other work on the machine hits all of them alike. ``min`` of a list keeps the
    least-disturbed run; ``max - min`` is the spread a single round could have shown.
    """
    times = {name: [] for name in calls}
    with torch.no_grad():
        for fn in calls.values():
            fn()
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(bench.time_fn(fn, device=device, warmup=0, repeat=1, number=1))
    return times


def interleaved_min_times(calls: dict, *, rounds: int = 3, device="cpu") -> dict:
    """Seconds per call of each zero-argument callable: the minimum over ``rounds`` rounds.

    The rounds of ``interleaved_times``: every callable once per round, in turn, so a burst of load
    from other work on the machine hits all of them alike, and the minimum keeps the
    least-disturbed run. For comparisons ("is A faster than B?") on a shared machine.
    """
    return {name: min(ts) for name, ts in interleaved_times(calls, rounds=rounds, device=device).items()}


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def _upcast_compute_dtypes(calls, dtype) -> dict:
    """The dtype each row's matmuls run in where it is not ``dtype``: explicit and tiled attention
    both upcast half inputs to float32 (``efficient._tiles``), so their rows are labelled, and rated
    against the peak, as float32; SDPA computes in the input dtype."""
    return {name: bench.upcast_dtype(dtype) for name in (EXPLICIT, TILED) if name in calls}


def measure(ns, *, B: int = 1, H: int = 8, D: int = 64, dtype=torch.float32, device="cpu",
            is_causal: bool = False, block_size=None, budget_s: float = 0.5,
            memory: bool = True, fits=None) -> list[dict]:
    """Time (and measure peak memory of) the three implementations at each n.

    ``fits(name, n)``: whether a row runs at n (``timing.TimingPlan.fits(name, L=n)``); rows it
    declines are left out. Without it, explicit attention is left out where it runs out of device memory.

    Returns:
        One dict per (n, implementation): n, impl, ms (median), min_ms and max_ms (over the samples),
        ratio_vs_sdpa, peak_mib (None if not measured), max_abs_err.
    """
    device = torch.device(device)
    flops_rate = "tflops" if device.type == "cuda" else "gflops"
    records = []
    for n in ns:
        q, k, v = attention_inputs(B, H, n, D, dtype=dtype, device=device)
        flops = bench.attention_flops(B, H, n, n, D, is_causal=is_causal)
        calls = implementations(q, k, v, is_causal=is_causal, block_size=block_size,
                                explicit=fits is None or fits(EXPLICIT, n))
        upcast = _upcast_compute_dtypes(calls, dtype)
        try:
            rows = bench.compare(calls, reference=SDPA, flops=flops, device=device, budget_s=budget_s,
                                 compute_dtypes=upcast)
        except RuntimeError as err:               # explicit attention did not fit: drop it
            if not _is_oom(err):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            calls = implementations(q, k, v, is_causal=is_causal, block_size=block_size, explicit=False)
            rows = bench.compare(calls, reference=SDPA, flops=flops, device=device, budget_s=budget_s,
                                 compute_dtypes=_upcast_compute_dtypes(calls, dtype))
        for row in rows:
            peak = peak_memory(calls[row.name], device) / 2**20 if memory else None
            records.append(dict(n=n, impl=row.name, ms=row.ms, min_ms=1e3 * row.min_seconds,
                                max_ms=1e3 * (row.min_seconds + row.spread_seconds), ratio_vs_sdpa=row.ratio,
                                peak_mib=peak,
                                max_abs_err=row.max_abs_err, flops=flops, device=row.device, dtype=row.dtype,
                                compute_dtype=row.compute_dtype, err_ulps=row.err_ulps, backend=row.backend,
                                **{flops_rate: getattr(row, flops_rate)}))
        del q, k, v, calls                        # the lambdas hold the inputs too
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def bench_rows(records: list[dict], n: int) -> list[bench.BenchRow]:
    """The records of one n as ``bench.BenchRow`` objects, for ``bench.print_table`` and ``bench.plot_rows``."""
    rows = [bench.BenchRow(name=r["impl"], seconds=r["ms"] / 1e3, flops=r["flops"], ratio=r["ratio_vs_sdpa"],
                           max_abs_err=r["max_abs_err"], device=r["device"], dtype=r["dtype"],
                           compute_dtype=r.get("compute_dtype"), err_ulps=r.get("err_ulps"), backend=r.get("backend"),
                           min_seconds=r["min_ms"] / 1e3 if r.get("min_ms") is not None else None,
                           spread_seconds=(r["max_ms"] - r["min_ms"]) / 1e3 if r.get("min_ms") is not None else None)
            for r in records if r["n"] == n]
    if not rows:
        raise ValueError(f"no records for n={n}; measured: {sorted({r['n'] for r in records})}")
    for row in rows:
        compute = getattr(torch, row.compute_dtype or row.dtype)
        peak = bench.peak_tflops(bench.best_device(), compute) if "CPU" not in row.device else None
        if peak is not None and row.tflops is not None:
            row.peak_share = row.tflops / peak
    return rows


def check_targets(*, n: int = 4096, B: int = 1, H: int = 8, D: int = 64, rounds: int = 3,
                  block_size=None, budget_s: float = 1.0) -> dict:
    """The issue's CPU targets at n = 4096, float32: memory and time ratios, measured together.

    The time ratio tiled / SDPA is measured ``rounds`` times (each a single ``bench.compare``
    run, so both sides see the same machine load) and the median is reported with all rounds.
    """
    q, k, v = attention_inputs(B, H, n, D)
    calls = implementations(q, k, v, block_size=block_size)
    return target_ratios(calls, dict(n=n, B=B, H=H, D=D), rounds=rounds, block_size=block_size, budget_s=budget_s,
                         memory_target=TARGET_MEMORY_RATIO, time_target=TARGET_TIME_RATIO)


def target_ratios(calls: dict, sizes: dict, *, rounds: int, block_size, budget_s: float, memory_target: float,
                  time_target: float) -> dict:
    """Peak memory of the tiled call / the explicit one, and its time / SDPA's, measured together.

    ``calls`` holds the EXPLICIT, TILED and SDPA implementations on one float32 CPU input of ``sizes``.
    The time ratio is measured ``rounds`` times (each one ``bench.compare`` run, so both sides see the
    same machine load); the median is reported with every round, and ``passed`` against the targets.
    """
    memory = {name: peak_memory(fn) / 2**20 for name, fn in calls.items()}
    time_ratios, explicit_ratios = [], []
    for _ in range(rounds):
        rows = {r.name: r for r in bench.compare(calls, reference=SDPA, budget_s=budget_s)}
        time_ratios.append(rows[TILED].ratio)
        explicit_ratios.append(rows[EXPLICIT].ratio)
    memory_ratio = memory[TILED] / memory[EXPLICIT]
    time_ratio = statistics.median(time_ratios)
    block_size = list(default_block_size("cpu")) if block_size is None else block_size
    return dict(**sizes, dtype="float32", block_size=block_size, peak_mib=memory,
                memory_ratio_tiled_vs_explicit=memory_ratio, time_ratio_tiled_vs_sdpa=time_ratio,
                time_ratio_rounds=time_ratios, time_ratio_explicit_vs_sdpa=statistics.median(explicit_ratios),
                memory_target=memory_target, time_target=time_target,
                passed=bool(memory_ratio <= memory_target and time_ratio <= time_target))


TIME_TITLE = "Time (all three do the same FLOPs, x4 per doubling of n; the dashed guide is n²)"


def plot_scaling(records: list[dict], *, title: str = "", fig=None, time_title: str = TIME_TITLE):
    """Log-log time and peak memory against n, one line per implementation, with an n^2 guide; each
    time point has a bar from its fastest to its slowest sample (``min_ms``..``max_ms``) where the records hold them.

    ``time_title`` heads the time panel (the forward's FLOP count by default: a fact, not a reading of the times)."""
    if fig is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 4))
        FigureCanvasAgg(fig)
    panels = [("ms", "time per call (ms)")]
    if any(r["peak_mib"] is not None for r in records):
        panels.append(("peak_mib", "peak memory above inputs (MiB)"))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for impl in IMPLS:
            rs = [r for r in records if r["impl"] == impl and r[key] is not None]
            if not rs:
                continue
            ns_impl, ys = [r["n"] for r in rs], [r[key] for r in rs]
            if key == "ms" and all(r.get("min_ms") is not None for r in rs):   # each point's range: min-max
                bars = [[y - r["min_ms"] for r, y in zip(rs, ys)], [r["max_ms"] - y for r, y in zip(rs, ys)]]
                ax.errorbar(ns_impl, ys, yerr=bars, fmt="o-", color=COLORS[impl], capsize=3, label=impl)
            else:
                ax.plot(ns_impl, ys, "o-", color=COLORS[impl], label=impl)
        explicit = [(r["n"], r[key]) for r in records if r["impl"] == EXPLICIT and r[key] is not None]
        if explicit:                              # n^2 guide through explicit's largest point
            n_ref, y_ref = explicit[-1]
            ns = sorted({r["n"] for r in records})
            ax.plot(ns, [y_ref * (n / n_ref) ** 2 for n in ns], "--", color="#999999", label="slope n² (guide)")
        ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=label)
        ns_all = sorted({r["n"] for r in records})
        ax.set_xticks(ns_all, [str(n) for n in ns_all])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(time_title, fontsize=9)
    if len(axes) > 1:
        axes[1].set_title("Memory: only explicit attention grows like n²", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def run(out: str | Path, *, device: str | None = None, ns=None, targets: bool = True,
        budget_s: float = 0.5) -> dict:
    """Measure, write ``out`` (JSON) and the plot next to it; return the results."""
    device = torch.device(device) if device is not None else bench.best_device()
    config = default_config(device)
    ns = list(ns) if ns is not None else config["ns"]
    records = measure(ns, B=config["B"], H=config["H"], D=config["D"], dtype=config["dtype"], device=device,
                      budget_s=budget_s)
    result = dict(**provenance(device, config["B"], config["H"], config["D"], config["dtype"]), records=records)
    if targets and device.type == "cpu":
        result["targets"] = check_targets(rounds=5)          # a median of 5: one disturbed round cannot decide it
    save(out, result, title=f"{result['device']}, {result['dtype']}, B={result['B']}, h={result['H']}, "
                            f"dk={result['D']}")
    return result


def provenance(device: torch.device, B: int, H: int, D: int, dtype: torch.dtype) -> dict:
    """Where and how a benchmark ran: device, versions, threads, sizes, OpenMP policy, the machine's load."""
    info = dict(device=bench.device_name(device), device_type=device.type, torch=torch.__version__,
                machine=platform.machine(), threads=torch.get_num_threads(), B=B, H=H, D=D,
                dtype=str(dtype).replace("torch.", ""), block_size=list(default_block_size(device)),
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    if hasattr(os, "getloadavg"):
        info["load_average_1min"] = os.getloadavg()[0]      # other work on the machine while measuring
    return info


def save(out: str | Path, result: dict, *, title: str, time_title: str = TIME_TITLE) -> None:
    """Write ``result`` to ``out`` (JSON) and the plot of its records next to it (.png)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    fig = plot_scaling(result["records"], title=title, time_title=time_title)
    fig.savefig(out.with_suffix(".png"), dpi=110, bbox_inches="tight", metadata={"Software": None})


def command_line(module: str, description: str, run, argv=None, *, what: str = "") -> dict:
    """The command line shared by the benchmark modules: parse, measure with ``run``, print the records."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--out", required=True, help="JSON path; the plot goes next to it (.png)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the best present)")
    parser.add_argument("--ns", type=int, nargs="*", default=None, help="sequence lengths (default by device)")
    parser.add_argument("--no-targets", action="store_true", help="skip the n=4096 CPU target check")
    args = parser.parse_args(argv)
    result = run(args.out, device=args.device, ns=args.ns, targets=not args.no_targets)
    for r in result["records"]:
        mem = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        print(f"n={r['n']:>6} {r['impl']:<26} {r['ms']:>10.2f} ms  {r['ratio_vs_sdpa']:>6.2f}x SDPA  "
              f"peak {mem:>9} MiB")
    if "targets" in result:
        t = result["targets"]
        print(f"targets at n={t['n']}{what}: tiled/explicit peak memory = {t['memory_ratio_tiled_vs_explicit']:.4f} "
              f"(target <= {t['memory_target']:.3f}), tiled/SDPA time = {t['time_ratio_tiled_vs_sdpa']:.2f} "
              f"(target <= {t['time_target']:.1f}; rounds {[round(x, 2) for x in t['time_ratio_rounds']]}): "
              f"{'PASSED' if t['passed'] else 'FAILED'}")
    return result


def main(argv=None) -> None:
    command_line("selfattn_lite.course.bench_efficient", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    main()
