import os

import torch
from hypothesis import HealthCheck, settings

# CI replays the same examples every run (derandomize); locally each run explores new ones.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

torch.set_num_threads(min(2, torch.get_num_threads()))


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
