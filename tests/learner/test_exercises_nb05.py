"""Notebook 05's checkers: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb05 as check


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# --------------------------------------------------------------------------------------
# 1. sinusoidal encodings
# --------------------------------------------------------------------------------------

def sinusoidal(n, d, *, exponent=2.0, swap=False, concat=False, multiply=False, transpose=False, shift=0.0):
    m = torch.arange(n, dtype=torch.float32)[:, None]
    i = torch.arange(d // 2, dtype=torch.float32)[None, :]
    div = 10000 ** (exponent * i / d)
    angles = (m * div if multiply else m / div) + shift
    a, b = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    pe = torch.cat([a, b], -1) if concat else torch.stack([a, b], -1).flatten(-2)
    return pe.T if transpose else pe


RIGHT["sinusoidal"] = check.check_sinusoidal, sinusoidal


@pytest.mark.parametrize("wrong, match", [
    (dict(swap=True), "sin and cos are swapped"),
    (dict(concat=True), "all the sines first"),
    (dict(exponent=1.0), r"you used 10000\^\(i/d_model\)"),
    (dict(multiply=True), "you multiplied"),
    (dict(transpose=True), "transposed"),
    (dict(shift=0.5), r"position 0 should be \[0, 1, 0, 1"),
])
def test_sinusoidal_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_sinusoidal(lambda n, d: sinusoidal(n, d, **wrong))


def test_sinusoidal_wrong_shape_and_small_error():
    with pytest.raises(ExerciseError, match=r"should have shape \(12, 16\), got \(12, 8\)"):
        check.check_sinusoidal(lambda n, d: sinusoidal(n, d)[:, :8])
    with pytest.raises(ExerciseError, match="by up to"):
        check.check_sinusoidal(lambda n, d: sinusoidal(n, d) + torch.linspace(0, 0.1, n)[:, None])


# --------------------------------------------------------------------------------------
# 2. RoPE by hand
# --------------------------------------------------------------------------------------

def rope(x, positions, *, interleaved=False, sign=1.0, exponent=2.0, ignore_positions=False, scale=1.0,
         swap_pairs=False):
    d = x.shape[-1]
    theta = 10000.0 ** (-exponent * torch.arange(d // 2, dtype=x.dtype) / d)
    pos = torch.arange(x.shape[-2]) if ignore_positions else positions
    angles = sign * pos[:, None].to(x.dtype) * theta                    # (T, d/2)
    if swap_pairs:
        angles = angles.flip(-1)
    cos, sin = angles.cos() * scale, angles.sin() * scale
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


RIGHT["rope"] = check.check_rope, rope


@pytest.mark.parametrize("wrong, match", [
    (lambda x, p: x, "unrotated"),
    (lambda x, p: rope(x, p, interleaved=True), "interleaved convention"),
    (lambda x, p: rope(x, p, sign=-1.0), "wrong way"),
    (lambda x, p: rope(x, p, exponent=1.0), r"you used 10000\^\(-i/d\)"),
    (lambda x, p: rope(x, p, ignore_positions=True), "instead of the given positions"),
    (lambda x, p: rope(x, p, scale=1.1), "lengths of the vectors changed"),
    (lambda x, p: rope(x, p, swap_pairs=True), "not RoPE's"),
    (lambda x, p: rope(x, p)[..., :4], r"should have shape \(2, 3, 6, 8\)"),
])
def test_rope_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_rope(wrong)


# --------------------------------------------------------------------------------------
# 3. ALiBi slopes
# --------------------------------------------------------------------------------------

def slopes(n, *, naive=False, first_of_2c=False):
    def power_of_two(k):
        return [2 ** (-8 * h / k) for h in range(1, k + 1)]

    if naive or math.log2(n).is_integer():
        return power_of_two(n)
    c = 2 ** math.floor(math.log2(n))
    extra = power_of_two(2 * c)[: n - c] if first_of_2c else power_of_two(2 * c)[0::2][: n - c]
    return power_of_two(c) + extra


RIGHT["alibi_slopes"] = check.check_alibi_slopes, slopes
RIGHT["alibi_slopes_tensor"] = check.check_alibi_slopes, lambda n: torch.tensor(slopes(n))


@pytest.mark.parametrize("wrong, match", [
    (lambda n: slopes(n)[::-1], "reverse order"),
    (lambda n: [2 ** (-8 * h / n) for h in range(n)], "off by one"),
    (lambda n: slopes(n, naive=True), r"n_heads = 6 \(not a power of two\)"),
    (lambda n: slopes(n, first_of_2c=True), r"every other slope of 2c = 8 \(\[0::2\]\)"),
    (lambda n: [0.5] * n, "for 8 heads expected"),
    (lambda n: slopes(n) if n in (8, 6) else [1.0] * n, "for n_heads = 1 expected"),
    (lambda n: slopes(n)[:-1], r"should have shape \(8,\), got \(7,\)"),
])
def test_alibi_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_alibi_slopes(wrong)


# --------------------------------------------------------------------------------------
# 4. interleaved -> half-split projection rows
# --------------------------------------------------------------------------------------

def to_half(weight, n_heads):
    head_dim = weight.shape[0] // n_heads
    perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return weight.view(n_heads, head_dim, -1)[:, perm].reshape(weight.shape)


def to_interleaved(weight, n_heads):
    head_dim = weight.shape[0] // n_heads
    perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)]).argsort()
    return weight.view(n_heads, head_dim, -1)[:, perm].reshape(weight.shape)


def script_to_half(w, h):
    """The conversion script's formula: right too."""
    return w.view(h, w.shape[0] // h // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


RIGHT["to_half_split"] = check.check_to_half_split, to_half
RIGHT["to_half_split_script"] = check.check_to_half_split, script_to_half


@pytest.mark.parametrize("wrong, match", [
    (lambda w, h: w.clone(), "unchanged"),
    (to_interleaved, "opposite direction"),
    (lambda w, h: to_half(w, 1), "as one block"),
    (lambda w, h: to_half(w.T.contiguous(), 1).T, "you permuted columns"),
    (lambda w, h: w.flip(0), r"not as \(0, 2, 4"),
    (lambda w, h: w[:8], r"should have shape \(24, 10\)"),
])
def test_to_half_split_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_to_half_split(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
