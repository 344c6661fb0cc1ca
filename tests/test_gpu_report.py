"""`make gpu-report`'s dry run (the same code at tiny sizes on the CPU), its isolation, and `show`."""

import json
import re
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

from selfattn_lite import bench, gpu_report
from selfattn_lite.gpu_report import Section
from selfattn_lite.gpu_sections import row_dicts


def last_code_cell(number: str) -> str:
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return "".join(cells[-1]["source"])


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole dry run: every section's code at tiny sizes, in this process (the per-section processes
    of `make gpu-report` cost a Python start-up each; their isolation is tested below on its own)."""
    out = tmp_path_factory.mktemp("gpu")
    lines = []
    report = gpu_report.run_report(out, dry_run=True, isolate=False, echo=lines.append)
    return out, report


def test_dry_run_runs_every_section_and_writes_under_dry_run(dry_run):
    out, returned = dry_run
    report = json.loads((out / "dry-run" / "report.json").read_text())
    assert report == returned
    assert report["dry_run"] and [s["section"] for s in report["sections"]] == [s.name for s in gpu_report.SECTIONS]
    assert all(s["status"] == "ok" for s in report["sections"]), report
    assert not list(out.glob("*.json"))                     # a dry run never writes beside the GPU results
    provenance = json.loads((out / "dry-run" / "provenance.json").read_text())["result"]
    assert provenance["torch"] and provenance["device_type"] == "cpu" and "tf32_matmul" in provenance
    calib = json.loads((out / "dry-run" / "calibrate.json").read_text())["result"]
    assert calib["gemm"]["tflops"] > 0 and calib["copy"]["gb_per_s"] > 0


@pytest.mark.parametrize("number", ["01", "02", "03", "04", "05", "06", "07", "09", "10"])
def test_each_notebook_section_times_the_notebooks_rows_checked_against_float32(dry_run, number):
    out, _ = dry_run
    record = json.loads((out / "dry-run" / f"nb{number}.json").read_text())
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
    out, _ = dry_run
    rows = {r["name"]: r for r in json.loads((out / "dry-run" / "nb07.json").read_text())["result"]["rows"]}
    assert rows["selfattn_lite (explicit)"]["flops"] == 2 * rows["torch SDPA (enable_gqa)"]["flops"]
    assert rows["selfattn_lite (explicit)"]["compute_dtype"] == "float32"
    assert rows["torch SDPA (enable_gqa)"]["compute_dtype"] == "bfloat16"


def test_part_two_sections_run_their_benchmarks(dry_run):
    out, _ = dry_run
    nb11 = json.loads((out / "dry-run" / "nb11.json").read_text())["result"]
    ns = nb11["config"]["ns"]
    for records in nb11["records"].values():
        assert {r["n"] for r in records} == set(ns) and {r["impl"] for r in records} >= {"torch SDPA"}
    nb15 = json.loads((out / "dry-run" / "nb15.json").read_text())["result"]
    assert nb15.get("skipped") or {r["pass"] for r in nb15["records"]} == {"fwd", "fwd+bwd"}
    nb16 = json.loads((out / "dry-run" / "nb16.json").read_text())["result"]
    assert nb16["fp32_check"]["passed"]
    assert {r["S"] for r in nb16["records"] if r["impl"] == "torch SDPA"} == set(nb16["config"]["Ss"])
    assert {r["impl"] for r in nb16["records"]} == {"torch SDPA", "delta rule step", "gated delta rule step",
                                                    "linear attention step", "S6 step"}


def test_notebook_08_section_runs_the_benchmark(dry_run):
    out, _ = dry_run
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
    assert len(lines) == 3 and re.match(r"hangs\s+timeout", lines[1])
    with pytest.raises(ValueError, match="unknown sections"):
        gpu_report.run_report(tmp_path, dry_run=True, sections=sections, only=["nope"])


def test_show_prints_gpu_rows_when_present_and_says_so_when_not(tmp_path, capsys):
    assert gpu_report.show("nb01", tmp_path) is None
    assert "No GPU results for nb01" in capsys.readouterr().out
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
    proc = subprocess.run([sys.executable, "-m", "selfattn_lite.gpu_report", "--out", str(tmp_path), "--dry-run",
                           "--only", "provenance"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 of 1 sections ok" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "dry-run" / "provenance.json").read_text())["status"] == "ok"


def test_makefile_runs_the_report():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^gpu-report:.*\n\t.*-m selfattn_lite\.gpu_report --out figures/gpu", makefile, re.M)
    assert "figures/gpu/dry-run/" in (ROOT / ".gitignore").read_text()


def test_the_package_tests_it_runs_on_the_gpu_exist():
    files = [arg for arg in gpu_report.TEST_FILES + gpu_report.DRY_RUN_TESTS if arg.startswith("tests/")]
    assert files and all((ROOT / f).is_file() for f in files), [f for f in files if not (ROOT / f).is_file()]
