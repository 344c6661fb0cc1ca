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

