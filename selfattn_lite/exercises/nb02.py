"""Checkers for notebook 02: the worked 3-token example (token 2's causal row, the query length that saturates,
the gradient on the query)."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["KEYS", "VALUES", "check_second_query", "check_scale_for_weight", "check_query_gradient"]

KEYS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])    # k1, k2, k3
VALUES = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # v1, v2, v3
Q1 = torch.tensor([1.0, 0.0])
Q2 = torch.tensor([0.0, 1.0])


def check_second_query(weights, output) -> None:
    """Token 2's causal row: weights (3,) and output (2,) of q = [0, 1] when it may see tokens 1 and 2 only.

    Scores q.k_j / sqrt(2) = [0, 0.707, 0.707]; the causal mask sets token 3's to -inf, so the weights are
    softmax([0, 0.707]) followed by 0, and the output is w_1 v_1 + w_2 v_2.
    """
    if weights is None or output is None:
        return not_attempted("weights_q2 and output_q2")
    weights = require_tensor("weights_q2", torch.as_tensor(weights, dtype=torch.float32), (3,))
    output = require_tensor("output_q2", torch.as_tensor(output, dtype=torch.float32), (2,))
    scores = KEYS @ Q2
    scaled = scores / math.sqrt(2)
    allowed = torch.tensor([True, True, False])                          # token 2's row of the causal mask

    def masked_softmax(s, keep):
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)

    expected = masked_softmax(scaled, allowed)
    unmasked = torch.softmax(scaled, dim=-1)
    if close(weights, unmasked, atol=5e-3):
        raise ExerciseError("these are the weights without the mask: token 3 comes after token 2, so the causal "
                            "mask gives it weight 0 (its score becomes -inf before the softmax)")
    if close(weights, unmasked * allowed, atol=5e-3):
        raise ExerciseError(f"the weights sum to {(unmasked * allowed).sum().item():.2f}, not 1: you zeroed token 3 "
                            "after the softmax; mask its score (-inf) before the softmax, so tokens 1 and 2 share "
                            "all the weight")
    if close(weights, masked_softmax(scaled, torch.tensor([True, False, False])), atol=5e-3):
        raise ExerciseError("that is token 1's row of the causal mask ([True, False, False]); token 2 may see "
                            "tokens 1 and 2: [True, True, False]")
    if close(weights, masked_softmax(scores, allowed), atol=5e-3):
        raise ExerciseError("you forgot to divide the scores by sqrt(dk) = sqrt(2) before the softmax")
    if close(weights, masked_softmax(scores * math.sqrt(2), allowed), atol=5e-3):
        raise ExerciseError("you multiplied the scores by sqrt(2); divide them by sqrt(dk) = sqrt(2) before the "
                            "softmax")
    if close(weights[:2], scaled[:2], atol=5e-3):
        raise ExerciseError("these are the scaled scores, not the weights: apply softmax to them")
    if not close(weights, expected, atol=5e-3):
        raise ExerciseError(f"weights should be softmax(q.k_j / sqrt(2)) over tokens 1 and 2, and 0 for token 3; "
                            f"the scores q.k_j are {scores.tolist()}")
    if not close(output, expected @ VALUES, atol=5e-3):
        raise ExerciseError("the weights are right; the output is sum_j w_j v_j (weights @ VALUES)")
    return passed(f"weights {[round(x, 2) for x in expected.tolist()]}, output "
                  f"{[round(x, 2) for x in (expected @ VALUES).tolist()]}")


def _middle_weight(c: float) -> float:
    """Token 2's weight for the query c * [1, 0] over the example's keys (scaled by sqrt(2))."""
    return torch.softmax(KEYS.double() @ torch.tensor([c, 0.0], dtype=torch.float64) / math.sqrt(2), dim=-1)[1].item()


def check_scale_for_weight(fn) -> None:
    """``fn(w)`` must return the c > 0 at which the query c * [1, 0] gives token 2 the weight w (0 < w < 1/3).

    The scores are c/sqrt(2) * [1, 0, 1], so w = 1 / (1 + 2 exp(c / sqrt(2))) and
    c = sqrt(2) * ln((1 / w - 1) / 2).
    """
    try:
        attempt(fn, 0.1)
    except NotAttempted:
        return not_attempted("scale_for_weight")
    for w in (0.1, 0.01, 1e-4):
        got = attempt(fn, w)
        try:
            c = float(got)
        except (TypeError, ValueError):
            raise ExerciseError(f"scale_for_weight({w}) should return a number c, got {type(got).__name__}") from None
        if math.isclose(c, math.log((1 / w - 1) / 2), rel_tol=1e-4):
            raise ExerciseError("the scores are c/sqrt(2) * [1, 0, 1], not c * [1, 0, 1]: multiply your c by sqrt(2)")
        if math.isclose(c, math.sqrt(2) * math.log(1 / w - 1), rel_tol=1e-4):
            raise ExerciseError("two keys (k1 and k3) score c/sqrt(2), not one: w = 1 / (1 + 2 exp(c/sqrt(2))), "
                                "so the 2 divides (1/w - 1) inside the log")
        if not math.isfinite(c) or not math.isclose(_middle_weight(c), w, rel_tol=1e-3):
            have = _middle_weight(c) if math.isfinite(c) else float("nan")
            raise ExerciseError(f"at your c = {c:.4g} for w = {w}, token 2's weight is {have:.4g}: write w as a "
                                "function of c (softmax of the three scores) and solve for c")
    def scale(w):
        return math.sqrt(2) * math.log((1 / w - 1) / 2)
    return passed(f"c = sqrt(2) ln((1/w - 1) / 2): token 2's weight is 1% at c = {scale(0.01):.1f} and 0.01% at "
                  f"c = {scale(1e-4):.1f}; it falls exponentially as the query grows")


def check_query_gradient(grad_q) -> None:
    """``grad_q`` (2,): d out_2 / d q for the query q = [1, 0] at scale 1 (out_2 = the output's second coordinate).

    With s_j = q.k_j / sqrt(2) and g_j = d out_2 / d s_j = w_j (v_j2 - out_2), the chain rule gives
    d out_2 / d q = sum_j g_j k_j / sqrt(2).
    """
    if grad_q is None:
        return not_attempted("grad_q")
    grad_q = require_tensor("grad_q", torch.as_tensor(grad_q, dtype=torch.float32), (2,))
    q = Q1.clone().requires_grad_()
    w = torch.softmax(KEYS @ q / math.sqrt(2), dim=-1)
    (w @ VALUES)[1].backward()
    expected = q.grad
    w = w.detach()
    g = w * (VALUES[:, 1] - w @ VALUES[:, 1])                          # (3,) gradient on the scaled scores
    if close(grad_q, -expected, atol=5e-3):
        raise ExerciseError("the sign is flipped: g_j = w_j (v_j2 - out_2), and "
                            "d out_2 / d q = sum_j g_j k_j / sqrt(2)")
    if close(grad_q, g @ KEYS, atol=5e-3):
        raise ExerciseError("you forgot the 1/sqrt(2): s_j = q.k_j / sqrt(2), so d s_j / d q = k_j / sqrt(2)")
    if close(grad_q, g @ KEYS * math.sqrt(2), atol=5e-3):
        raise ExerciseError("you multiplied by sqrt(2); s_j = q.k_j / sqrt(2), so d s_j / d q = k_j / sqrt(2)")
    if close(grad_q, g @ VALUES / math.sqrt(2), atol=5e-3):
        raise ExerciseError("d s_j / d q is the key k_j / sqrt(2), not the value: sum the keys, weighted by g_j")
    if close(grad_q, w @ KEYS / math.sqrt(2), atol=5e-3):
        raise ExerciseError("that sums the keys weighted by the attention weights w_j; weight them by the gradients "
                            "on the scores, g_j = w_j (v_j2 - out_2)")
    if not close(grad_q, expected, atol=5e-3):
        raise ExerciseError(f"d out_2 / d q = sum_j g_j k_j / sqrt(2), with g_j = w_j (v_j2 - out_2) = "
                            f"{[round(x, 4) for x in g.tolist()]} (the gradient on the scores at scale 1)")
    assert expected[0] < 0 < expected[1]                               # away from k_1, towards k_2
    return passed(f"d out_2 / d q = {[round(x, 4) for x in expected.tolist()]}: a step up this gradient turns q "
                  "away from k_1 = [1, 0] and towards k_2 = [0, 1], the key whose value [0, 2] raises out_2")
