"""Checkers of notebook 16: right answers pass, each planted mistake is named, stubs are not attempted."""

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb16 as check


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own
RIGHT["delta_step"] = check.check_delta_step, lambda S, k, v, beta: S + beta * torch.outer(k, v - k @ S)


@pytest.mark.parametrize("wrong, message", [
    (lambda S, k, v, b: S + b * torch.outer(k, v), "linear attention's update"),
    (lambda S, k, v, b: S + torch.outer(k, v - k @ S), "beta is missing"),
    (lambda S, k, v, b: S + b * torch.outer(k, v) - torch.outer(k, k @ S), "erasing term"),
    (lambda S, k, v, b: S - b * torch.outer(k, v - k @ S), "sign of the error"),
    (lambda S, k, v, b: b * torch.outer(k, v - k @ S), "old state is gone"),
    (lambda S, k, v, b: S, "not the delta rule's step"),
    (lambda S, k, v, b: S.T, r"shape \(4, 3\)"),
])
def test_delta_step_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_delta_step(wrong)


RIGHT["old_key_recall"] = check.check_old_key_recall, lambda g: math.exp(g[1:].sum().item())


@pytest.mark.parametrize("wrong, message", [
    (lambda g: math.exp(g.sum().item()), "gate of step 0 acts before"),
    (lambda g: g[1:].sum().item(), "log-decay"),
    (lambda g: math.exp(g[-1].item()), "not only the last one"),
    (lambda g: 1.0, "should be"),
])
def test_old_key_recall_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_old_key_recall(wrong)


RIGHT["crossover_tokens"] = check.check_crossover_tokens, lambda s, L, h, d, b: s // (2 * L * h * d * b) + 1


@pytest.mark.parametrize("wrong, message", [
    (lambda s, L, h, d, b: s // (L * h * d * b) + 1, "a key AND a value"),
    (lambda s, L, h, d, b: math.ceil(s / (2 * L * h * d * b)), "off by one"),
    (lambda s, L, h, d, b: s // (2 * h * d * b) + 1, "multiply the per-token bytes"),
    (lambda s, L, h, d, b: 3, "should be"),
])
def test_crossover_tokens_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_crossover_tokens(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
