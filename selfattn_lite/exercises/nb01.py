"""Checkers for notebook 01: a stable row softmax, softmax's Jacobian, the saturated share predicted from the
scores' distribution, and attention from scratch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import forbidden as _forbidden
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_softmax", "check_softmax_jacobian", "check_saturated_share", "check_attention"]


def _softmax_targets():
    return [(torch, "softmax"), (F, "softmax"), (torch.special, "softmax"), (torch.Tensor, "softmax")]


def _attention_targets():
    import selfattn_lite

    from .. import attention

    return [(F, "scaled_dot_product_attention"), (selfattn_lite, "scaled_dot_product_attention"),
            (attention, "scaled_dot_product_attention")]


def check_softmax(fn) -> None:
    """``fn(x)`` must return softmax over the last dim of x, without overflowing."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, generator=gen)
    no_softmax = _forbidden(_softmax_targets(), "softmax_rows calls torch's softmax, the function it is meant to "
                            "rebuild: write it from exp and a row sum")
    try:
        with no_softmax:
            got = attempt(fn, x.clone())
    except NotAttempted:
        return not_attempted("softmax_rows")
    got = require_tensor("softmax_rows(x)", got, x.shape)
    if close(got, torch.softmax(x, dim=0)) and not close(got, torch.softmax(x, dim=-1)):
        raise ExerciseError("your columns sum to 1, not your rows: softmax runs over the keys, the last dim (dim=-1)")
    if not close(got.sum(-1), torch.ones(4)):
        raise ExerciseError(f"each row should sum to 1, yours sum to {got.sum(-1).tolist()}: divide exp(x) by its "
                            "row sum (keepdim=True so it broadcasts)")
    if not close(got, torch.softmax(x, dim=-1)):
        raise ExerciseError("rows sum to 1 but the values differ from softmax: use exp(x_j) / sum_j exp(x_j)")
    x3 = torch.randn(2, 3, 4, generator=gen)                      # (batch, rows, keys): the last dim is 2, not 1
    with _forbidden(_softmax_targets(), "softmax_rows calls torch's softmax"):
        got3 = require_tensor("softmax_rows(x) for a 3-D x", attempt(fn, x3.clone()), x3.shape)
    if not close(got3, torch.softmax(x3, dim=-1)):
        hint = (" (yours normalises over dim=1, which is the last dim only for 2-D inputs)"
                if close(got3, torch.softmax(x3, dim=1)) else "")
        raise ExerciseError("a 3-D input (batch, rows, keys) gives the wrong answer" + hint + ": normalise over "
                            "the last dim, dim=-1, whatever the number of dims")
    big = x * 1000
    with _forbidden(_softmax_targets(), "softmax_rows calls torch's softmax"):
        got_big = attempt(fn, big.clone())
    if not torch.isfinite(got_big).all():
        e = (big - big.max()).exp()                                # what subtracting the global max gives
        global_max = e / e.sum(-1, keepdim=True)
        if torch.equal(torch.isfinite(got_big), torch.isfinite(global_max)):
            raise ExerciseError("scores of size ~1000 give NaN in the rows whose max is far below the largest score "
                                "overall: you subtract one global max, so exp underflows to 0 in the whole row and "
                                "0/0 = NaN. Subtract each row's own max (x.amax(dim=-1, keepdim=True))")
        raise ExerciseError("scores of size ~1000 give inf/NaN: exp overflows. Subtract each row's max first "
                            "(softmax(x) = softmax(x - max(x)))")
    if not close(got_big, torch.softmax(big, dim=-1)):
        raise ExerciseError("large scores give the wrong answer: subtract each row's own max before exp")
    return passed("a numerically stable softmax over the last dim")


def _jacobian_targets():
    import torch.autograd.functional as autograd_functional
    import torch.func

    return [(autograd_functional, "jacobian"), (torch.autograd, "grad"), (torch.func, "jacrev"),
            (torch.func, "jacfwd"), (torch.func, "vjp"), (torch.Tensor, "backward")]


