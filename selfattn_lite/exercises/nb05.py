"""Checkers for notebook 05: the sinusoidal offset map, interleaved RoPE by hand, ALiBi slopes, converting
q/k projection rows back from half-split to interleaved pairing, and RoPE in the previous-token experiment."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..positions import (
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    interleaved_to_half_permutation,
    permute_qk_rows,
    sinusoidal_encoding,
)
from . import ExerciseError, NotAttempted, attempt, close, names_used, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_offset_map", "check_rope_interleaved", "check_alibi_slopes", "check_to_interleaved",
           "check_previous_token_rope", "V_SIZE", "D_MODEL", "TRAIN_LEN", "TEST_LEN"]



def _refuse_package(fn, forbidden: tuple[str, ...], what: str) -> None:
    """Raise ExerciseError when the learner's function calls one of the package's answers to the exercise."""
    used = sorted(names_used(fn) & set(forbidden))
    if used:
        raise ExerciseError(f"your function calls the package's {', '.join(used)}: the exercise is to write "
                            f"{what} yourself, from torch operations")


# --------------------------------------------------------------------------------------
# 1. the sinusoidal offset map
# --------------------------------------------------------------------------------------

def _offset_map_ref(k: int, d: int, *, sign: float = 1.0, pair_exponent: float = 2.0,
                    half_split: bool = False) -> torch.Tensor:
    """M_k with PE[m + k] = M_k @ PE[m] for the offset k (float64), with one of the usual mistakes switched on."""
    i = torch.arange(d // 2, dtype=torch.float64)
    b = sign * k * 10000.0 ** (-pair_exponent * i / d)                      # (d/2,) angle added to pair i
    M = torch.zeros(d, d, dtype=torch.float64)
    s, c = (i.long(), i.long() + d // 2) if half_split else (2 * i.long(), 2 * i.long() + 1)   # (sin, cos) rows
    M[s, s], M[s, c] = b.cos(), b.sin()                                     # sin(a + b) = sin a cos b + cos a sin b
    M[c, s], M[c, c] = -b.sin(), b.cos()                                    # cos(a + b) = cos a cos b - sin a sin b
    return M


def check_offset_map(fn) -> None:
    """``fn(delta, d_model)`` must return the (d_model, d_model) matrix M_delta with PE[m + delta] = M_delta @ PE[m]."""
    d = 16
    try:
        got = attempt(fn, 3, d)
    except NotAttempted:
        return not_attempted("offset_map")
    got = require_tensor("offset_map(3, 16)", got, (d, d)).double()
    pe = sinusoidal_encoding(40, d).double()                               # (40, d)
    if close(got, torch.eye(d, dtype=torch.float64)):
        raise ExerciseError("that is the identity: M_3 must turn pair i by the angle 3 * omega_i")
    if close(got, _offset_map_ref(3, d, sign=-1.0)):
        raise ExerciseError("M_3 @ PE[m] gives PE[m - 3]: the map turns each pair backwards (you have M_-3, "
                            "the transpose of M_3); check the signs of the sin b entries")
    if close(got, _offset_map_ref(3, d, pair_exponent=1.0)):
        raise ExerciseError("the angles are off: pair i turns by delta * 10000^(-2i/d_model), "
                            "you used 10000^(-i/d_model)")
    if close(got, _offset_map_ref(3, d, half_split=True)):
        raise ExerciseError("you coupled column i with column i + d/2 (RoPE's half-split pairs); in PE the sine and "
                            "cosine of one angle are neighbours: columns 2i and 2i + 1")
    if not close(got @ got.T, torch.eye(d, dtype=torch.float64)):
        raise ExerciseError("M_delta is not a rotation (M M^T != I): each 2x2 block must be [[cos b, sin b], "
                            "[-sin b, cos b]] with one angle b per pair")
    for k in (3, 1, 10):
        M = require_tensor(f"offset_map({k}, 16)", attempt(fn, k, d), (d, d)).double()
        if not close(pe[k:] @ M.T, pe[:-k]) and not close(pe[k:], pe[:-k] @ M.T):
            worst = (pe[:-k] @ M.T - pe[k:]).abs().max().item()
            raise ExerciseError(f"M_{k} @ PE[m] differs from PE[m + {k}] by up to {worst:.3g}")
        if not close(pe[k:], pe[:-k] @ M.T):
            raise ExerciseError(f"M_{k} @ PE[m] must give PE[m + {k}]; yours gives PE[m - {k}]")
    if not close(attempt(fn, 2, 8).double() @ pe[:1, :8].T, sinusoidal_encoding(3, 8).double()[2:].T):
        raise ExerciseError("offset_map(2, 8) does not take PE[0] to PE[2] for d_model = 8: use d_model in the "
                            "frequencies 10000^(-2i/d_model)")
    return passed("M_delta is block-diagonal, one 2x2 rotation by delta * omega_i per (sin, cos) pair; "
                  "PE[m + delta] = M_delta PE[m]")


# --------------------------------------------------------------------------------------
# 2. interleaved RoPE by hand
# --------------------------------------------------------------------------------------

def _rope_ref(x: torch.Tensor, positions: torch.Tensor, *, interleaved: bool = True, sign: float = 1.0,
              pair_exponent: float = 2.0) -> torch.Tensor:
    """RoPE in float64, with one of the usual mistakes switched on (the default is interleaved and right)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-pair_exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    angles = sign * positions.double()[:, None] * theta                   # (T, d/2)
    return apply_rotary(x.double(), angles.cos(), angles.sin(), interleaved=interleaved)


