"""Notebook 05's checkers: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

import selfattn_lite as sal
from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb05 as check
from selfattn_lite.positions import RotaryEmbedding, alibi_slopes, permute_qk_rows


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# --------------------------------------------------------------------------------------
# 1. the sinusoidal offset map
# --------------------------------------------------------------------------------------

def offset_map(k, d, *, sign=1.0, exponent=2.0, half_split=False, scale=1.0, loop=False, use_d=None):
    d_freq = use_d or d
    omega = 10000.0 ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d_freq)
    c, s = (sign * k * omega).cos() * scale, (sign * k * omega).sin()
    if loop:                                              # a learner's loop, float32: right too
        M = torch.zeros(d, d)
        for i in range(d // 2):
            M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c[i], s[i]], [-s[i], c[i]]])
        return M
    if half_split:
        M = torch.zeros(d, d, dtype=torch.float64)
        i = torch.arange(d // 2)
        M[i, i], M[i, i + d // 2], M[i + d // 2, i], M[i + d // 2, i + d // 2] = c, s, -s, c
        return M
    return torch.block_diag(*torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2))


RIGHT["offset_map"] = check.check_offset_map, offset_map
RIGHT["offset_map_loop"] = check.check_offset_map, lambda k, d: offset_map(k, d, loop=True)


@pytest.mark.parametrize("wrong, match", [
    (lambda k, d: torch.eye(d), "identity"),
    (lambda k, d: offset_map(k, d, sign=-1.0), r"gives PE\[m - 3\]"),
    (lambda k, d: offset_map(k, d).T, r"the transpose of M_3"),
    (lambda k, d: offset_map(k, d, exponent=1.0), r"you used 10000\^\(-i/d_model\)"),
    (lambda k, d: offset_map(k, d, half_split=True), "half-split pairs"),
    (lambda k, d: offset_map(k, d, scale=1.1), "not a rotation"),
    (lambda k, d: offset_map(3, d), r"M_1 @ PE\[m\] differs from PE\[m \+ 1\]"),
    (lambda k, d: offset_map(k, d, use_d=16), r"offset_map\(2, 8\)"),
    (lambda k, d: offset_map(k, d)[:, :8], r"should have shape \(16, 16\), got \(16, 8\)"),
])
def test_offset_map_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_offset_map(wrong)


# --------------------------------------------------------------------------------------
# 2. interleaved RoPE by hand
# --------------------------------------------------------------------------------------

def rope(x, positions, *, half_split=False, concat_back=False, sign=1.0, exponent=2.0, ignore_positions=False,
         scale=1.0, swap_pairs=False):
    d = x.shape[-1]
    theta = 10000.0 ** (-exponent * torch.arange(d // 2, dtype=x.dtype) / d)
    pos = torch.arange(x.shape[-2]) if ignore_positions else positions
    angles = sign * pos[:, None].to(x.dtype) * theta                    # (T, d/2)
    if swap_pairs:
        angles = angles.flip(-1)
    cos, sin = angles.cos() * scale, angles.sin() * scale
    if half_split:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    if concat_back:
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def complex_rope(x, positions):
    """Meta's formulation (view_as_complex times e^(i m theta)): right too."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    angles = positions[:, None] * theta                                 # (T, d/2)
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def calls_the_package(x, positions):
    return RotaryEmbedding(x.shape[-1], interleaved=True)(x, positions)


RIGHT["rope_interleaved"] = check.check_rope_interleaved, rope
RIGHT["rope_interleaved_complex"] = check.check_rope_interleaved, complex_rope


@pytest.mark.parametrize("wrong, match", [
    (lambda x, p: x, "unrotated"),
    (lambda x, p: rope(x, p, half_split=True), "half-split layout"),
    (lambda x, p: rope(x, p, concat_back=True), "put the results back"),
    (lambda x, p: rope(x, p, sign=-1.0), "wrong way"),
    (lambda x, p: rope(x, p, exponent=1.0), r"you used 10000\^\(-i/d\)"),
    (lambda x, p: rope(x, p, ignore_positions=True), "instead of the given positions"),
    (lambda x, p: rope(x, p, scale=1.1), "lengths of the vectors changed"),
    (lambda x, p: rope(x, p, swap_pairs=True), "not RoPE's"),
    (lambda x, p: rope(x, p)[..., :4], r"should have shape \(2, 3, 6, 8\)"),
    (calls_the_package, "calls the package's RotaryEmbedding"),
])
def test_rope_interleaved_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_rope_interleaved(wrong)


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
    (lambda n: alibi_slopes(n), "calls the package's alibi_slopes"),
])
def test_alibi_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_alibi_slopes(wrong)


