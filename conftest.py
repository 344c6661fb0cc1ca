"""Repository-wide pytest hooks (tests/conftest.py holds the test settings).

Here, not in tests/, so that they also see the notebooks that nbval runs from notebooks/."""


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