def check_rope_interleaved(fn) -> None:
    """``fn(x, positions)`` must rotate x (..., T, d) by RoPE with interleaved pairs (x[2i], x[2i+1]), base 10000."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 8, generator=gen, dtype=torch.float64)       # (B, h, T, d)
    positions = torch.tensor([3, 4, 5, 6, 7, 40])
    expected = RotaryEmbedding(8, interleaved=True)(x, positions)
    _refuse_package(fn, ("RotaryEmbedding", "apply_rotary", "rope_inv_freq"), "the rotation")
    try:
        got = attempt(fn, x.clone(), positions.clone())
    except NotAttempted:
        return not_attempted("rope_interleaved")
    got = require_tensor("rope_interleaved(x, positions)", got, x.shape).double()
    rotated = _rope_ref(x[..., interleaved_to_half_permutation(8)], positions, interleaved=False)  # (B, h, T, d)
    if close(got, x):
        raise ExerciseError("x came back unrotated: rotate each pair by the angle position * theta_i")
    if close(got, _rope_ref(x, positions, interleaved=False)):
        raise ExerciseError("you paired halves (x[i], x[i + d/2]), the half-split layout of the cells above; "
                            "Meta's layout pairs neighbours: pair i is (x[2i], x[2i + 1])")
    if close(got, rotated):
        raise ExerciseError("the pairs are rotated right, but you put the results back as [all first coordinates, "
                            "all second coordinates]; pair i's results go back to columns 2i and 2i + 1")
    if close(got, _rope_ref(x, positions, sign=-1.0)):
        raise ExerciseError("the rotation goes the wrong way: (a, b) -> (a cos - b sin, a sin + b cos)")
    if close(got, _rope_ref(x, positions, pair_exponent=1.0)):
        raise ExerciseError("the frequencies are off: theta_i = 10000^(-2i/d), you used 10000^(-i/d)")
    if close(got, _rope_ref(x, torch.arange(6))):
        raise ExerciseError("you rotated by 0, 1, 2, ... instead of the given positions: use `positions`")
    if not close(got.norm(dim=-1), x.norm(dim=-1)):
        raise ExerciseError("the lengths of the vectors changed, so this is not a rotation: each output pair must "
                            "be (a cos - b sin, a sin + b cos) with the same angle in cos and sin")
    if not close(got, expected):
        worst = (got - expected).abs().max().item()
        raise ExerciseError(f"a rotation, but not RoPE's: values differ by up to {worst:.3g}; check which angle "
                            "goes with which pair")
    return passed("interleaved RoPE: pair (x[2i], x[2i + 1]) rotated by position * 10000^(-2i/d), as in Meta's code")


# --------------------------------------------------------------------------------------
# 3. ALiBi slopes
# --------------------------------------------------------------------------------------

def check_alibi_slopes(fn) -> None:
    """``fn(n_heads)`` must return ALiBi's (n_heads,) slopes, for any head count."""
    _refuse_package(fn, ("alibi_slopes", "alibi_bias"), "the slopes")
    try:
        got8 = attempt(fn, 8)
    except NotAttempted:
        return not_attempted("alibi_slopes_from_scratch")
    got8 = require_tensor("alibi_slopes_from_scratch(8)", torch.as_tensor(got8, dtype=torch.float32), (8,))
    expected8 = alibi_slopes(8)
    if close(got8, expected8.flip(0)):
        raise ExerciseError("the slopes are in reverse order: head 0 gets the steepest slope 1/2, head 7 gets 1/256")
    if close(got8, torch.tensor([2.0 ** (-8 * h / 8) for h in range(8)])):
        raise ExerciseError("off by one: for 8 heads the slopes are 1/2, 1/4, ..., 1/256 (2^(-8(h+1)/n) for heads "
                            "h = 0 .. 7), not 1, 1/2, ..., 1/128")
    if not close(got8, expected8):
        raise ExerciseError(f"for 8 heads expected {[round(v, 5) for v in expected8.tolist()]}, "
                            f"got {[round(v, 5) for v in got8.tolist()]}")
    for n in (1, 2, 16, 6, 12, 20):
        got = require_tensor(f"alibi_slopes_from_scratch({n})", torch.as_tensor(attempt(fn, n), dtype=torch.float32),
                             (n,))
        expected = alibi_slopes(n)
        if close(got, expected):
            continue
        geometric = torch.tensor([2.0 ** (-8 * h / n) for h in range(1, n + 1)])
        if close(got, geometric):
            raise ExerciseError(f"for n_heads = {n} (not a power of two) the paper does not use 2^(-8(h+1)/n): "
                                "take the slopes of the largest power of two c below n, then every other slope of 2c")
        c = 2 ** (n.bit_length() - 1)
        first_of_2c = torch.tensor([2.0 ** (-8 * h / c) for h in range(1, c + 1)]
                                   + [2.0 ** (-8 * h / (2 * c)) for h in range(1, n - c + 1)])
        if close(got, first_of_2c):
            raise ExerciseError(f"for n_heads = {n} the extra slopes are every other slope of 2c = {2 * c} "
                                "([0::2]), not its first ones")
        raise ExerciseError(f"for n_heads = {n} expected {[round(v, 5) for v in expected.tolist()]}, "
                            f"got {[round(v, 5) for v in got.tolist()]}")
    return passed("ALiBi slopes for powers of two and for other head counts")


