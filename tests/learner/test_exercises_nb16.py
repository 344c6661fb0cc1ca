"""Checkers of notebook 16: right answers pass, each planted mistake is named, stubs are not attempted."""

import math

import pytest
import torch

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb16 as check


def stub(*args):
    raise NotImplementedError


def test_delta_step(capsys):
    check.check_delta_step(lambda S, k, v, beta: S + beta * torch.outer(k, v - k @ S))
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda S, k, v, b: S + b * torch.outer(k, v), "linear attention's update"),
                           (lambda S, k, v, b: S + torch.outer(k, v - k @ S), "beta is missing"),
                           (lambda S, k, v, b: S + b * torch.outer(k, v) - torch.outer(k, k @ S), "erasing term"),
                           (lambda S, k, v, b: S - b * torch.outer(k, v - k @ S), "sign of the error"),
                           (lambda S, k, v, b: b * torch.outer(k, v - k @ S), "old state is gone"),
                           (lambda S, k, v, b: S, "not the delta rule's step")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_delta_step(wrong)
    with pytest.raises(ExerciseError, match=r"shape \(4, 3\)"):
        check.check_delta_step(lambda S, k, v, b: S.T)
    check.check_delta_step(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def test_old_key_recall(capsys):
    check.check_old_key_recall(lambda g: math.exp(g[1:].sum().item()))
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda g: math.exp(g.sum().item()), "gate of step 0 acts before"),
                           (lambda g: g[1:].sum().item(), "log-decay"),
                           (lambda g: math.exp(g[-1].item()), "not only the last one"),
                           (lambda g: 1.0, "should be")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_old_key_recall(wrong)
    check.check_old_key_recall(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def test_crossover_tokens(capsys):
    check.check_crossover_tokens(lambda s, L, h, d, b: s // (2 * L * h * d * b) + 1)
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda s, L, h, d, b: s // (L * h * d * b) + 1, "a key AND a value"),
                           (lambda s, L, h, d, b: math.ceil(s / (2 * L * h * d * b)), "off by one"),
                           (lambda s, L, h, d, b: s // (2 * h * d * b) + 1, "multiply the per-token bytes"),
                           (lambda s, L, h, d, b: 3, "should be")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_crossover_tokens(wrong)
    check.check_crossover_tokens(stub)
    assert "Not attempted yet" in capsys.readouterr().out
