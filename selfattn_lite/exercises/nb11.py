"""Checkers for notebook 11: the softmax Jacobian, the gradient of V, FlashAttention's row term D, and
one causal tile of FlashAttention's backward pass (with the mask and the skip)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_softmax_jacobian", "check_grad_v", "check_row_term", "check_causal_tile_backward",
           "causal_tile", "CAUSAL_TILE_MISTAKES"]


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


# ----------------------------------------------------------------------------- one causal tile of the backward

def _causal_problem(n: int, dk: int, dv: int, seed: int) -> dict:
    """A causal self-attention problem in float64: inputs, dO, and what the forward saves (O, lse)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                   for shape in ((n, dk), (n, dk), (n, dv), (n, dv)))
    scale = 1 / math.sqrt(dk)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()                  # key j <= query i
    s = (scale * q @ k.T).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                     # (n,) natural log
    out = torch.exp(s - lse[:, None]) @ v                                # (n, dv)
    return dict(q=q, k=k, v=v, out=out, do=do, lse=lse, scale=scale)


def causal_tile(q, k, v, out, grad_out, lse, q_start, k_start, scale, *, mistake=None):
    """One causal tile's (dq, dk, dv), or None for a tile above the diagonal; right, or with a planted mistake.

    The checker's model answer and the source of its diagnoses (``mistake`` names one of ``CAUSAL_TILE_MISTAKES``).
    """
    bq, bk = q.shape[0], k.shape[0]
    last_query = q_start + bq - 1
    skip = {"skip_first_query": k_start > q_start, "never_skip": False}.get(mistake, k_start > last_query)
    if skip:
        return None
    rows = q_start + torch.arange(bq)[:, None]                           # (Bq, 1) absolute query positions
    cols = k_start + torch.arange(bk)[None, :]                           # (1, Bk) absolute key positions
    allowed = cols < rows if mistake == "mask_diagonal" else cols <= rows
    s = scale * q @ k.T if mistake != "unscaled_p" else q @ k.T          # (Bq, Bk)
    if mistake != "no_mask":
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.exp(s) if mistake == "no_lse" else torch.exp(s - lse[:, None])
    dp = grad_out @ v.T                                                  # (Bq, Bk)
    D = (grad_out * out).sum(-1, keepdim=True)                           # (Bq, 1) rowsum(dO * O)
    if mistake == "tile_rowsum":
        D = (dp * p).sum(-1, keepdim=True)
    ds = p * dp if mistake == "no_D" else p * (dp - D)
    c = 1.0 if mistake == "no_scale" else scale
    return c * ds @ k, c * ds.T @ q, p.T @ grad_out                     # dq (Bq, dk), dk (Bk, dk), dv (Bk, dv)


CAUSAL_TILE_MISTAKES = {
    "no_D": "D is missing: you used dP alone; the softmax's gradient is dS = P ∘ (dP − D), with "
            "D = rowsum(dO ∘ O) computed from the out and grad_out you are given (exercise 3)",
    "tile_rowsum": "you subtracted this tile's own rowsum(dP ∘ P); the softmax's row term runs over the whole "
                   "row (every key tile), which is D = rowsum(dO ∘ O), computed from out and grad_out",
    "no_mask": "the mask is not applied: on a tile that straddles the diagonal, the keys after a query "
               "(key position > query position) must get P = 0; set their scores to −inf before exp",
    "mask_diagonal": "your mask also hides the diagonal: a query may attend to itself (key position <= "
                     "query position), only later keys are masked",
    "skip_first_query": "the skip is wrong: you skipped a tile whose first key comes after its FIRST query, but "
                        "its later queries still see some of its keys; skip only when k_start is after the "
                        "tile's LAST query, q_start + Bq − 1",
    "never_skip": "the causal skip is missing: this tile lies entirely above the diagonal (its first key "
                  "comes after its last query), so every P in it is 0; return None instead of computing it",
    "no_scale": "the scale is missing after dS: S = scale · Q Kᵀ, so the chain rule gives "
                "dQ = scale · dS K and dK = scale · dSᵀ Q",
    "unscaled_p": "the scale is missing inside exp: P = exp(scale · q kᵀ − lse)",
    "no_lse": "P = exp(scale · q kᵀ) is not normalised: subtract the saved lse, P = exp(scale · q kᵀ − lse)",
}


def _tile_args(prob: dict, r: slice, c: slice) -> tuple:
    return (prob["q"][r].clone(), prob["k"][c].clone(), prob["v"][c].clone(), prob["out"][r].clone(),
            prob["do"][r].clone(), prob["lse"][r].clone(), r.start, c.start, prob["scale"])


def _tiles(n: int, block_q: int, block_k: int):
    for i in range(0, n, block_q):
        for j in range(0, n, block_k):
            yield slice(i, min(i + block_q, n)), slice(j, min(j + block_k, n))