# --------------------------------------------------------------------------------------
# 4. half-split -> interleaved projection rows
# --------------------------------------------------------------------------------------

def check_to_interleaved(fn) -> None:
    """``fn(weight, n_heads)`` must reorder the rows of a half-split q/k projection back to interleaved pairing."""
    gen = torch.Generator().manual_seed(6)
    n_heads, head_dim, d_in = 3, 8, 10
    weight = torch.randn(n_heads * head_dim, d_in, generator=gen)
    _refuse_package(fn, ("permute_qk_rows", "half_to_interleaved_permutation"), "the reordering")
    try:
        got = attempt(fn, weight.clone(), n_heads)
    except NotAttempted:
        return not_attempted("to_interleaved")
    got = require_tensor("to_interleaved(weight, n_heads)", got, weight.shape)
    expected = permute_qk_rows(weight, n_heads, to="interleaved")
    if close(got, weight):
        raise ExerciseError("the weight is unchanged: the rows of each head must be reordered")
    if close(got, permute_qk_rows(weight, n_heads, to="half")):
        raise ExerciseError("you applied p = (0, 2, 4, ..., 1, 3, 5, ...) again, the Meta -> Hugging Face direction; "
                            "p is not its own inverse: going back needs the inverse permutation (argsort of p)")
    head_rows = weight.view(n_heads, head_dim, d_in)
    if close(got, head_rows.flip(1).reshape(weight.shape)):
        raise ExerciseError("the rows of each head are reversed; the inverse of p puts row i of the first half "
                            "at 2i and row i of the second half at 2i + 1")
    whole = weight[interleaved_to_half_permutation(n_heads * head_dim).argsort()]
    if close(got, whole):
        raise ExerciseError("you permuted all n_heads * head_dim rows as one block; the pairs live inside each "
                            "head: reshape to (n_heads, head_dim, d_in) and permute the head_dim axis")
    if close(got, weight[:, interleaved_to_half_permutation(d_in).argsort()]):
        raise ExerciseError("you permuted columns; the output coordinates of a projection are its rows")
    if not close(got, expected):
        raise ExerciseError("rows are reordered within each head, but not by the inverse of "
                            "(0, 2, 4, ..., 1, 3, 5, ...)")
    if not close(permute_qk_rows(got, n_heads, to="half"), weight):
        raise ExerciseError("converting your result back to half-split does not give the weight you started from")
    return passed("rows reordered within each head by the inverse permutation; the model runs with Meta's "
                  "interleaved RoPE again")


