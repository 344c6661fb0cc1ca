"""Checkers for notebook 11: the softmax's backward with a learned temperature, the gradient of a learned additive
bias, one tile of weights recomputed from the log-sum-exp (fully masked rows included), and one causal tile
of FlashAttention's backward pass (with the mask and the skip)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import forbidden as _forbidden
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_temperature_softmax_backward", "check_bias_grad", "check_recompute_weights",
           "check_causal_tile_backward", "causal_tile", "CAUSAL_TILE_MISTAKES"]


def _autograd_targets():
    import torch.autograd.functional as autograd_functional
    import torch.func

    return [(torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward"),
            (autograd_functional, "jacobian"), (autograd_functional, "vjp"), (torch.func, "grad"),
            (torch.func, "vjp"), (torch.func, "jacrev"), (torch.func, "jacfwd")]


def _no_autograd(name: str):
    """Within the block, the learner's ``name`` may not call autograd: it is what the answer is checked against."""
    return _forbidden(_autograd_targets(), f"{name} calls autograd, which is what the checker compares it with: "
                                           "derive the gradient from the table of \"The idea\" and write it out")


def _temperature_parts(s, dp, tau):
    """p = softmax(s / tau) and dz = the gradient at s / tau, (L, N) each."""
    p = torch.softmax(s / tau, dim=-1)
    return p, p * (dp - (dp * p).sum(-1, keepdim=True))


