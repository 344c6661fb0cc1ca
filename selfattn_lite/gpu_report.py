"""``make gpu-report``: everything only a GPU shows, in one command, as committed JSON.

    python -m selfattn_lite.gpu_report --out figures/gpu            # on a CUDA machine (~6 min on an H200)
    python -m selfattn_lite.gpu_report --out figures/gpu --dry-run  # anywhere: the same code, tiny sizes

Sections run one after another, each in its own Python process with its own timeout, and each
writes ``<out>/<section>.json`` when it finishes (``"status": "ok"``, or ``"failed"`` with the
error and whatever it had measured); ``<out>/report.json`` lists every section's status and
time and is rewritten after each one. So one failing assert, a hang or an out-of-memory error
costs one section, never the run. A dry run writes under ``<out>/dry-run/`` and never touches
the GPU results beside it.

The sections, in order (``SECTIONS``):

* ``provenance``: torch, CUDA, cuDNN and driver versions; device name, SM count, clocks, memory;
  TF32 and SDPA backend flags.
* ``calibrate``: a measured bf16 GEMM (8192^3) and device-to-device copy, against the device's
  published peak and bandwidth (``bench.DEVICE_SPECS``; "unknown" when not listed).
* ``tests``: the package tests on CUDA (the device-parametrized ones run there too), time-capped.
* ``nb01`` ... ``nb10``: each notebook's timing comparison at full size in bf16, inputs drawn on
  the device, every output checked against a float32 reference in ulps (``gpu_sections``); ``nb08``
  is notebook 08's benchmark up to 16k tokens.
* ``nb11``: notebook 11's forward + backward benchmark (explicit, tiled, SDPA), time and peak memory.
* ``nb15``: notebook 15's Triton kernel against SDPA, forward and forward + backward, and its goal.
* ``nb16``: notebook 16's decoding step: SDPA over caches up to 64k tokens against one step of each
  fixed-state mixer (delta rule, gated, linear attention, S6).

Adding a section is one line in ``SECTIONS``: a name, ``"module:function"`` (the function takes a
``gpu_sections.Context`` and returns a JSON-able dict) and a timeout. Notebooks show the results
beside their CPU timings with ``show(section)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Section", "SECTIONS", "GPU_DIR", "provenance", "calibrate", "package_tests", "run_section",
           "run_report", "load", "show", "main"]

GPU_DIR = Path(__file__).resolve().parents[1] / "figures" / "gpu"
DRY_RUN_DIR = "dry-run"


@dataclass(frozen=True)
class Section:
    """One part of the report: ``target`` is "module:function", run with a time limit in seconds."""

    name: str
    target: str
    timeout_s: float


SECTIONS: list[Section] = [
    Section("provenance", "selfattn_lite.gpu_report:provenance", 60),
    Section("calibrate", "selfattn_lite.gpu_report:calibrate", 60),
    Section("tests", "selfattn_lite.gpu_report:package_tests", 150),
    Section("nb01", "selfattn_lite.gpu_sections:nb01", 30),
    Section("nb02", "selfattn_lite.gpu_sections:nb02", 30),
    Section("nb03", "selfattn_lite.gpu_sections:nb03", 30),
    Section("nb04", "selfattn_lite.gpu_sections:nb04", 45),
    Section("nb05", "selfattn_lite.gpu_sections:nb05", 30),
    Section("nb06", "selfattn_lite.gpu_sections:nb06", 30),
    Section("nb07", "selfattn_lite.gpu_sections:nb07", 30),
    Section("nb08", "selfattn_lite.gpu_sections:nb08", 90),
    Section("nb09", "selfattn_lite.gpu_sections:nb09", 30),
    Section("nb10", "selfattn_lite.gpu_sections:nb10", 45),
    # Part II: one line each
    Section("nb11", "selfattn_lite.gpu_sections:nb11", 120),
    Section("nb15", "selfattn_lite.gpu_sections:nb15", 240),
    # Part III
    Section("nb16", "selfattn_lite.gpu_sections:nb16", 60),
]


# --------------------------------------------------------------------------------------------- sections
def _run_cmd(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(ctx) -> dict:
    """Versions, device, clocks and the flags that change numbers (TF32, SDPA backends)."""
    import torch

    info = dict(python=platform.python_version(), machine=platform.machine(), torch=torch.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                else None, device_type=ctx.device.type, dry_run=ctx.tiny, threads=torch.get_num_threads(),
                float32_matmul_precision=torch.get_float32_matmul_precision(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                sdpa_enabled=dict(flash=torch.backends.cuda.flash_sdp_enabled(),
                                  efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
                                  cudnn=torch.backends.cuda.cudnn_sdp_enabled(),
                                  math=torch.backends.cuda.math_sdp_enabled()))
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(device=torch.cuda.get_device_name(ctx.device), sm_count=props.multi_processor_count,
                    compute_capability=f"{props.major}.{props.minor}", memory_bytes=props.total_memory)
        query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu"
        smi = _run_cmd(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", f"--id={ctx.device.index or 0}"])
        info["nvidia_smi"] = dict(zip(query.split(","), [x.strip() for x in smi.split(",")])) if smi else None
    else:
        info.update(device=f"CPU ({platform.processor() or platform.machine()})")
    return info


def _time_gemm(ctx, n: int):
    import torch

    from . import bench

    a = bench.randn(n, n, device=ctx.device, dtype=torch.bfloat16, seed=0)
    b = bench.randn(n, n, device=ctx.device, dtype=torch.bfloat16, seed=1)
    return bench.time_stats(lambda: a @ b, device=ctx.device, budget_s=ctx.pick(2.0, 0.05))


def _time_copy(ctx, nbytes: int):
    import torch

    from . import bench

    src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    return bench.time_stats(lambda: dst.copy_(src), device=ctx.device, budget_s=ctx.pick(2.0, 0.05))


def calibrate(ctx) -> dict:
    """Measured bf16 GEMM TFLOP/s and copy bandwidth, beside the published figures."""
    import torch

    from . import bench

    n, nbytes = ctx.pick(8192, 256), ctx.pick(2 * 2**30, 8 * 2**20)
    gemm, copy = _time_gemm(ctx, n), _time_copy(ctx, nbytes)
    tflops = 2 * n**3 / gemm.median / 1e12
    gbs = 2 * nbytes / copy.median / 1e9                     # each byte read once and written once
    peak, bandwidth = bench.peak_tflops(ctx.device, torch.bfloat16), bench.peak_bandwidth_gbs(ctx.device)
    return dict(gemm=dict(n=n, dtype="bfloat16", median_s=gemm.median, min_s=gemm.min, spread_s=gemm.spread,
                          tflops=tflops, tflops_at_min=2 * n**3 / gemm.min / 1e12, published_tflops=peak,
                          share_of_published=None if peak is None else tflops / peak),
                copy=dict(bytes=nbytes, median_s=copy.median, min_s=copy.min, gb_per_s=gbs,
                          published_gb_per_s=bandwidth, share_of_published=None if bandwidth is None
                          else gbs / bandwidth),
                peak=bench.describe_peak(ctx.device))


# the tests that exercise the package's device code; on CUDA their device parameters include "cuda"
TEST_FILES = ["tests/test_bench.py", "tests/test_devices.py", "tests/test_attention.py", "tests/test_efficient.py",
              "tests/test_efficient_half.py", "tests/test_kv_cache.py", "tests/test_models.py",
              "tests/test_multihead.py", "tests/test_masks.py", "tests/test_positions.py"]
DRY_RUN_TESTS = ["tests/test_bench.py", "-k", "ulp_of_bf16"]


def package_tests(ctx) -> dict:
    """pytest on the package's device tests (a few fast ones in a dry run); the output's tail is kept."""
    root = Path(__file__).resolve().parents[1]
    args = DRY_RUN_TESTS if ctx.tiny else TEST_FILES
    env = dict(os.environ, CI="1", PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # one process (-n 0, no xdist workers): the tests share the one GPU
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-x", *args]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-4000:]
    if proc.returncode != 0:
        raise AssertionError(f"pytest exited with {proc.returncode}:\n{tail}")
    return dict(command=" ".join(cmd[1:]), returncode=proc.returncode, summary=tail.strip().splitlines()[-1],
                output_tail=tail)


# --------------------------------------------------------------------------------------------- runner
def _jsonable(obj):
    import torch

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj).replace("torch.", "")
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def run_section(section: Section, out: Path, *, dry_run: bool) -> dict:
    """Run one section in this process and write ``out/<name>.json`` (also when it fails); the record."""
    import torch

    from .gpu_sections import Context

    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")
    ctx = Context(device=device, tiny=dry_run, budget_s=0.02 if dry_run else 0.3)
    module, _, name = section.target.partition(":")
    start = time.perf_counter()
    record = dict(section=section.name, target=section.target, dry_run=dry_run, device_type=device.type,
                  started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        record["result"] = getattr(importlib.import_module(module), name)(ctx)
        check = record["result"].get("fp32_check") if isinstance(record["result"], dict) else None
        record["status"] = "ok" if check is None or check.get("passed", True) else "failed"
        if record["status"] == "failed":
            record["error"] = "an output is further from the float32 reference than the bound (see fp32_check)"
    except Exception as err:                              # recorded, never lost: the runner goes on
        record.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-4000:])
    record["seconds"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{section.name}.json").write_text(json.dumps(_jsonable(record), indent=1) + "\n")
    return record


def run_report(out: str | Path, *, dry_run: bool, sections: list[Section] | None = None,
               only: list[str] | None = None, echo=print, isolate: bool = True) -> dict:
    """Run each section in a fresh process with its timeout; rewrite ``out/report.json`` after each one.

    ``isolate=False`` runs the sections in this process instead (no timeouts): the same section
    code and files, without a Python start-up per section. CI's dry run uses it; the process
    isolation itself has its own test.
    """
    out = Path(out) / DRY_RUN_DIR if dry_run else Path(out)
    sections = SECTIONS if sections is None else sections
    if only:
        unknown = set(only) - {s.name for s in sections}
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; known: {[s.name for s in sections]}")
        sections = [s for s in sections if s.name in only]
    out.mkdir(parents=True, exist_ok=True)
    report = dict(dry_run=dry_run, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), sections=[])
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    total = time.perf_counter()
    for section in sections:
        cmd = [sys.executable, "-m", "selfattn_lite.gpu_report", "--out", str(out), "--section", section.name,
               "--target", section.target, *(["--dry-run"] if dry_run else [])]
        start = time.perf_counter()
        if not isolate:
            record = run_section(section, out, dry_run=dry_run)
            status, error = record["status"], record.get("error")
        else:
            status, error = _run_isolated(section, out, cmd, env)
        entry = dict(section=section.name, status=status, seconds=round(time.perf_counter() - start, 2), error=error)
        report["sections"].append(entry)
        report["seconds"] = round(time.perf_counter() - total, 2)
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        echo(f"{section.name:<12} {status:<8} {entry['seconds']:>7.1f} s" + (f"  {error.splitlines()[0]}" if error
                                                                             else ""))
    return report


def _run_isolated(section: Section, out: Path, cmd: list[str], env: dict) -> tuple[str, str | None]:
    """One section in a fresh Python process, killed after its timeout: (status, error)."""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=section.timeout_s)
    except subprocess.TimeoutExpired:
        status, error = "timeout", f"no result within {section.timeout_s} s"
        record = dict(section=section.name, status=status, error=error)
        (out / f"{section.name}.json").write_text(json.dumps(record, indent=1) + "\n")
        return status, error
    if proc.returncode != 0:
        return "failed", f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"
    record = json.loads((out / f"{section.name}.json").read_text())
    return record["status"], record.get("error")
    return status, error


# --------------------------------------------------------------------------------------------- notebooks
def load(section: str, directory: str | Path | None = None) -> dict | None:
    """A section's record from a GPU run (``figures/gpu/<section>.json``), or None if there is none."""
    path = Path(directory or GPU_DIR) / f"{section}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if record.get("device_type") == "cuda" and not record.get("dry_run") else None


