"""Checkers for notebook 02: the worked 3-token example."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["KEYS", "VALUES", "check_second_query", "check_weights_at_scale"]

KEYS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])    # k1, k2, k3
VALUES = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # v1, v2, v3
Q2 = torch.tensor([0.0, 1.0])


def check_second_query(weights, output) -> None:
    """Weights (3,) and output (2,) of the query q = [0, 1] over the example's keys and values."""
    if weights is None or output is None:
        return not_attempted("weights_q2 and output_q2")
    weights = require_tensor("weights_q2", torch.as_tensor(weights, dtype=torch.float32), (3,))
    output = require_tensor("output_q2", torch.as_tensor(output, dtype=torch.float32), (2,))
    scores = KEYS @ Q2
    expected = torch.softmax(scores / math.sqrt(2), dim=-1)
    if close(weights, scores / math.sqrt(2), atol=5e-3):
        raise ExerciseError("these are the scaled scores, not the weights: apply softmax to them")
    if close(weights, torch.softmax(scores, dim=-1), atol=5e-3):
        raise ExerciseError("you forgot to divide the scores by sqrt(dk) = sqrt(2) before the softmax")
    if not close(weights, expected, atol=5e-3):
        raise ExerciseError(f"weights should be softmax(q.k_j / sqrt(2)); the scores q.k_j are {scores.tolist()}")
    if not close(output, expected @ VALUES, atol=5e-3):
        raise ExerciseError("the weights are right; the output is sum_j w_j v_j (weights @ VALUES)")
    return passed(f"weights {[round(x, 2) for x in expected.tolist()]}, output "
                  f"{[round(x, 2) for x in (expected @ VALUES).tolist()]}")


def check_weights_at_scale(fn) -> None:
    """``fn(c)`` must return the (3,) weights of query c * [1, 0] in the worked example."""
    q = torch.tensor([1.0, 0.0])
    try:
        attempt(fn, 1.0)
    except NotAttempted:
        return not_attempted("weights_at_scale")
    for c in (1.0, 3.0, 10.0):
        got = require_tensor(f"weights_at_scale({c})", torch.as_tensor(attempt(fn, c), dtype=torch.float32), (3,))
        expected = torch.softmax((KEYS @ (c * q)) / math.sqrt(2), dim=-1)
        if c != 1.0 and close(got, torch.softmax((KEYS @ (c * q)) * c / math.sqrt(2), dim=-1), atol=1e-4):
            raise ExerciseError("you scaled both the query and the keys (scores grow like c^2): scale the query only")
        if close(got, torch.softmax(KEYS @ (c * q), dim=-1), atol=1e-4):
            raise ExerciseError("the scores are missing the 1/sqrt(dk) = 1/sqrt(2) factor")
        if not close(got, expected, atol=1e-4):
            want, have = [round(x, 4) for x in expected.tolist()], [round(x, 4) for x in got.tolist()]
            raise ExerciseError(f"weights_at_scale({c}) should be softmax((c q) . k_j / sqrt(2)) = {want}, got {have}")
    return passed("the middle weight falls from 0.20 (c=1) to about 0.0004 (c=10) while the other two approach 0.5")