def check_softmax_jacobian(fn) -> None:
    """``fn(s)`` must return J (..., n, n), J[..., i, j] = dw_i/ds_j for w = softmax(s) over the last dim.

    The answer is diag(w) - w w^T, built from the formula, checked against autograd's Jacobian row by row.
    """
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(5, generator=gen) * 2                                       # one row of 5 scores
    ref = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), s)  # (5, 5)
    w = torch.softmax(s, -1)
    no_autograd = _forbidden(_jacobian_targets(), "softmax_jacobian uses autograd, which is what it is checked "
                             "against: build J from the formula w_i (delta_ij - w_j)")
    try:
        with no_autograd:
            got = attempt(fn, s.clone())
    except NotAttempted:
        return not_attempted("softmax_jacobian")
    got = require_tensor("softmax_jacobian(s) for s of shape (5,)", got, (5, 5))
    if close(got, -ref):
        raise ExerciseError("the sign is flipped: J = diag(w) - w w^T, positive on the diagonal")
    if close(got, torch.diag(w)):
        raise ExerciseError("only diag(w): the term -w_i w_j is missing, and it is there for every i and j")
    if close(got, -torch.outer(w, w)):
        raise ExerciseError("only -w w^T: the delta_ij term is missing, add diag(w) (torch.diag_embed for a batch)")
    if close(got, torch.diag(w - w * w)):
        raise ExerciseError("the diagonal w_i (1 - w_i) is right, but the off-diagonal entries are -w_i w_j, not 0")
    if close(got, torch.diag(s) - torch.outer(s, s)):
        raise ExerciseError("this is the formula in the scores s: it is in the weights w = softmax(s)")
    if not close(got, ref):
        raise ExerciseError("J differs from autograd's Jacobian of softmax: J[i, j] = w_i (delta_ij - w_j), "
                            "w = softmax(s), row i the output w_i, column j the score s_j")
    batch = torch.randn(2, 3, 4, generator=gen) * 2                             # (..., n) with two batch dims
    with _forbidden(_jacobian_targets(), "softmax_jacobian uses autograd"):
        try:
            got_batch = fn(batch.clone())
        except ExerciseError:
            raise
        except Exception as err:                                               # e.g. torch.diag on a 3-D input
            raise ExerciseError(f"right for one row, but a batch of scores (2, 3, 4) raises {type(err).__name__}: "
                                f"{err}. Use torch.diag_embed(w) and w[..., :, None] * w[..., None, :]") from None
    got_batch = require_tensor("softmax_jacobian(s) for s of shape (2, 3, 4)", got_batch, (2, 3, 4, 4))
    w_b = torch.softmax(batch, -1)
    if not close(got_batch, torch.diag_embed(w_b) - w_b[..., :, None] * w_b[..., None, :]):
        raise ExerciseError("right for one row, wrong for a batch (2, 3, 4): every leading dim is a batch dim, "
                            "J is (..., n, n); torch.diag_embed and broadcasting keep them")
    big = torch.tensor([1000.0, 0.0, -1000.0])
    with _forbidden(_jacobian_targets(), "softmax_jacobian uses autograd"):
        got_big = require_tensor("softmax_jacobian(s) for s = [1000, 0, -1000]", attempt(fn, big.clone()), (3, 3))
    if not torch.isfinite(got_big).all():
        raise ExerciseError("scores of size 1000 give inf/NaN: compute w with a stable softmax (torch.softmax is "
                            "allowed here)")
    if not close(got_big, torch.zeros(3, 3)):
        raise ExerciseError("for the saturated row s = [1000, 0, -1000], w is one-hot and J should be all 0")
    return passed("J = diag(w) - w w^T; each row of J sums to 0, and a saturated row's J is 0")


def _gaussian_share(std: float, n_keys: int = 16, rows: int = 200_000, seed: int = 7) -> float:
    """Share of rows of ``n_keys`` scores drawn from N(0, std^2) whose largest softmax weight exceeds 0.99."""
    s = torch.randn(rows, n_keys, generator=torch.Generator().manual_seed(seed)) * std
    return (torch.softmax(s, dim=-1).amax(dim=-1) > 0.99).float().mean().item()


