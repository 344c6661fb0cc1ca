"""Checkers for notebook 11: the softmax Jacobian, the gradient of V, FlashAttention's row term D, and
one tile of FlashAttention's backward pass."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_softmax_jacobian", "check_grad_v", "check_row_term", "check_tile_backward"]


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


# ----------------------------------------------------------------------------- one tile of the backward

def _attention_problem(L: int, S: int, dk: int, dv: int, seed: int) -> dict:
    """A full attention problem in float64: inputs, dO, and what the forward saves (O, lse) plus D."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                   for shape in ((L, dk), (S, dk), (S, dv), (L, dv)))
    scale = 1 / math.sqrt(dk)
    lse = torch.logsumexp(scale * q @ k.T, dim=-1)                       # (L,) natural log
    out = torch.exp(scale * q @ k.T - lse[:, None]) @ v                  # (L, dv)
    return dict(q=q, k=k, v=v, do=do, lse=lse, D=(do * out).sum(-1), scale=scale)


def _tile_variants(q, k, v, do, lse, D, scale) -> dict[str, tuple]:
    """One tile's (dq, dk, dv) contributions, right and with the usual mistakes."""
    def grads(p, ds, *, scaled=True, transpose_p=False, transpose_ds=False):
        c = scale if scaled else 1.0
        dv_ = p @ do if transpose_p else p.T @ do
        dk_ = c * ds @ q if transpose_ds else c * ds.T @ q
        return c * ds @ k, dk_, dv_

    p = torch.exp(scale * q @ k.T - lse[:, None])                       # (Bq, Bk)
    dp = do @ v.T                                                        # (Bq, Bk)
    ds = p * (dp - D[:, None])
    local_p = torch.softmax(scale * q @ k.T, dim=-1)                     # normalised over this tile only
    unscaled_p = torch.exp(q @ k.T - lse[:, None])
    no_lse_p = torch.exp(scale * q @ k.T)
    return {
        "right": grads(p, ds),
        "no_scale": grads(p, ds, scaled=False),
        "no_D": grads(p, p * dp),
        "tile_rowsum": grads(p, p * (dp - (dp * p).sum(-1, keepdim=True))),
        "transposed_p": grads(p, ds, transpose_p=True),
        "transposed_ds": grads(p, ds, transpose_ds=True),
        "tile_softmax": grads(local_p, local_p * (dp - D[:, None])),
        "unscaled_p": grads(unscaled_p, unscaled_p * (dp - D[:, None])),
        "no_lse": grads(no_lse_p, no_lse_p * (dp - D[:, None])),
    }


_TILE_MISTAKES = {
    "no_scale": "dQ and dK are off by the factor scale: S = scale · Q Kᵀ, so the chain rule gives "
                "dQ = scale · dS K and dK = scale · dSᵀ Q (you forgot the scale after dS)",
    "no_D": "you used dP without subtracting D: the softmax's gradient is dS = P ∘ (dP − D), "
            "with D = rowsum(dO ∘ O) given, one number per query row",
    "tile_rowsum": "you subtracted this tile's own rowsum(dP ∘ P); the softmax's row term runs over the whole "
                   "row (every key tile), which is exactly the D you are given: dS = P ∘ (dP − D)",
    "transposed_p": "dV = Pᵀ dO: you used P untransposed (P dO); key j collects from every query i "
                    "its weight P[i, j], so transpose P",
    "transposed_ds": "dK = scale · dSᵀ Q: transpose dS (the keys are its columns), as for dV",
    "tile_softmax": "a softmax over this tile normalises by this tile's keys only; recompute "
                    "P = exp(scale · q kᵀ − lse), whose lse is the whole row's normaliser",
    "unscaled_p": "the scores inside exp need the scale: P = exp(scale · q kᵀ − lse)",
    "no_lse": "P = exp(scale · q kᵀ) is not normalised: subtract the saved lse, P = exp(scale · q kᵀ − lse)",
}


def _tile_result(name: str, got, shapes) -> tuple:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise ExerciseError(f"{name} should return three tensors (dq, dk, dv), got {type(got).__name__}")
    return tuple(require_tensor(f"{name}[{i}] ({part})", t, shape)
                 for i, (part, t, shape) in enumerate(zip(("dq", "dk", "dv"), got, shapes)))


