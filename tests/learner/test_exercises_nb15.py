"""Checkers of notebook 15: right answers pass, planted mistakes are named, stubs are 'not attempted'."""

import os

import pytest
import torch
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


# ----------------------------------------------------------------------------- the online update under TF32 (a GPU's float32 tl.dot)

def tf32(x):
    """x rounded as an sm_80+ tensor core reads a float32 factor: 10 mantissa bits, to nearest (ties away)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_stream(s, v):
    """The right update with its dot in TF32: what a correct answer computes on an A100, an RTX 4090 or an H100."""
    m = torch.full((s.shape[0],), float("-inf"))
    l, acc = torch.zeros(s.shape[0]), torch.zeros(s.shape[0], v.shape[1])
    for k0 in range(0, s.shape[1], check.BLOCK_N):
        blk, v_blk = s[:, k0:k0 + check.BLOCK_N], v[k0:k0 + check.BLOCK_N]
        m_new = torch.maximum(m, blk.amax(1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(blk - m_new[:, None])
        l = l * alpha + p.sum(1)
        acc = acc * alpha[:, None] + (tf32(p).double() @ tf32(v_blk).double()).float()
        m = m_new
    return acc / l[:, None]


def checker_inputs():
    gen = torch.Generator().manual_seed(15)                       # the checker's own draw
    s = torch.randn(check.BLOCK_M, 40, generator=gen)
    s[:, 20:] += 3.0
    return s, torch.randn(40, check.D, generator=gen)


def test_tf32_error_is_inside_its_bound_and_outside_float32s():
    """A right update on a TF32 GPU misses softmax(s) @ v by more than float32's 1e-4 (the old checker rejected
    it) and by less than the bound from TF32's 10-bit mantissa."""
    s, v = checker_inputs()
    want = torch.softmax(s.double(), dim=-1) @ v.double()
    err = (tf32_stream(s, v).double() - want).abs()
    assert err.max() > check.FP32_ATOL
    assert (err <= check.update_tolerance(s, v, "tf32")).all()
    assert not (err <= check.update_tolerance(s, v, "ieee")).all()
    assert check.update_tolerance(s, v, "tf32").max() < 2e-3          # still far below any planted mistake's error
    for kwargs in (dict(rescale_acc=False), dict(rescale_l=False)):
        wrong = check._stream(s, v, **kwargs).double()
        assert not ((wrong - want).abs() <= check.update_tolerance(s, v, "tf32")).all()


def test_dot_precision_here():
    assert check.dot_precision() == ("ieee" if ta.interpreting() or not torch.cuda.is_available() else
                                     ta.precision_for(ta.device_limits(), torch.float32))


@pytest.mark.parametrize("fn, message", [
    (good_update, "Correct"),
    (no_acc_rescale, "acc is not rescaled"),
    (no_l_rescale, "l is not rescaled"),
])
def test_online_update_on_a_tf32_gpu(monkeypatch, capsys, fn, message):
    """The checker's GPU path, run on a CPU: tl.dot in TF32 (emulated for the right answer and its planted
    mistakes), judged against TF32's bound. A right answer passes and says which products it was held to."""
    monkeypatch.setattr(check, "dot_precision", lambda: "tf32")
    monkeypatch.setattr(check, "_is_stub", lambda fn: False)
    monkeypatch.setattr(ta, "available", lambda: True)
    mistake = {no_acc_rescale: dict(rescale_acc=False), no_l_rescale: dict(rescale_l=False)}.get(fn)

    def run(_, s, v):
        if mistake is None:
            return tf32_stream(s, v)
        p_v = check._stream(s, v, **mistake)
        return p_v + (tf32_stream(s, v) - check._stream(s, v))          # the same TF32 rounding on top
    monkeypatch.setattr(check, "_run_update", run)
    if message == "Correct":
        check.check_online_update(fn)
        assert "TF32 products" in capsys.readouterr().out
    else:
        with pytest.raises(ExerciseError, match=message):
            check.check_online_update(fn)
