"""Checkers for notebook 03: the left-padded generation mask, a causal mask from positions, a safe softmax."""

from __future__ import annotations

import torch

from .. import masks
from . import ExerciseError, NotAttempted, attempt, close, names_used, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_left_padded_mask", "check_mask_from_positions", "check_safe_softmax"]


def _require_bool(name: str, mask, shape) -> torch.Tensor:
    mask = require_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise ExerciseError(f"{name} should be a bool tensor (True = may attend), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ExerciseError(f"{name} should have shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask



# --------------------------------------------------------------------------------------
# 1. the mask of a left-padded batch, for generation
# --------------------------------------------------------------------------------------


def _left_real(lengths: list[int], T: int) -> torch.Tensor:
    """(B, T) bool, True = real token: sentence b's lengths[b] tokens fill the last positions."""
    return torch.arange(T)[None, :] >= T - torch.tensor(lengths)[:, None]


def _left_padded(lengths: list[int], T: int) -> torch.Tensor:
    causal = torch.ones(T, T, dtype=torch.bool).tril()                     # (T, T)
    return causal[None] & _left_real(lengths, T)[:, None, :]                # (B, T, T)


def check_left_padded_mask(fn) -> None:
    """``fn(lengths, T)`` -> (B, T, T) bool for a left-padded batch: key j for query i iff j <= i and j is real.

    On a right answer it also shows what the mask is for: with it, the last position of every
    sentence gets, to rounding, the output that sentence gets alone (no padding at all).
    """
    lengths, T = [3, 5, 1], 5
    try:
        got = attempt(fn, list(lengths), T)
    except NotAttempted:
        return not_attempted("left_padded_mask")
    expected = _left_padded(lengths, T)
    got = _require_bool("left_padded_mask(lengths, T)", got, expected.shape)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    real = _left_real(lengths, T)
    right_real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    if torch.equal(got, ~expected):
        raise ExerciseError("the polarity is flipped: True must mean 'may attend' (torch SDPA's convention)")
    if torch.equal(got, causal[None] & right_real[:, None, :]):
        raise ExerciseError("this is the right-padded mask: here the padding is on the LEFT, so sentence b's real "
                            "tokens are the last lengths[b] positions, j >= T - lengths[b]")
    if torch.equal(got, causal[None] & real[:, :, None]):
        raise ExerciseError("you masked padded *queries* (rows) instead of padded *keys* (columns): the real-token "
                            "mask must broadcast over the query dim, real[:, None, :]")
    if torch.equal(got, torch.ones(T, T, dtype=torch.bool).triu()[None] & real[:, None, :]):
        raise ExerciseError("your triangle is the upper one: that lets a query see the future. Key j is allowed "
                            "for query i when j <= i (lower triangle)")
    if torch.equal(got, causal[None].expand_as(got)):
        raise ExerciseError("the causal part is right but the padding is missing: the first T - lengths[b] keys "
                            "of sentence b are padding and must be False")
    if torch.equal(got, real[:, None, :].expand_as(got)):
        raise ExerciseError("the padding part is right but the causal part is missing: also require j <= i")
    for shift, what in ((1, "drops the first real token"), (-1, "lets in the last padding token")):
        off = torch.arange(T)[None, :] >= T - torch.tensor(lengths)[:, None] + shift
        if torch.equal(got, causal[None] & off[:, None, :]):
            raise ExerciseError(f"off by one: your mask {what}. With T = {T} and length n the real tokens are "
                                f"positions T - n .. T - 1")
    if not torch.equal(got, expected):
        wrong = tuple((got != expected).nonzero()[0].tolist())
        raise ExerciseError(f"entry (b, i, j) = {wrong} is {bool(got[wrong])}, expected {bool(expected[wrong])} "
                            f"(lengths {lengths}, T = {T}, padding on the left)")
    # what the mask is for: the last column, the one generation reads, equals each sentence alone
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(len(lengths), T, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=got)          # (B, T, 4)
    for b, n in enumerate(lengths):
        alone = torch.nn.functional.scaled_dot_product_attention(q[b, T - n:], k[b, T - n:], v[b, T - n:],
                                                                 is_causal=True)
        if not close(out[b, -1], alone[-1]):
            raise ExerciseError(f"sentence {b}'s last output differs from the sentence alone")
    return passed("left padding, causal AND real keys; every sentence's last position gets the output it gets "
                  "alone, to rounding")


# --------------------------------------------------------------------------------------
# 2. a causal mask from positions
# --------------------------------------------------------------------------------------


def check_mask_from_positions(fn) -> None:
    """``fn(q_pos, k_pos)`` -> (L, S) bool, True where k_pos[j] <= q_pos[i]; both alignments are special cases."""
    L, S = 3, 5
    cases = [
        ("top-left: the queries are the first L positions", torch.arange(L), torch.arange(S),
         torch.ones(L, S, dtype=torch.bool).tril()),
        ("bottom-right: the queries are the last L positions", torch.arange(S - L, S), torch.arange(S),
         torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)),
        ("positions out of order", torch.tensor([6, 1, 3]), torch.tensor([0, 2, 4, 5, 6]), None),
        ("positions that repeat", torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1, 2, 0, 1, 2]), None),
    ]
    for what, q_pos, k_pos, expected in cases:
        if expected is None:
            expected = k_pos[None, :] <= q_pos[:, None]
        shape = (len(q_pos), len(k_pos))
        try:
            got = attempt(fn, q_pos.clone(), k_pos.clone())
        except NotAttempted:
            return not_attempted("mask_from_positions")
        if isinstance(got, torch.Tensor) and tuple(got.shape) == shape[::-1] and shape[0] != shape[1]:
            raise ExerciseError(f"the mask has shape {shape[::-1]}: rows are queries, columns are keys, (L, S)")
        got = _require_bool(f"mask_from_positions (case: {what})", got, shape)
        if torch.equal(got, ~expected):
            raise ExerciseError("the polarity is flipped: True must mean 'may attend'")
        if torch.equal(got, k_pos[None, :] < q_pos[:, None]):
            raise ExerciseError("off by one: a token may attend to itself, so the test is k_pos[j] <= q_pos[i], "
                                "not <")
        if torch.equal(got, k_pos[None, :] >= q_pos[:, None]):
            raise ExerciseError("the comparison is reversed: query i may see key j when the key is NOT after it, "
                                "k_pos[j] <= q_pos[i]")
        if torch.equal(got, torch.ones(shape, dtype=torch.bool).tril()) and not torch.equal(got, expected):
            raise ExerciseError(f"case {what}: you returned the plain lower triangle, which ignores the positions; "
                                "compare k_pos[j] with q_pos[i] instead of j with i")
        if not torch.equal(got, expected):
            wrong = tuple((got != expected).nonzero()[0].tolist())
            raise ExerciseError(f"case {what}: entry (i, j) = {wrong} is {bool(got[wrong])}, expected "
                                f"{bool(expected[wrong])} (q_pos {q_pos.tolist()}, k_pos {k_pos.tolist()})")
    # what positions alone leave out: a packed row (two documents of 3 tokens, each numbered from 0)
    pos, doc = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 0, 0, 1, 1, 1])
    got = _require_bool("mask_from_positions (case: a packed row)", attempt(fn, pos.clone(), pos.clone()), (6, 6))
    if not torch.equal(got, pos[None, :] <= pos[:, None]):
        raise ExerciseError(f"case a packed row: q_pos = k_pos = {pos.tolist()} gives a different mask than "
                            "k_pos[j] <= q_pos[i]")
    across = int((got & ~masks.document_mask(doc)).sum())                    # pairs that cross documents
    future = int((got & ~torch.ones(6, 6, dtype=torch.bool).tril()).sum())   # keys after the query in the row
    if across == 0 or future == 0:     # cannot happen for k_pos[j] <= q_pos[i]; guards the message below
        raise ExerciseError("case a packed row: expected the position rule to let pairs cross documents")
    return passed("key j for query i when k_pos[j] <= q_pos[i]; top-left and bottom-right are two choices of q_pos. "
                  f"Positions alone do not separate packed documents: on the row {pos.tolist()} (two documents) "
                  f"your mask lets {across} query-key pairs cross documents, {future} of them to keys later in the "
                  "row; packing also needs a document mask (masks.document_mask, notebook 13)")