def check_tile_backward(fn) -> None:
    """``fn(q, k, v, grad_out, lse, D, scale) -> (dq, dk, dv)``: one tile's contributions to the gradients.

    q (Bq, dk), grad_out (Bq, dv), lse (Bq,) and D (Bq,) are a block of query rows; k (Bk, dk) and v (Bk, dv)
    a block of key rows. P = exp(scale q k^T - lse), dV = P^T dO, dP = dO v^T, dS = P * (dP - D),
    dQ = scale dS k, dK = scale dS^T q. The checker first diagnoses one square tile, then runs the whole
    backward loop over tiles of awkward sizes and compares the sums with autograd.
    """
    prob = _attention_problem(7, 9, 5, 3, seed=111)
    rows, cols = slice(0, 4), slice(2, 6)                                # a square tile inside a longer row
    args = (prob["q"][rows], prob["k"][cols], prob["v"][cols], prob["do"][rows], prob["lse"][rows],
            prob["D"][rows], prob["scale"])
    try:
        got = attempt(fn, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    except NotAttempted:
        return not_attempted("tile_backward")
    except RuntimeError as error:
        raise ExerciseError(f"tile_backward raised {error}: check the shapes, q (Bq, dk), k (Bk, dk), "
                            "v (Bk, dv), grad_out (Bq, dv), lse and D (Bq,)") from None
    got = _tile_result("tile_backward(...)", got, [(4, 5), (4, 5), (4, 3)])
    variants = _tile_variants(*args)
    if not all(close(a, b) for a, b in zip(got, variants["right"])):
        for name, message in _TILE_MISTAKES.items():
            if all(close(a, b) for a, b in zip(got, variants[name])):
                raise ExerciseError(message)
        wrong = [part for part, a, b in zip(("dq", "dk", "dv"), got, variants["right"]) if not close(a, b)]
        raise ExerciseError(f"{', '.join(wrong)} differ from the tile's contributions: P = exp(scale q kᵀ − lse), "
                            "dV = Pᵀ dO, dP = dO vᵀ, dS = P ∘ (dP − D), dQ = scale dS k, dK = scale dSᵀ q")
    for L, S, block_q, block_k in ((7, 9, 3, 4), (10, 6, 4, 5)):         # tiles that do not divide n
        prob = _attention_problem(L, S, 5, 3, seed=112 + L)
        dq, dk, dv = (torch.zeros(*shape, dtype=torch.float64) for shape in ((L, 5), (S, 5), (S, 3)))
        for i in range(0, L, block_q):
            for j in range(0, S, block_k):
                r, c = slice(i, i + block_q), slice(j, j + block_k)
                bq, bk = len(range(L)[r]), len(range(S)[c])
                try:
                    parts = attempt(fn, prob["q"][r].clone(), prob["k"][c].clone(), prob["v"][c].clone(),
                                    prob["do"][r].clone(), prob["lse"][r].clone(), prob["D"][r].clone(), prob["scale"])
                except RuntimeError as error:
                    raise ExerciseError(f"right on a square tile, but a {bq} x {bk} tile raised {error}: "
                                        "a tile need not be square") from None
                t_dq, t_dk, t_dv = _tile_result(f"tile_backward on a {bq} x {bk} tile", parts,
                                                [(bq, 5), (bk, 5), (bk, 3)])
                dq[r] += t_dq
                dk[c] += t_dk
                dv[c] += t_dv
        leaves = [prob[name].clone().requires_grad_() for name in ("q", "k", "v")]
        expected = torch.autograd.grad(F.scaled_dot_product_attention(*leaves), leaves, prob["do"])
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
            if not close(a, b, atol=1e-9, rtol=1e-7):
                raise ExerciseError(f"summed over {block_q} x {block_k} tiles of a {L} x {S} problem, {name} "
                                    "differs from autograd's: each tile must return only its own contribution")
    return passed("one tile's dQ, dK, dV from P = exp(scale q kᵀ − lse) and dS = P ∘ (dP − D); summed over "
                  "awkward tiles they equal autograd's gradients")