def check_temperature_softmax_backward(fn) -> None:
    """``fn(s, dp, tau) -> (ds, dtau)``: p = softmax(s / tau) row by row, s and dp (L, N), tau one number.

    ds = p ∘ (dp − rowsum(dp ∘ p)) / tau (L, N); dtau = −Σ (that gradient at s / tau) ∘ s / tau², one number.
    """
    gen = torch.Generator().manual_seed(12)
    s = torch.randn(4, 6, generator=gen, dtype=torch.float64)                 # (L, N) scores
    dp = torch.randn(4, 6, generator=gen, dtype=torch.float64)                # incoming dL/dp
    tau = 0.5
    try:
        with _no_autograd("temperature_softmax_backward"):
            got = attempt(fn, s.clone(), dp.clone(), tau)
    except NotAttempted:
        return not_attempted("temperature_softmax_backward")
    if isinstance(got, torch.Tensor) or not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise ExerciseError("return two things, (ds, dtau): the gradient of the scores (L, N) and the gradient of "
                            "the temperature, one number")
    ds = require_tensor("ds, the first of temperature_softmax_backward(s, dp, tau)", got[0], (4, 6))
    p, dz = _temperature_parts(s, dp, tau)                                    # dz: the gradient at s / tau
    if close(ds, dz):
        raise ExerciseError("ds is the gradient for tau = 1: the scores enter as s / tau, so the chain rule "
                            "multiplies by d(s / tau)/ds = 1 / tau")
    if close(ds, dz * tau):
        raise ExerciseError("ds is multiplied by tau: the chain rule through s / tau gives a factor 1 / tau, not tau")
    if close(ds, p * dp / tau):
        raise ExerciseError("the row term is missing from ds: every p in a row shares one denominator, so subtract "
                            "rowsum(dp ∘ p) before multiplying by p")
    if close(ds, p * (dp - (dp * p).sum(0, keepdim=True)) / tau):
        raise ExerciseError("rowsum over the queries (dim 0): the softmax runs along each row, sum over dim -1")
    if close(ds, p * (dp - (dp * p).sum()) / tau):
        raise ExerciseError("one sum over the whole matrix: each row has its own rowsum(dp ∘ p), keepdim on dim -1")
    s_leaf, tau_leaf = s.clone().requires_grad_(), torch.tensor(tau, dtype=torch.float64, requires_grad=True)
    want_ds, want_dtau = torch.autograd.grad(torch.softmax(s_leaf / tau_leaf, dim=-1), (s_leaf, tau_leaf), dp)
    if not close(ds, want_ds):
        raise ExerciseError("ds does not match autograd through softmax(s / tau); "
                            "expected p ∘ (dp − rowsum(dp ∘ p)) / tau")
    dtau = torch.as_tensor(got[1], dtype=torch.float64)
    if dtau.numel() != 1:
        raise ExerciseError(f"dtau has shape {tuple(dtau.shape)}: tau is one number that divides every score, so "
                            "its gradient is one number too, the sum over all L × N scores")
    dtau = dtau.reshape(())
    total = (dz * s).sum()
    if close(dtau, total / tau**2):
        raise ExerciseError("dtau has the wrong sign: d(s / tau)/dtau = −s / tau²")
    if close(dtau, -total / tau):
        raise ExerciseError("dtau is missing a factor 1 / tau: d(s / tau)/dtau = −s / tau², not −s / tau")
    if close(dtau, -(dz * s).mean() / tau**2):
        raise ExerciseError("dtau is a mean over the scores: tau is used by all L × N of them, so it gets the SUM "
                            "of their contributions")
    if close(dtau, torch.zeros(())) and not close(want_dtau, torch.zeros(())):
        raise ExerciseError("dtau = 0: the sum of the gradient at s / tau over a row is always 0 (the weights sum to "
                            "1); each entry is multiplied by its own d(s / tau)/dtau = −s / tau² before the sum")
    if not close(dtau, want_dtau):
        raise ExerciseError("dtau does not match autograd through softmax(s / tau); expected "
                            "−Σ (the gradient at s / tau) ∘ s / tau²")
    s2, dp2 = (torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    s2_leaf, tau2_leaf = s2.clone().requires_grad_(), torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    want2 = torch.autograd.grad(torch.softmax(s2_leaf / tau2_leaf, dim=-1), (s2_leaf, tau2_leaf), dp2)
    with _no_autograd("temperature_softmax_backward"):
        got2 = attempt(fn, s2.clone(), dp2.clone(), 2.0)
    if not (isinstance(got2, (tuple, list)) and len(got2) == 2 and close(got2[0], want2[0])
            and close(torch.as_tensor(got2[1], dtype=torch.float64).reshape(-1), want2[1].reshape(-1))):
        raise ExerciseError("right for tau = 0.5 but not for tau = 2 on another (3, 5) problem: "
                            "use the tau you are given")
    return passed("dS = P ∘ (dP − rowsum(dP ∘ P)) / τ and dτ = −Σ (that gradient at s / τ) ∘ s / τ², equal to "
                  "autograd through softmax(s / τ) for τ = 0.5 and 2")


def check_bias_grad(fn) -> None:
    """``fn(q, k, v, bias, grad_out) -> dbias (h, L, N)``: O = softmax(scale q kᵀ + bias) v.

    q (B, h, L, dk), k (B, h, N, dk), v (B, h, N, dv), grad_out (B, h, L, dv); the bias is shared by the batch,
    so dbias = Σ_batch P ∘ (dP − rowsum(dP ∘ P)).
    """
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(3, 2, 4, 8, generator=gen, dtype=torch.float64)           # (B, h, L, dk)
    k = torch.randn(3, 2, 5, 8, generator=gen, dtype=torch.float64)           # (B, h, N, dk)
    v = torch.randn(3, 2, 5, 6, generator=gen, dtype=torch.float64)           # (B, h, N, dv)
    bias = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)           # (h, L, N) learned
    do = torch.randn(3, 2, 4, 6, generator=gen, dtype=torch.float64)          # (B, h, L, dv)
    try:
        with _no_autograd("bias_grad"):
            got = attempt(fn, q.clone(), k.clone(), v.clone(), bias.clone(), do.clone())
    except NotAttempted:
        return not_attempted("bias_grad")
    scale = 1 / math.sqrt(8)
    p = torch.softmax(scale * q @ k.transpose(-2, -1) + bias, dim=-1)         # (B, h, L, N)
    dp = do @ v.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))                            # (B, h, L, N)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (3, 2, 4, 5):
        raise ExerciseError("one gradient per batch element, (B, h, L, N): the bias is shared by the whole batch, "
                            "so its gradient is dS summed over the batch dimension, (h, L, N)")
    got = require_tensor("bias_grad(q, k, v, bias, grad_out)", got, (2, 4, 5))
    if close(got, ds.mean(0)):
        raise ExerciseError("the mean over the batch: a tensor used B times gets the SUM of its B gradients")
    if close(got, scale * ds.sum(0)):
        raise ExerciseError("multiplied by scale: the bias is added after the scaling, so dbias = dS (summed), "
                            "with no scale; scale belongs to dQ and dK only")
    if close(got, (p * dp).sum(0)):
        raise ExerciseError("the row term is missing: dS = P ∘ (dP − rowsum(dP ∘ P)), not P ∘ dP")
    if close(got, dp.sum(0)):
        raise ExerciseError("dP is the gradient of the weights, not of the scores: go through the softmax, "
                            "dS = P ∘ (dP − rowsum(dP ∘ P))")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = F.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3])     # a float mask is added to the scores
    want = torch.autograd.grad(out, leaves[3], do)[0]
    if not close(got, want):
        raise ExerciseError("does not match autograd's gradient of a float attn_mask in torch's SDPA; "
                            "expected dS summed over the batch")
    return passed("dbias = Σ over the batch of P ∘ (dP − rowsum(dP ∘ P)), the same as autograd through "
                  "torch's SDPA with the bias as a float attn_mask")


