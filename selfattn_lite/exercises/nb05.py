"""Checkers for notebook 05: sinusoidal encodings, RoPE by hand, ALiBi slopes, and converting
q/k projection rows from interleaved to half-split pairing."""

from __future__ import annotations

import torch

from ..positions import (
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    permute_qk_rows,
    sinusoidal_encoding,
)
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_sinusoidal", "check_rope", "check_alibi_slopes", "check_to_half_split"]


def _pe(n: int, d: int, *, pair_exponent: float = 2.0, swap: bool = False, concat: bool = False,
        multiply: bool = False) -> torch.Tensor:
    """Sinusoidal encodings with one of the usual mistakes switched on (the default is right)."""
    m = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(d // 2, dtype=torch.float64)[None, :]
    freq = 10000.0 ** (-pair_exponent * i / d)
    angles = m / freq if multiply else m * freq                            # (n, d/2)
    first, second = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    if concat:
        return torch.cat((first, second), dim=-1).float()
    return torch.stack((first, second), dim=-1).flatten(-2).float()


def check_sinusoidal(fn) -> None:
    """``fn(n_positions, d_model)`` must return the (n_positions, d_model) sinusoidal encodings."""
    n, d = 12, 16
    try:
        got = attempt(fn, n, d)
    except NotAttempted:
        return not_attempted("sinusoidal")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (d, n):
        raise ExerciseError(f"shape {tuple(got.shape)} is transposed: one row per position, (n_positions, d_model)")
    got = require_tensor("sinusoidal(12, 16)", got, (n, d))
    expected = sinusoidal_encoding(n, d)
    if close(got, _pe(n, d, swap=True)):
        raise ExerciseError("sin and cos are swapped: even columns 2i hold sin, odd columns 2i+1 hold cos")
    if close(got, _pe(n, d, concat=True)):
        raise ExerciseError("you put all the sines first, then all the cosines; the paper interleaves them: "
                            "column 2i = sin, column 2i+1 = cos of the same angle")
    if close(got, _pe(n, d, pair_exponent=1.0)):
        raise ExerciseError("the frequencies fall too slowly: pair i uses 10000^(2i/d_model), "
                            "you used 10000^(i/d_model)")
    if close(got, _pe(n, d, multiply=True), atol=1e-2):   # huge angles: float32 sin is only roughly right
        raise ExerciseError("the angle is position / 10000^(2i/d_model); you multiplied by 10000^(2i/d_model)")
    if not close(got[0], expected[0]):
        raise ExerciseError(f"position 0 should be [0, 1, 0, 1, ...] (sin 0 = 0, cos 0 = 1), "
                            f"got {[round(v, 3) for v in got[0].tolist()[:4]]}...")
    if not close(got, expected):
        worst = (got - expected).abs().max().item()
        raise ExerciseError(f"values differ from PE[m, 2i] = sin(m / 10000^(2i/d)), PE[m, 2i+1] = cos(...) "
                            f"by up to {worst:.3g}")
    return passed("sinusoidal encodings, sin and cos interleaved, frequencies 10000^(-2i/d)")


def _rope_ref(x: torch.Tensor, positions: torch.Tensor, *, interleaved: bool = False, sign: float = 1.0,
              pair_exponent: float = 2.0) -> torch.Tensor:
    """Half-split RoPE in float64, with one of the usual mistakes switched on."""
    d = x.shape[-1]
    theta = 10000.0 ** (-pair_exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    angles = sign * positions.double()[:, None] * theta                   # (T, d/2)
    return apply_rotary(x.double(), angles.cos(), angles.sin(), interleaved=interleaved)


def check_rope(fn) -> None:
    """``fn(x, positions)`` must rotate x (..., T, d) by RoPE, half-split pairs, base 10000."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 8, generator=gen, dtype=torch.float64)       # (B, h, T, d)
    positions = torch.tensor([3, 4, 5, 6, 7, 40])
    try:
        got = attempt(fn, x.clone(), positions.clone())
    except NotAttempted:
        return not_attempted("rope")
    got = require_tensor("rope(x, positions)", got, x.shape).double()
    expected = RotaryEmbedding(8)(x, positions)
    if close(got, x):
        raise ExerciseError("x came back unrotated: rotate each pair by the angle position * theta_i")
    if close(got, _rope_ref(x, positions, interleaved=True)):
        raise ExerciseError("you paired neighbours (2i, 2i+1), the interleaved convention; this exercise uses the "
                            "half-split one: pair i is (x[i], x[i + d/2])")
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
    return passed("half-split RoPE: pair (x[i], x[i + d/2]) rotated by position * 10000^(-2i/d)")


def check_alibi_slopes(fn) -> None:
    """``fn(n_heads)`` must return ALiBi's (n_heads,) slopes, for any head count."""
    try:
        got8 = attempt(fn, 8)
    except NotAttempted:
        return not_attempted("alibi_slopes_from_scratch")
    got8 = require_tensor("alibi_slopes_from_scratch(8)", torch.as_tensor(got8, dtype=torch.float32), (8,))
    expected8 = alibi_slopes(8)
    if close(got8, expected8.flip(0)):
        raise ExerciseError("the slopes are in reverse order: head 1 gets the steepest slope 1/2, head 8 gets 1/256")
    if close(got8, torch.tensor([2.0 ** (-8 * h / 8) for h in range(8)])):
        raise ExerciseError("off by one: for 8 heads the slopes are 1/2, 1/4, ..., 1/256 (h = 1 .. 8), "
                            "not 1, 1/2, ..., 1/128")
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
            raise ExerciseError(f"for n_heads = {n} (not a power of two) the paper does not use 2^(-8h/n): take the "
                                "slopes of the largest power of two c below n, then every other slope of 2c")
        c = 2 ** (n.bit_length() - 1)
        first_of_2c = torch.tensor([2.0 ** (-8 * h / c) for h in range(1, c + 1)]
                                   + [2.0 ** (-8 * h / (2 * c)) for h in range(1, n - c + 1)])
        if close(got, first_of_2c):
            raise ExerciseError(f"for n_heads = {n} the extra slopes are every other slope of 2c = {2 * c} "
                                "([0::2]), not its first ones")
        raise ExerciseError(f"for n_heads = {n} expected {[round(v, 5) for v in expected.tolist()]}, "
                            f"got {[round(v, 5) for v in got.tolist()]}")
    return passed("ALiBi slopes for powers of two and for other head counts")


def check_to_half_split(fn) -> None:
    """``fn(weight, n_heads)`` must reorder the rows of an interleaved q/k projection to half-split."""
    gen = torch.Generator().manual_seed(6)
    n_heads, head_dim, d_in = 3, 8, 10
    weight = torch.randn(n_heads * head_dim, d_in, generator=gen)
    try:
        got = attempt(fn, weight.clone(), n_heads)
    except NotAttempted:
        return not_attempted("to_half_split")
    got = require_tensor("to_half_split(weight, n_heads)", got, weight.shape)
    expected = permute_qk_rows(weight, n_heads, to="half")
    if close(got, weight):
        raise ExerciseError("the weight is unchanged: the rows of each head must be reordered")
    if close(got, permute_qk_rows(weight, n_heads, to="interleaved")):
        raise ExerciseError("that is the opposite direction (half-split -> interleaved): new row j of a head "
                            "takes old row perm[j] with perm = (0, 2, 4, ..., 1, 3, 5, ...)")
    whole = weight[interleaved_to_half_permutation(n_heads * head_dim)]
    if close(got, whole):
        raise ExerciseError("you permuted all n_heads * head_dim rows as one block; the pairs live inside each "
                            "head: reshape to (n_heads, head_dim, d_in) and permute the head_dim axis")
    if close(got, weight[:, half_to_interleaved_permutation(d_in)]) or \
            (d_in % 2 == 0 and close(got, weight[:, interleaved_to_half_permutation(d_in)])):
        raise ExerciseError("you permuted columns; the output coordinates of a projection are its rows")
    if not close(got, expected):
        raise ExerciseError("rows are reordered, but not as (0, 2, 4, ..., 1, 3, 5, ...) within each head")
    return passed("rows reordered within each head; a Meta checkpoint now runs with half-split RoPE")
