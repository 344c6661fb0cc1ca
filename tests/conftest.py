import os
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings

# The tests live in three folders, one per wing (reference/, learner/, course/); the helpers they share
# (helpers.py, gpu_report_helpers.py) stay here, importable from every one of them.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# CI replays the same examples every run (derandomize); locally each run explores new ones.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Tests run in parallel (pytest-xdist, one worker per core): each worker gets its share of the cores,
# so that two workers' matmuls do not fight over the same ones.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))