def check_recompute_weights(fn) -> None:
    """``fn(s, lse) -> p``: one tile of weights from its masked scores s (Bq, Bk) and the rows' saved lse (Bq,),
    0 (not NaN) on a row whose every key is masked (lse = −inf)."""
    gen = torch.Generator().manual_seed(14)
    full = torch.randn(4, 10, generator=gen, dtype=torch.float64)             # (L, N): the whole rows
    allowed = torch.rand(4, 10, generator=gen) > 0.3
    allowed[2] = False                                                        # query 2 sees no key at all
    allowed[0, :4] = False                                                    # query 0 sees nothing in this tile
    allowed[0, 5] = True
    full = full.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(full, dim=-1)                                       # (L,), -inf on row 2
    s = full[:, :4].clone()                                                   # one tile: the first 4 keys
    try:
        with _no_autograd("recompute_weights"):
            got = attempt(fn, s.clone(), lse.clone())
    except NotAttempted:
        return not_attempted("recompute_weights")
    got = require_tensor("recompute_weights(s, lse)", got, (4, 4))
    want = torch.softmax(full.masked_fill(~allowed.any(-1, keepdim=True), 0.0), dim=-1)[:, :4]
    want = want.masked_fill(~allowed.any(-1, keepdim=True), 0.0)              # the full row's softmax, this tile
    if close(got[[1, 3]], torch.softmax(s[[1, 3]], dim=-1)):
        raise ExerciseError("a softmax over this tile normalises over its 4 keys only; the row goes on in other "
                            "tiles, which is why the forward saved lse: P = exp(s − lse)")
    if got.isnan().any():
        rows = sorted({int(i) for i in got.isnan().nonzero()[:, 0]})
        raise ExerciseError(f"NaN on row {rows}: a query that sees no key has lse = −inf, and s − lse = −inf − (−inf) "
                            "is NaN; give such a row P = 0 (torch.where, or replace its lse by 0 before subtracting)")
    if close(got, torch.exp(s)):
        raise ExerciseError("exp(s) alone is not normalised: subtract the row's saved lse, P = exp(s − lse)")
    if got[2].any():
        raise ExerciseError("row 2 sees no key at all (lse = −inf): its weights must all be 0")
    if not close(got, want):
        bad = sorted({int(i) for i in (got - want).abs().gt(1e-6).nonzero()[:, 0]})
        raise ExerciseError(f"rows {bad} differ from exp(s − lse); a row with every key masked in this tile but "
                            "some key elsewhere (row 0) is 0 here too, and only a row with lse = −inf needs the guard")
    return passed("P = exp(s − lse) from the saved log-sum-exp, the whole row's softmax on this tile, and 0 "
                  "(no NaN) on a fully masked row")


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
            "D = rowsum(dO ∘ O) computed from the out and grad_out you are given",
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
        with _no_autograd("causal_tile_backward"):
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
        with _no_autograd("causal_tile_backward"):
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
