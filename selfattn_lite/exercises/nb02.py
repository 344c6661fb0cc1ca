"""Checkers for notebook 02: the worked 3-token example (token 2's causal row, the scale at which token 2
drops out of a tied row, the gradient on the query as a function of the query)."""

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


QUERIES = ([1.0, 0.0], [10.0, 0.0], [10.0, 10.0], [-1.0, 1.0], [3.0, -2.0])   # the three of the prompt, two more


def _query_gradient_parts(q: torch.Tensor, coord: int = 1, scale: float = 2 ** -0.5):
    """(g, w) for query q (2,): the gradient of the output's coordinate ``coord`` on the scaled scores
    s_j = scale * q.k_j, g_j = w_j (v_j,coord - o_coord), and the weights w = softmax(s)."""
    w = torch.softmax(KEYS @ q * scale, dim=-1)
    return w * (VALUES[:, coord] - w @ VALUES[:, coord]), w


def check_query_gradient(query_gradient) -> None:
    """``query_gradient(q)`` (2,) -> (2,): d o_y / d q over the example's keys and values, o_y the output's
    second coordinate, for any query q.

    With s_j = q.k_j / sqrt(2) and g_j = d o_y / d s_j = w_j (v_jy - o_y), the chain rule gives
    d o_y / d q = sum_j g_j k_j / sqrt(2). Checked against autograd at ``QUERIES``.
    """
    if not callable(query_gradient):
        if query_gradient is None:
            return not_attempted("query_gradient")
        raise ExerciseError("pass your function query_gradient itself (it takes a query q and returns d o_y / d q), "
                            f"not a {type(query_gradient).__name__}")
    try:
        attempt(query_gradient, Q1.clone())
    except NotAttempted:
        return not_attempted("query_gradient")
    queries = [torch.tensor(x) for x in QUERIES]
    got, expected = [], []
    for q in queries:
        out = require_tensor(f"query_gradient({q.tolist()})",
                             torch.as_tensor(attempt(query_gradient, q.clone()), dtype=torch.float32), (2,))
        got.append(out)
        leaf = q.clone().requires_grad_()
        (torch.softmax(KEYS @ leaf / math.sqrt(2), dim=-1) @ VALUES)[1].backward()
        expected.append(leaf.grad)

    def matches(wrong) -> bool:                                        # ``wrong(q)`` (2,) at every query
        return all(close(a, wrong(q), atol=1e-4) for a, q in zip(got, queries))

    def g(q, **kw):
        return _query_gradient_parts(q, **kw)[0]

    def w(q):
        return _query_gradient_parts(q)[1]

    if matches(lambda q: -(g(q) @ KEYS) / math.sqrt(2)):
        raise ExerciseError("the sign is flipped: g_j = w_j (v_jy - o_y), and d o_y / d q = sum_j g_j k_j / sqrt(2)")
    if matches(lambda q: g(q) @ KEYS):
        raise ExerciseError("you forgot the 1/sqrt(2) of the chain rule: s_j = q.k_j / sqrt(2), so "
                            "d s_j / d q = k_j / sqrt(2)")
    if matches(lambda q: g(q) @ KEYS * math.sqrt(2)):
        raise ExerciseError("you multiplied by sqrt(2); s_j = q.k_j / sqrt(2), so d s_j / d q = k_j / sqrt(2)")
    if matches(lambda q: g(q) @ VALUES / math.sqrt(2)):
        raise ExerciseError("d s_j / d q is the key k_j / sqrt(2), not the value: sum the keys, weighted by g_j")
    if matches(lambda q: w(q) @ KEYS / math.sqrt(2)):
        raise ExerciseError("that sums the keys weighted by the attention weights w_j; weight them by the gradients "
                            "on the scores, g_j = w_j (v_jy - o_y)")
    if matches(lambda q: g(q, coord=0) @ KEYS / math.sqrt(2)):
        raise ExerciseError("that is the gradient of o_x, the output's first coordinate (VALUES[:, 0]); the loss is "
                            "o_y, the second (VALUES[:, 1])")
    if matches(lambda q: g(q, scale=1.0) @ KEYS / math.sqrt(2)):
        raise ExerciseError("your weights come from unscaled scores q.k_j: divide the scores by sqrt(2) before the "
                            "softmax")
    for a, e, q in zip(got, expected, queries):
        if not close(a, e, atol=1e-4):
            hint = (" (right at [1, 0] only: compute the weights from the q your function is given)"
                    if close(got[0], expected[0], atol=1e-4) else "")
            raise ExerciseError(f"at q = {q.tolist()} d o_y / d q is not {[round(x, 4) for x in a.tolist()]}{hint}; "
                                "from the weights w = softmax(KEYS @ q / sqrt(2)): g_j = w_j (v_jy - o_y), then "
                                "the chain rule through s_j = q.k_j / sqrt(2)")
    start, tie, win = expected[:3]
    assert start[0] < 0 < start[1]                                      # away from k_1, towards k_2
    assert abs(tie[0]) < 0.01 * tie[1]                                  # the tie: along k_3 - k_1 = [0, 1]
    assert win.norm() < 0.01 * tie.norm() and win.norm() < 0.01 * start.norm()   # one winner: all but gone
    return passed(f"at q = [1, 0], d o_y / d q = {[round(x, 4) for x in start.tolist()]}: a step up it turns q "
                  "away from k_1 and towards k_2, whose value [0, 2] raises o_y. In the tie [10, 0] it is "
                  f"{[round(x, 4) for x in tie.tolist()]}, along k_3 - k_1 = [0, 1]: it breaks the tie towards "
                  "token 3 (value [1, 1]), so a tie still trains. With one winner, [10, 10], it is "
                  f"{[round(x, 4) for x in win.tolist()]}: the saturated row passes almost nothing to q")