def _same(got, want) -> bool:
    if want is None or got is None:
        return got is None and want is None
    return isinstance(got, (tuple, list)) and len(got) == 3 and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and close(a, b) for a, b in zip(got, want))


def _call_tile(fn, args: tuple, where: str):
    try:
        return attempt(fn, *args)
    except RuntimeError as error:
        raise ExerciseError(f"causal_tile_backward raised {error} on {where}: check the shapes, q (Bq, dk), "
                            "k (Bk, dk), v (Bk, dv), out and grad_out (Bq, dv), lse (Bq,); a tile need not "
                            "be square (dV = Pᵀ dO and dK = scale dSᵀ q: the keys are the columns of P "
                            "and dS)") from None


def check_causal_tile_backward(fn) -> None:
    """``fn(q, k, v, out, grad_out, lse, q_start, k_start, scale) -> (dq, dk, dv) or None``: one causal tile.

    Queries q_start .. q_start + Bq - 1 against keys k_start .. k_start + Bk - 1 of a causal self-attention
    (key position <= query position may attend). None for a tile above the diagonal (the causal skip);
    otherwise D = rowsum(dO * O), P = exp(scale q k^T + mask - lse), dV = P^T dO, dP = dO v^T,
    dS = P * (dP - D), dQ = scale dS k, dK = scale dS^T q. The checker diagnoses the tiles of a 10-token
    problem in 3 x 4 and 4 x 3 tiles (sizes that do not divide 10), then sums the contributions over
    two whole problems and compares them with autograd through SDPA with is_causal=True.
    """
    prob = _causal_problem(10, 5, 3, seed=111)
    first = (slice(0, 3), slice(0, 4))                                  # a diagonal tile first
    try:
        attempt(fn, *_tile_args(prob, *first))
    except NotAttempted:
        return not_attempted("causal_tile_backward")
    except RuntimeError:
        pass                                                            # reported with its tile below
    for block_q, block_k in ((3, 4), (4, 3)):
        for r, c in _tiles(10, block_q, block_k):
            args = _tile_args(prob, r, c)
            where = f"the tile of queries {r.start}..{r.stop - 1} and keys {c.start}..{c.stop - 1}"
            got = _call_tile(fn, args, where)
            want = causal_tile(*args)
            if _same(got, want):
                continue
            for name, message in CAUSAL_TILE_MISTAKES.items():
                if _same(got, causal_tile(*args, mistake=name)):
                    raise ExerciseError(f"{where}: {message}")
            if want is None:
                raise ExerciseError(f"{where} lies above the diagonal: return None (the causal skip)")
            if got is None:
                raise ExerciseError(f"{where} has keys its queries may see: compute it, do not skip it")
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                raise ExerciseError(f"return three tensors (dq, dk, dv) or None, got {type(got).__name__}")
            shapes = [(r.stop - r.start, 5), (c.stop - c.start, 5), (c.stop - c.start, 3)]
            for part, t, shape in zip(("dq", "dk", "dv"), got, shapes):
                require_tensor(f"{part} on {where}", t, shape)
            wrong = [part for part, a, b in zip(("dq", "dk", "dv"), got, want) if not close(a, b)]
            raise ExerciseError(f"{where}: {', '.join(wrong)} differ from the tile's contributions: "
                                "D = rowsum(dO ∘ O), P = exp(scale q kᵀ + mask − lse), dV = Pᵀ dO, dP = dO vᵀ, "
                                "dS = P ∘ (dP − D), dQ = scale dS k, dK = scale dSᵀ q")
    counts = []
    for n, block_q, block_k, seed in ((10, 3, 4, 112), (13, 5, 2, 113)):   # whole problems, awkward tiles
        prob = _causal_problem(n, 5, 3, seed=seed)
        dq, dk, dv = (torch.zeros(n, e, dtype=torch.float64) for e in (5, 5, 3))
        skipped = total = 0
        for r, c in _tiles(n, block_q, block_k):
            total += 1
            parts = _call_tile(fn, _tile_args(prob, r, c), f"a {n}-token problem in {block_q} x {block_k} tiles")
            if parts is None:
                skipped += 1
                continue
            dq[r] += parts[0]
            dk[c] += parts[1]
            dv[c] += parts[2]
        leaves = [prob[name].clone().requires_grad_() for name in ("q", "k", "v")]
        expected = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=True), leaves, prob["do"])
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
            if not close(a, b, atol=1e-9, rtol=1e-7):
                raise ExerciseError(f"summed over the {block_q} x {block_k} tiles of a {n}-token problem, {name} "
                                    "differs from autograd's: each tile must return only its own contribution")
        counts.append(f"{skipped} of {total} tiles skipped for n = {n} in {block_q} x {block_k} tiles")
    return passed("D = rowsum(dO ∘ O), the mask on the diagonal tiles, the skip above it; summed over awkward "
                  "tiles the contributions equal autograd's (" + "; ".join(counts) + ")")
