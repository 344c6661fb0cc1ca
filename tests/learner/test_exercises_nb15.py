"""Checkers of notebook 15: right answers pass, planted mistakes are named, stubs are 'not attempted'."""

import os

import pytest
from helpers import expect_correct, expect_not_attempted

from selfattn_lite import triton_attention as ta
from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb15 as check

if ta.available():
    import triton.language as tl
else:                                  # the kernels below are still defined (their annotations need a tl.constexpr)
    from types import SimpleNamespace

    tl = SimpleNamespace(constexpr=None)


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------------------- online update (inside a kernel)

def good_update(m_i, l_i, acc, s, v):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


def no_acc_rescale(m_i, l_i, acc, s, v):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc + tl.dot(p, v)


def no_l_rescale(m_i, l_i, acc, s, v):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


def flipped_alpha(m_i, l_i, acc, s, v):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_new - m_i)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


def no_max(m_i, l_i, acc, s, v):                      # right in exact arithmetic, overflows in float32
    p = tl.exp(s)
    return m_i, l_i + tl.sum(p, 1), acc + tl.dot(p, v)


def two_values(m_i, l_i, acc, s, v):
    return m_i, l_i


needs_triton = pytest.mark.skipif(not ta.available() and not os.environ.get("CI"), reason="Triton is not installed (Linux-only extra `triton`)")


@needs_triton
@pytest.mark.parametrize("fn, message", [
    (no_acc_rescale, "acc is not rescaled"),
    (no_l_rescale, "l is not rescaled"),
    (flipped_alpha, "inf or NaN"),
    (no_max, "subtract the running max"),
    (two_values, "three values"),
])
def test_online_update_mistakes_are_named(fn, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_online_update(fn)


# ----------------------------------------------------------------------------- causal loop bounds

def good_bounds(q0, block_m, block_n, S):
    return min((q0 + 1) // block_n, S // block_n) * block_n, min(S, q0 + block_m)


@pytest.mark.parametrize("fn, message", [
    (lambda q0, bm, bn, S: (good_bounds(q0, bm, bn, S)[0], S), "end = S"),
    (lambda q0, bm, bn, S: (good_bounds(q0, bm, bn, S)[0], min(S, q0)), "stops before"),
    (lambda q0, bm, bn, S: (q0, min(S, q0 + bm)), "multiple of block_n|needs the mask"),
    (lambda q0, bm, bn, S: ((min(S, q0 + bm) // bn) * bn, min(S, q0 + bm)), "needs the mask"),
    (lambda q0, bm, bn, S: (min(q0 // bn, S // bn) * bn, min(S, q0 + bm)), "masks whole blocks it need not"),
    (lambda q0, bm, bn, S: 0, "pair"),
])
def test_causal_bounds_mistakes_are_named(fn, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_causal_bounds(fn)


def test_online_update_says_when_triton_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(ta, "available", lambda: False)
    check.check_online_update(lambda m_i, l_i, acc, s, v: (m_i, l_i, acc))
    assert "Triton is not installed" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a kernel of your own

def good_copy(X, Y, n_rows, n_cols, stride_x, stride_y, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], x, mask=mask)


def off_by_one_copy(X, Y, n_rows, n_cols, stride_x, stride_y, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] <= n_rows) & (cols[None, :] <= n_cols)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], x, mask=mask)


def unmasked_copy(X, Y, n_rows, n_cols, stride_x, stride_y, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :])
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], x)


def wrong_stride_copy(X, Y, n_rows, n_cols, stride_x, stride_y, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(X + rows[:, None] * n_cols + cols[None, :], mask=mask)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], x, mask=mask)


def good_grid(n_rows, block_r):
    return ((n_rows + block_r - 1) // block_r,)


@pytest.mark.parametrize("grid, message", [
    (lambda n, b: (n // b,), "floor division drops the last"),
    (lambda n, b: n // b + 1, "tuple of ints"),
    (lambda n, b: (n // b + 1,), "ceil"),                       # right for 37 / 16, wrong for 64 / 16
    (lambda n, b: ((n + b - 1) // b, 1), "ceil"),
])
def test_copy_grid_mistakes_are_named(grid, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_copy_grid(grid)


@needs_triton
@pytest.mark.parametrize("kernel, message", [
    (off_by_one_copy, "one past the edge"),
    (unmasked_copy, "outside the 37 x 20 matrix"),
    (wrong_stride_copy, "read n_cols apart"),
])
def test_copy_kernel_mistakes_are_named(kernel, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_copy_kernel(kernel)


# ----------------------------------------------------------------------------- right answers and stubs

@pytest.mark.parametrize("checker, right", [
    pytest.param(check.check_online_update, good_update, marks=needs_triton, id="online_update"),
    pytest.param(check.check_causal_bounds, good_bounds, id="causal_bounds"),
    pytest.param(check.check_copy_grid, good_grid, id="copy_grid"),
    pytest.param(check.check_copy_kernel, good_copy, marks=needs_triton, id="copy_kernel"),
])
def test_right_answer_passes(checker, right, capsys):
    expect_correct(checker, right, capsys)


@pytest.mark.parametrize("checker", [check.check_online_update, check.check_causal_bounds, check.check_copy_grid,
                                     check.check_copy_kernel],
                         ids=["online_update", "causal_bounds", "copy_grid", "copy_kernel"])
def test_stub_is_not_attempted(checker, capsys):
    expect_not_attempted(checker, stub, capsys)