def _measured_share(dk: int, rows: int = 1024, n_keys: int = 16, seed: int = 0) -> float:
    """The same share measured the long way: unscaled q . k_j with standard-normal q, k of width dk (each row's
    scores share its q: given q they are N(0, |q|^2), and |q|^2 varies around dk)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, 1, dk, generator=g)                                  # (rows, 1, dk)
    k = torch.randn(rows, n_keys, dk, generator=g)                             # (rows, n_keys, dk)
    s = (q @ k.transpose(-2, -1)).squeeze(1)                                   # (rows, n_keys)
    return (torch.softmax(s, dim=-1).amax(dim=-1) > 0.99).float().mean().item()


def check_saturated_share(fn) -> None:
    """``fn(dk, scale, n_keys=16, rows=100_000, seed=0)`` must return the share (a number in [0, 1]) of rows whose
    largest softmax weight exceeds 0.99, for rows of ``n_keys`` scores scale * q . k_j drawn directly from the
    shortcut N(0, scale^2 dk), without forming q or k. (Given q, with standard-normal k, the scores are exactly
    N(0, scale^2 |q|^2); the shortcut replaces |q|^2 by its mean dk, and ignores that a row's scores share q.)

    Checked at dk = 16 ... 1024, unscaled and scaled, against the checker's own draws of the shortcut (tolerance
    0.03: sampling noise of 20,000 rows, and the small gap between the fixed std sqrt(dk) and the exact,
    |q|-dependent one). Then the shortcut is compared with real q and k, unscaled: at dk = 16, where |q|^2 / dk
    spreads most (20,000 rows), and at dk = 4096 (1024 rows); both must agree within 0.05.
    """
    try:
        first = attempt(fn, 64, 1.0, 16, 20_000)
    except NotAttempted:
        return not_attempted("saturated_share")
    if isinstance(first, torch.Tensor):
        if first.numel() != 1:
            raise ExerciseError(f"saturated_share returned a tensor of shape {tuple(first.shape)}: return one number, "
                                "the share of saturated rows (the mean of the per-row test)")
        first = first.item()
    if not isinstance(first, (int, float)):
        raise ExerciseError(f"saturated_share returned {type(first).__name__}: return one number in [0, 1]")
    if first > 1:
        raise ExerciseError(f"saturated_share(64, 1.0, rows=20_000) = {first:g} is more than 1: that is a count of "
                            "rows, return the share (divide by the number of rows, or take the mean)")
    tolerance = 0.03
    cases = [(dk, 1.0, "unscaled") for dk in (16, 64, 256, 1024)]          # unscaled first: it tells the std's
    cases += [(dk, 1 / math.sqrt(dk), "scaled by 1/sqrt(dk)") for dk in (16, 64, 256, 1024)]   # mistakes apart
    for dk, scale, name in cases:
        got = float(attempt(fn, dk, scale, 16, 20_000))
        want = _gaussian_share(scale * math.sqrt(dk))
        if abs(got - want) <= tolerance:
            continue
        where = f"at dk = {dk}, {name}, your share is {got:.3f} where the scores' distribution gives {want:.3f}"
        if abs(got - _gaussian_share(math.sqrt(dk))) <= tolerance:
            raise ExerciseError(f"{where}: the scale is ignored; multiply the scores by it (std scale * sqrt(dk))")
        if abs(got - _gaussian_share(scale * dk)) <= tolerance:
            raise ExerciseError(f"{where}: your scores have standard deviation scale * dk, which is their "
                                "variance's scale: Var(q . k) = dk, so the standard deviation is sqrt(dk)")
        if abs(got - (1 - _gaussian_share(scale * math.sqrt(dk)))) <= tolerance:
            raise ExerciseError(f"{where}: that is the share of rows that are NOT saturated: count the rows "
                                "whose largest weight is above 0.99")
        if float(attempt(fn, 4, 0.5, 16, 1)) == 1:                   # std 1: one row of 16 keys never saturates
            raise ExerciseError(f"{where}: the softmax ran over the rows (dim=0), not over each row's keys "
                                "(dim=-1): a single row (rows=1) comes out saturated")
        if abs(got - _gaussian_share(scale)) <= tolerance:
            raise ExerciseError(f"{where}: your scores have standard deviation scale, without the sqrt(dk) "
                                "that d_k unit-variance products add up to (Var(q . k) = dk)")
        raise ExerciseError(f"{where}: draw (rows, n_keys) scores with standard deviation scale * sqrt(dk), take "
                            "softmax over each row (dim=-1), and count the rows whose largest weight exceeds 0.99")
    predicted_16 = float(attempt(fn, 16, 1.0, 16, 20_000))
    measured_16 = _measured_share(16, rows=20_000)
    if abs(predicted_16 - measured_16) > 0.05:
        raise ExerciseError(f"right against the shortcut, but at dk = 16 your share {predicted_16:.3f} is far from "
                            f"{measured_16:.3f}, measured with 20,000 rows of real 16-wide q and k")
    predicted = float(attempt(fn, 4096, 1.0))
    measured = _measured_share(4096)
    if abs(predicted - measured) > 0.05:
        raise ExerciseError(f"right at dk <= 1024, but at dk = 4096 your share {predicted:.3f} is far from "
                            f"{measured:.3f}, measured with 1024 rows of real 4096-wide q and k")
    return passed(f"rows of 16 unscaled scores, the shortcut against real q and k: at dk = 16 your function "
                  f"predicts {predicted_16:.1%} saturated, 20,000 rows of real q and k give {measured_16:.1%}; "
                  f"at dk = 4096 {predicted:.0%} against {measured:.0%} (1024 rows); scaled, none")


def check_attention(fn) -> None:
    """``fn(q, k, v, mask=None)`` must return (output, weights) of scaled dot-product attention.

    q (B, L, dk), k (B, S, dk), v (B, S, dv); mask (L, S) bool, True = may attend.
    """
    gen = torch.Generator().manual_seed(2)
    B, L, S, dk, dv = 2, 4, 6, 8, 5
    q = torch.randn(B, L, dk, generator=gen)
    k = torch.randn(B, S, dk, generator=gen)
    v = torch.randn(B, S, dv, generator=gen)
    mask = torch.rand(L, S, generator=gen) > 0.4
    mask[:, 0], mask[:, 1] = True, False  # every row allows some keys and forbids others
    raw = q @ k.transpose(-2, -1)

    def reference(scores, mask=None):
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return w @ v, w

    no_sdpa = _forbidden(_attention_targets(), "attention calls a library's scaled_dot_product_attention, the "
                         "function it is meant to rebuild: write the scores, the softmax and the weighted sum")
    try:
        with no_sdpa:
            result = attempt(fn, q, k, v)
    except NotAttempted:
        return not_attempted("attention")
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseError("return a pair (output, weights)")
    out, w = result
    require_tensor("weights", w, (B, L, S))
    require_tensor("output", out, (B, L, dv))
    if close(w, reference(raw)[1]):
        raise ExerciseError("the weights match softmax(Q K^T) without scaling: divide the scores by sqrt(dk)")
    if close(w, reference(raw / dk)[1]):
        raise ExerciseError("you divided the scores by dk: divide by sqrt(dk)")
    if close(w, torch.softmax(raw / math.sqrt(dk), dim=-2)):
        raise ExerciseError("softmax ran over the queries (dim=-2): normalise over the keys, dim=-1")
    expected_out, expected_w = reference(raw / math.sqrt(dk))
    if not close(w, expected_w):
        raise ExerciseError("the weights differ from softmax(Q K^T / sqrt(dk)): check the transpose of K")
    if not close(out, expected_out):
        raise ExerciseError("the weights are right but the output is not weights @ V")
    with _forbidden(_attention_targets(), "attention calls a library's scaled_dot_product_attention"):
        out_m, w_m = attempt(fn, q, k, v, mask)
    if close(w_m, reference(raw / math.sqrt(dk), ~mask)[1]):
        raise ExerciseError("mask polarity is flipped: in this course (and torch SDPA) True means 'may attend'; "
                            "fill the scores with -inf where the mask is False")
    if close(w_m, expected_w):
        raise ExerciseError("the mask was ignored: set the scores to -inf where mask is False before the softmax")
    expected_out_m, expected_w_m = reference(raw / math.sqrt(dk), mask)
    if not close(w_m, expected_w_m) or not close(out_m, expected_out_m):
        raise ExerciseError("with a mask the result is wrong: use scores.masked_fill(~mask, float('-inf'))")
    return passed("softmax(Q K^T / sqrt(dk) + M) V, with the mask the right way round")