# --------------------------------------------------------------------------------------
# 3. a softmax that stays finite on a fully masked row, forwards and backwards
# --------------------------------------------------------------------------------------


def _reference_safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)       # (..., 1)
    weights = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1)
    return weights.masked_fill(fully_masked, 0.0)


def _scores() -> torch.Tensor:
    """(2, 4, 5) scores: rows with no key masked, some keys masked, every key masked."""
    gen = torch.Generator().manual_seed(5)
    scores = 3 * torch.randn(2, 4, 5, generator=gen)
    ninf = float("-inf")
    scores[0, 1, 3:] = ninf                 # some keys masked
    scores[0, 2] = ninf                     # every key masked
    scores[1, 0] = ninf
    scores[1, 3, :4] = ninf                 # one key left
    return scores


def check_safe_softmax(fn) -> None:
    """``fn(scores)`` -> weights of the same shape: softmax over the last dim, 0 on rows that are all -inf.

    Graded forwards (rows with a visible key match torch.softmax, fully masked rows are exactly 0)
    and backwards (the gradient reaching the scores is finite and matches the reference's).
    """
    used = sorted(names_used(fn) & {"safe_softmax", "_safe_softmax", "scaled_dot_product_attention"})
    if used:
        raise ExerciseError(f"your function calls {', '.join(used)}: the exercise is to write the guard yourself, "
                            "from torch.softmax and masking")
    scores = _scores()
    fully = torch.isneginf(scores).all(-1)                                   # (2, 4)
    x = scores.clone().requires_grad_()
    try:
        got = attempt(fn, x)
    except NotAttempted:
        return not_attempted("safe_softmax")
    got = require_tensor("safe_softmax(scores)", got, scores.shape)
    expected = _reference_safe_softmax(scores)
    if not close(got[~fully], expected[~fully]):
        if not close(got.detach()[~fully].sum(-1), torch.ones(int((~fully).sum()))):
            raise ExerciseError("a row with a visible key does not sum to 1: normalise each row over its keys, "
                                "the last dim (softmax(..., dim=-1))")
        raise ExerciseError("a row with a visible key differs from torch.softmax(scores, dim=-1): only rows whose "
                            "scores are ALL -inf need the guard; masked keys in other rows keep weight 0")
    if torch.isnan(got[fully]).any():
        raise ExerciseError("a fully masked row is NaN: softmax of a row of only -inf is 0 / 0. Find those rows "
                            "and give them weights of 0")
    n_keys = scores.shape[-1]
    if close(got[fully], torch.full_like(got[fully], 1 / n_keys)):
        raise ExerciseError(f"a fully masked row gets 1/{n_keys} on every key: it attends to padding. A finite "
                            "stand-in for -inf (0, or -1e9) must be followed by zeroing those rows after the softmax")
    if not torch.equal(got[fully].detach(), torch.zeros_like(got[fully])):
        raise ExerciseError("a fully masked row must get weights of exactly 0 (no key to attend to)")
    if not got.requires_grad:
        raise ExerciseError("the weights carry no gradient: compute them with torch operations, no .detach() or "
                            "torch.no_grad(), so training can flow through them")
    upstream = torch.randn(scores.shape, generator=torch.Generator().manual_seed(6))
    (got * upstream).sum().backward()
    if x.grad is None or not torch.isfinite(x.grad).all():
        raise ExerciseError("the forward pass is right but the gradient is NaN: the softmax of the all -inf rows "
                            "is still in the graph (filling or nan_to_num after it only hides it, and 0 x NaN = NaN "
                            "going back). Replace those rows' scores by a finite value BEFORE the softmax")
    ref_x = scores.clone().requires_grad_()
    (_reference_safe_softmax(ref_x) * upstream).sum().backward()
    if not close(x.grad, ref_x.grad):
        raise ExerciseError("the gradient is finite but differs from softmax's: the rows with visible keys must "
                            "keep softmax's gradient, and the fully masked rows get 0")
    return passed("softmax over the keys; a row with no visible key gets 0, forwards and backwards")