# --------------------------------------------------------------------------------------
# 5. RoPE in the previous-token experiment
# --------------------------------------------------------------------------------------

V_SIZE, D_MODEL, TRAIN_LEN, TEST_LEN = 16, 16, 16, 48   # the notebook's experiment


def _train_previous_token(make_model, seed: int) -> torch.nn.Module:
    """The notebook's recipe: 80 Adam steps (lr 5e-2) on 16 random sequences of TRAIN_LEN tokens, in float64."""
    torch.manual_seed(seed)
    model = make_model().double()
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(80):
        ids = torch.randint(0, V_SIZE, (16, TRAIN_LEN), generator=gen)
        loss = F.cross_entropy(model(ids)[:, 1:].reshape(-1, V_SIZE), ids[:, :-1].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _accuracy_by_position(model: torch.nn.Module, length: int) -> torch.Tensor:
    """(length - 1,) share of 256 random test sequences whose token t - 1 the model names at position t."""
    ids = torch.randint(0, V_SIZE, (256, length), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        predicted = model(ids)[:, 1:].argmax(-1)
    return (predicted == ids[:, :-1]).double().mean(0)


def _order_blind_floor(length: int) -> torch.Tensor:
    """(length - 1,) best accuracy of a guess that sees tokens 0 .. t - 1 as a bag: E[max_a count_a / t]."""
    ids = torch.randint(0, V_SIZE, (256, length), generator=torch.Generator().manual_seed(2))
    counts = F.one_hot(ids[:, :-1], V_SIZE).double().cumsum(1)
    return (counts.max(-1).values / torch.arange(1, length)).mean(0)


def check_previous_token_rope(cls) -> None:
    """``cls()`` must build the previous-token model with RoPE in its attention and no position table.

    The checker trains it with the notebook's recipe on 3 seeds and asks, on every seed, for more than 90 in 100
    right at the trained positions 1-15 and more than 30 in 100 at the positions 16-47 never trained (a learned
    table stays below the order-blind floor there, the accuracy of naming the most frequent earlier token).
    """
    try:
        model = attempt(cls)
    except NotAttempted:
        return not_attempted("PreviousTokenRoPE")
    if not isinstance(model, torch.nn.Module):
        raise ExerciseError(f"PreviousTokenRoPE() should be a torch.nn.Module, got {type(model).__name__}")
    logits = model.double()(torch.zeros(2, TEST_LEN, dtype=torch.long))
    require_tensor(f"the logits for ids of shape (2, {TEST_LEN})", logits, (2, TEST_LEN, V_SIZE))
    for seed in (0, 1, 2):
        accuracy = _accuracy_by_position(_train_previous_token(cls, seed), TEST_LEN)
        inside, outside = accuracy[: TRAIN_LEN - 1].mean().item(), accuracy[TRAIN_LEN - 1:].mean().item()
        if inside < 0.9:
            raise ExerciseError(f"seed {seed}: only {inside:.0%} right at the trained positions 1-15, so the model "
                                "cannot tell which key is one step back; the attention must rotate q and k by their "
                                "positions: MultiHeadAttention(..., rope=RotaryEmbedding(D))")
        if outside < 0.3:
            raise ExerciseError(f"seed {seed}: {inside:.0%} right at the trained positions but {outside:.0%} at 16-47, "
                                "no better than absolute positions: does the model still add a position vector to "
                                "the tokens, or rotate the token embeddings instead of q and k? With RoPE inside the "
                                "attention only the offset between query and key reaches the scores")
    floor = _order_blind_floor(TEST_LEN)[TRAIN_LEN - 1:].mean().item()
    return passed("with RoPE, on each of 3 seeds: more than 90% right at positions 1-15 and more than 30% at the "
                  f"never-trained positions 16-47, where the best guess that ignores order reaches {floor:.0%} "
                  "(the learned table falls below it)")
