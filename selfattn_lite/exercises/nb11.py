"""Checkers for notebook 11: the softmax Jacobian, the gradient of V, and FlashAttention's row term D."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_softmax_jacobian", "check_grad_v", "check_row_term"]


def check_softmax_jacobian(fn) -> None:
    """``fn(p) -> (n, n)``: the Jacobian dp_i / ds_j of p = softmax(s), given p (n,): diag(p) - p p^T."""
    p = torch.softmax(torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64), dim=0)
    try:
        got = attempt(fn, p.clone())
    except NotAttempted:
        return not_attempted("softmax_jacobian")
    got = require_tensor("softmax_jacobian(p)", got, (4, 4))
    want = torch.diag(p) - torch.outer(p, p)
    if close(got, -want):
        raise ExerciseError("the signs are flipped: the diagonal p_i (1 - p_i) is positive, the rest -p_i p_j")
    if close(got, torch.diag(p)):
        raise ExerciseError("only diag(p): raising s_j also lowers every other p_i (the shared denominator), "
                            "so subtract p p^T")
    if close(got, -torch.outer(p, p)):
        raise ExerciseError("only -p p^T: the diagonal also gets + p_i (from the numerator exp(s_i))")
    if close(got, torch.diag(p * (1 - p))):
        raise ExerciseError("only the diagonal p_i (1 - p_i): the off-diagonal entries are -p_i p_j, not 0")
    if close(got, torch.diag(p) - p[:, None] ** 2):
        raise ExerciseError("entry (i, j) off the diagonal is -p_i p_j, not -p_i^2: use the outer product p p^T")
    if not close(got, want):
        raise ExerciseError(f"expected diag(p) - p p^T; row 0 should be {[round(x, 4) for x in want[0].tolist()]}, "
                            f"yours is {[round(x, 4) for x in torch.as_tensor(got)[0].tolist()]}")
    p3 = torch.softmax(torch.randn(3, generator=torch.Generator().manual_seed(11), dtype=torch.float64), dim=0)
    got3 = require_tensor("softmax_jacobian(p) for 3 tokens", attempt(fn, p3.clone()), (3, 3))
    if not close(got3, torch.diag(p3) - torch.outer(p3, p3)):
        raise ExerciseError("right for one p but not for another: build it from the p you are given")
    s = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    autograd = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, 0), s)
    if not close(attempt(fn, torch.softmax(s, 0)), autograd):
        raise ExerciseError("does not match torch.autograd.functional.jacobian of softmax")
    return passed("dp/ds = diag(p) − p pᵀ, the same as torch.autograd.functional.jacobian")


def check_grad_v(fn) -> None:
    """``fn(p, grad_out) -> dV``: p (L, S) attention weights, grad_out (L, Ev) = dO; dV = P^T dO, (S, Ev)."""
    gen = torch.Generator().manual_seed(12)
    p = torch.softmax(torch.randn(5, 5, generator=gen, dtype=torch.float64), dim=-1)     # square first
    do = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    try:
        got = attempt(fn, p.clone(), do.clone())
    except NotAttempted:
        return not_attempted("grad_v")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (3, 5) and close(got, do.T @ p):
        raise ExerciseError("that is (P^T dO)^T = dO^T P, shape (Ev, S): dV has V's shape (S, Ev)")
    got = require_tensor("grad_v(p, grad_out)", got, (5, 3))
    if close(got, p @ do):
        raise ExerciseError("P dO uses the weights the wrong way round: value j received weight P[i, j] from "
                            "query i, so dV[j] = sum_i P[i, j] dO[i], i.e. P^T dO")
    if close(got, do):
        raise ExerciseError("dO alone: each value's gradient is dO weighted by how much each query used it, P^T dO")
    if not close(got, p.T @ do):
        raise ExerciseError("expected dV = P^T dO")
    p2 = torch.softmax(torch.randn(4, 6, generator=gen, dtype=torch.float64), dim=-1)  # L = 4 queries, S = 6 keys
    do2 = torch.randn(4, 2, generator=gen, dtype=torch.float64)
    got2 = attempt(fn, p2, do2)
    if not (isinstance(got2, torch.Tensor) and close(got2, p2.T @ do2)):
        raise ExerciseError("right for square P but not for L = 4 queries, S = 6 keys: dV is (S, Ev) = P^T dO")
    return passed("dV = Pᵀ dO: each value collects dO from every query, weighted by how much that query used it")


def check_row_term(fn) -> None:
    """``fn(out, grad_out) -> D (L,)``: D_i = sum_e dO[i, e] O[i, e] = rowsum(dO * O)."""
    gen = torch.Generator().manual_seed(13)
    p = torch.softmax(torch.randn(4, 6, generator=gen, dtype=torch.float64), dim=-1)   # (L, S)
    v = torch.randn(6, 3, generator=gen, dtype=torch.float64)                          # (S, Ev)
    do = torch.randn(4, 3, generator=gen, dtype=torch.float64)                         # (L, Ev)
    out = p @ v                                                                        # (L, Ev)
    try:
        got = attempt(fn, out.clone(), do.clone())
    except NotAttempted:
        return not_attempted("row_term")
    want = (do * out).sum(-1)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (4, 1):
        got = got[:, 0]                                                # keepdim is fine
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (4, 4) and close(got, do @ out.T):
        raise ExerciseError("dO O^T is the whole (L, L) matrix; D is only its diagonal: (dO * O).sum(-1)")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (3,):
        raise ExerciseError("you summed over the queries (dim 0); D has one entry per query: sum over the last dim")
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        raise ExerciseError("one number for everything: D has one entry per query row, (L,)")
    got = require_tensor("row_term(out, grad_out)", got, (4,))
    if close(got, out.sum(-1) * do.sum(-1)):
        raise ExerciseError("rowsum(O) * rowsum(dO) is not rowsum(dO * O): multiply elementwise first, then sum")
    if not close(got, want):
        raise ExerciseError("expected D = rowsum(dO * O), one number per query")
    dp = do @ v.T                                                      # (L, S)
    if not close(got, (dp * p).sum(-1)):                               # the identity the backward relies on
        raise ExerciseError("D should also equal rowsum(dP * P)")
    return passed("D = rowsum(dO ∘ O), which equals rowsum(dP ∘ P) without ever forming P")
