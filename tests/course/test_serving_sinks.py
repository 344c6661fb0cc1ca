"""Notebook 13's sink experiment: the t quantiles its intervals use are Student's for its degrees of freedom (95% for
one interval, Bonferroni's 1 - 0.05/12 for the twelve it reads together), and the per-text loss its cell computes is
``streaming.window_loss``'s for that text alone."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT

from selfattn_lite import models, streaming
from selfattn_lite.masks import sink_window_mask

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


def sink_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "T_95 = " in "".join(c["source"]))


def test_the_twelve_intervals_read_together_use_bonferronis_t_quantile():
    code = sink_cell()
    assert "T_FAMILY = 3.019 " in code and "1 - 0.05/12" in code and "paired(a, b, T_FAMILY)" in code
    level = 1 - 0.05 / 12 / 2                                            # one-sided, each of 12 two-sided intervals
    assert t_cdf(3.0191, 45) == pytest.approx(level, abs=2e-6)            # scipy: t.ppf(1 - 0.05/24, 45) = 3.01907
    assert t_cdf(3.0185, 45) < level < t_cdf(3.0195, 45)                 # 3.019 to the digits it is typed


def test_the_cells_per_text_loss_is_window_loss_for_that_text_alone():
    """What the notebook's per_text computes (its masked_logits and cross-entropy from position 132), one text."""
    assert 'F.cross_entropy(logits.transpose(1, 2), batch[:, START + 1:], reduction="none").mean(1)' in sink_cell()
    model = models.load_tiny_decoder()
    _, held_out = models.split_text(models.load_text())
    text = model.tokenizer.encode(held_out)[:513].view(1, 513)
    start = 132
    for window, n_sink in ((32, 0), (28, 4), (None, 0)):
        mask = None if window is None else sink_window_mask(512, n_sink, window)
        with torch.no_grad():
            logits = streaming.masked_logits(model, text[:, :-1], mask)[:, start:]
        mine = F.cross_entropy(logits.transpose(1, 2), text[:, start + 1:], reduction="none").mean(1)
        assert mine.item() == pytest.approx(streaming.window_loss(model, text, window=window, n_sink=n_sink,
                                                                  start=start), abs=1e-5)