# --------------------------------------------------------------------------------------
# 4. half-split -> interleaved projection rows
# --------------------------------------------------------------------------------------

def perm_rows(weight, n_heads, *, inverse=True):
    head_dim = weight.shape[0] // n_heads
    perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    perm = perm.argsort() if inverse else perm
    return weight.view(n_heads, head_dim, -1)[:, perm].reshape(weight.shape)


def script_to_interleaved(w, h):
    """The inverse of the conversion script's formula: right too."""
    return w.view(h, 2, w.shape[0] // h // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


RIGHT["to_interleaved"] = check.check_to_interleaved, perm_rows
RIGHT["to_interleaved_script"] = check.check_to_interleaved, script_to_interleaved


@pytest.mark.parametrize("wrong, match", [
    (lambda w, h: w.clone(), "unchanged"),
    (lambda w, h: perm_rows(w, h, inverse=False), "p is not its own inverse"),
    (lambda w, h: w.view(h, w.shape[0] // h, -1).flip(1).reshape(w.shape), "reversed"),
    (lambda w, h: perm_rows(w, 1), "as one block"),
    (lambda w, h: perm_rows(w.T.contiguous(), 1).T, "you permuted columns"),
    (lambda w, h: w.flip(0), "not by the inverse"),
    (lambda w, h: w[:8], r"should have shape \(24, 10\)"),
    (lambda w, h: permute_qk_rows(w, h, to="interleaved"), "calls the package's permute_qk_rows"),
])
def test_to_interleaved_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_to_interleaved(wrong)


# --------------------------------------------------------------------------------------
# 5. RoPE in the previous-token experiment
# --------------------------------------------------------------------------------------

V, D = check.V_SIZE, check.D_MODEL


class WithRoPE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.attn = sal.MultiHeadAttention(D, n_heads=1, is_causal=True, rope=RotaryEmbedding(D))
        self.out = torch.nn.Linear(D, V)

    def forward(self, ids):
        return self.out(self.attn(self.tok(ids))[0])


class StillLearnedTable(WithRoPE):
    """RoPE, and the learned table left in: the untrained rows ruin the positions past 16."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(64, D)

    def forward(self, ids):
        return self.out(self.attn(self.tok(ids) + self.pos(torch.arange(ids.shape[1])))[0])


class NoPositions(WithRoPE):
    """rope= forgotten: attention with a causal mask only."""

    def __init__(self):
        super().__init__()
        self.attn = sal.MultiHeadAttention(D, n_heads=1, is_causal=True)


class RotatesTheEmbeddings(NoPositions):
    """The tokens rotated before the projections: the scores are not relative."""

    def __init__(self):
        super().__init__()
        self.rope = RotaryEmbedding(D)

    def forward(self, ids):
        return self.out(self.attn(self.rope(self.tok(ids), torch.arange(ids.shape[1])))[0])


class WrongShape(WithRoPE):
    def forward(self, ids):
        return super().forward(ids)[..., :8]


RIGHT["previous_token_rope"] = check.check_previous_token_rope, WithRoPE


@pytest.mark.parametrize("wrong, match", [
    (StillLearnedTable, "still add a position vector"),
    (RotatesTheEmbeddings, "rotate the token embeddings"),
    (NoPositions, "cannot tell which key is one step back"),
    (WrongShape, r"should have shape \(2, 48, 16\)"),
    (lambda: torch.zeros(3), "should be a torch.nn.Module"),
])
def test_previous_token_rope_wrong(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.check_previous_token_rope(wrong)


def test_order_blind_floor_is_the_most_frequent_earlier_token():
    """The floor of exercise 5's message: the share of the earlier tokens equal to the most frequent one."""
    floor = check._order_blind_floor(8)
    ids = torch.randint(0, 16, (256, 8), generator=torch.Generator().manual_seed(2))
    for t in range(1, 8):
        expected = sum(max(row[:t].tolist().count(a) for a in range(16)) / t for row in ids) / 256
        assert abs(floor[t - 1].item() - expected) < 1e-12
    assert floor[0] == 1.0 and (floor[1:] < 1).all()


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
