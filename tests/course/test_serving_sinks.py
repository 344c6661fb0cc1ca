"""Notebook 13's sink experiment: the t quantile its intervals use is Student's for its degrees of freedom."""

import json
import math

import pytest
from helpers import ROOT

NOTEBOOK = ROOT / "notebooks" / "13_serving_the_cache.ipynb"


def t_cdf(t: float, dof: int, steps: int = 20_000) -> float:
    """P(T <= t) for t >= 0: 1/2 plus Simpson's rule over Student's density on [0, t]."""
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    density = lambda x: c * (1 + x * x / dof) ** (-(dof + 1) / 2)          # noqa: E731
    h = t / steps
    inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return 0.5 + h / 3 * (density(0) + inner + density(t))


def test_the_sink_intervals_use_the_t_quantile_of_their_46_texts():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "T_95 = " in "".join(c["source"]))
    assert "T_95 = 2.014 " in code and "assert n_texts == 46" in code
    assert t_cdf(2.0141, 45) == pytest.approx(0.975, abs=1e-5)   # scipy: t.ppf(0.975, 45) = 2.0141
    assert t_cdf(2.0135, 45) < 0.975 < t_cdf(2.0145, 45)                     # 2.014 to the digits it is typed