def show(section: str, directory: str | Path | None = None) -> list | None:
    """Print the GPU rows of a section beside a notebook's CPU timings, if ``make gpu-report`` left them.

    Returns:
        The rows as ``bench.BenchRow`` objects, or None (and a one-line note) when there are none.
    """
    from . import bench

    record = load(section, directory)
    if record is None:
        print(f"No GPU results for {section} yet: `make gpu-report` on a CUDA machine writes figures/gpu/.")
        return None
    result = record.get("result") or {}
    fields = set(bench.BenchRow.__dataclass_fields__)
    rows = [bench.BenchRow(**{k: v for k, v in r.items() if k in fields}) for r in result.get("rows", [])]
    print(f"GPU run ({record.get('started', '?')}, status {record['status']}):")
    if rows:
        bench.print_table(rows)
    check = result.get("fp32_check")
    if check and "ulps" in check:
        worst = max(check["ulps"].values())
        print(f"worst error vs float32: {worst:.1f} bf16 ulps (bound {check['bound_ulps']:g})")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(GPU_DIR), help="folder for the JSON files (default figures/gpu)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (automatic without CUDA)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these sections")
    parser.add_argument("--in-process", action="store_true", help="no process per section (no timeouts)")
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)     # internal: one section, in-process
    parser.add_argument("--target", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    dry_run = args.dry_run or not torch.cuda.is_available()
    if args.section:
        target = args.target or {s.name: s.target for s in SECTIONS}[args.section]
        record = run_section(Section(args.section, target, 0), Path(args.out), dry_run=dry_run)
        return 0 if record["status"] in ("ok", "failed") else 1
    if dry_run and not args.dry_run:
        print("no CUDA device: a dry run (tiny sizes, CPU), results under", Path(args.out) / DRY_RUN_DIR)
    report = run_report(args.out, dry_run=dry_run, only=args.only, isolate=not args.in_process)
    failed = [s["section"] for s in report["sections"] if s["status"] != "ok"]
    print(f"{len(report['sections']) - len(failed)} of {len(report['sections'])} sections ok in "
          f"{report.get('seconds', 0):.0f} s" + (f"; not ok: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
