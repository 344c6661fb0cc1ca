"""Repository-wide pytest hooks (tests/conftest.py holds the test settings).

Here, not in tests/, so that they also see the notebooks that nbval runs from notebooks/."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

# Before anything imports torch (OpenMP reads it then), in this process, its xdist workers and every
# notebook kernel they start: idle OpenMP threads sleep, as under `make` and in the notebooks.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# ---- per-notebook wall time, printed at the end of the run (nbval runs one item per cell) ----
_NOTEBOOK_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _NOTEBOOK_SECONDS[path] = _NOTEBOOK_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if _NOTEBOOK_SECONDS:
        terminalreporter.section("notebook execution time (all cells, incl. kernel start)")
        for path, seconds in sorted(_NOTEBOOK_SECONDS.items()):
            terminalreporter.write_line(f"{seconds:7.1f} s  {path}")


# ---- notebook 15 needs Triton (a Linux-only extra): elsewhere its committed outputs cannot be reproduced ----
TRITON_NOTEBOOK = "15_flashattention_in_triton.ipynb"


def _recorded_seconds(notebook: Path) -> float:
    """How long the notebook's cells took when it was last executed (the times nbclient records)."""
    from datetime import datetime

    total = 0.0
    for cell in json.loads(notebook.read_text())["cells"]:
        run = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in run and "shell.execute_reply" in run:
            start, end = (datetime.fromisoformat(run[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            total += (end - start).total_seconds()
    return total


def _run_order(items) -> None:
    """Longest files first, so that no worker is left alone with a long one at the end (pytest-xdist
    hands out whole files, in this order, with --no-loadscope-reorder): files with tests marked slow
    (browsers, servers, student notebooks), then the notebooks, the longest (as last executed) first,
    then the rest as collected."""
    def path(item):
        return item.nodeid.split("::")[0]

    slow_files = {path(item) for item in items if item.get_closest_marker("slow")}
    seconds = {p: _recorded_seconds(ROOT / p) for p in {path(item) for item in items} if p.endswith(".ipynb")}

    def key(item):
        p = path(item)
        return (0, 0) if p in slow_files else (1, -seconds[p]) if p in seconds else (2, 0)

    items.sort(key=key)                                   # stable: each file's tests keep their order


def pytest_collection_modifyitems(config, items):
    _run_order(items)
    if importlib.util.find_spec("triton") is not None or os.environ.get("CI"):
        return  # CI installs Triton: there a missing Triton must fail, not skip
    skip = pytest.mark.skip(reason=f"{TRITON_NOTEBOOK}'s committed outputs come from a run with Triton, which is not "
                                   "installed here (Linux-only extra: pip install -e '.[triton]'); CI runs it")
    for item in items:
        if item.nodeid.split("::")[0].endswith(TRITON_NOTEBOOK):
            item.add_marker(skip)
