"""Checkers of notebook 15: right answers pass, planted mistakes are named, stubs are 'not attempted'."""

import os
import re

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


# ----------------------------------------------------------------------------- sliding-window update (inside a kernel)

def good_update(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def no_guard(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def natural(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def causal_only(m_i, l_i, acc, s, v, rows, keys, window):
    keep = keys[None, :] <= rows[:, None]
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def left_ge(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] >= rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def strict(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] < rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def no_acc(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc + tl.dot(p, v)

def no_max(m_i, l_i, acc, s, v, rows, keys, window):
    keep = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - window)
    p = tl.exp2(tl.where(keep, s, float("-inf")))
    return m_i, l_i + tl.sum(p, 1), acc + tl.dot(p, v)

def unmasked(m_i, l_i, acc, s, v, rows, keys, window):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)

def two_values(m_i, l_i, acc, s, v, rows, keys, window):
    return m_i, l_i


# A message names the mistake; it does not hand over the formula that fixes it.
ANSWER = re.compile(r"floor\(|ceil\(|min\(S|max\(0|m_safe|tl\.where\(|alpha\[|rows\[:, None\] \*|exp2\(s -")


needs_triton = pytest.mark.skipif(not ta.available() and not os.environ.get("CI"), reason="Triton is not installed (Linux-only extra `triton`)")


@needs_triton
@pytest.mark.parametrize("fn, message", [
    (no_guard, "NaN in exactly the rows that see no key of the first block"),
    (natural, "take tl.exp2"),
    (causal_only, "left edge is missing"),
    (left_ge, "off by one at the window's left edge"),
    (strict, "must see itself"),
    (no_acc, "acc is not rescaled"),
    (no_max, "subtract the running max"),
    (unmasked, "no mask"),
    (two_values, "three values"),
])
def test_window_update_mistakes_are_named(fn, message):
    with pytest.raises(ExerciseError, match=message) as err:
        check.check_window_update(fn)
    assert not ANSWER.search(str(err.value)), f"the message gives the answer away: {err.value}"


def test_window_update_inputs_have_rows_that_see_nothing_of_a_block():
    """The checker's draw is the hard case: some rows see no key of the first block (m = -inf there after it),
    every row none of the last, and every row sees at least one key (l > 0)."""
    keep = check.window_keep()
    assert (~keep[:, :check.BLOCK_N].any(1)).any() and keep[:, :check.BLOCK_N].any(1).any()
    assert not keep[:, -check.BLOCK_N:].any()
    assert keep.any(1).all() and (keep.sum(1) <= check.WINDOW).all()


# ----------------------------------------------------------------------------- sliding-window loop bounds

def good_bounds(q0, block_m, block_n, S, window):
    start = max(0, q0 - window + 1) // block_n * block_n
    end = min(S, q0 + block_m)
    lo = -(-max(0, q0 + block_m - window) // block_n) * block_n
    hi = min((q0 + 1) // block_n, S // block_n) * block_n
    if hi <= lo:
        lo = hi = start
    return start, lo, hi, end


def with_bound(index, value):
    """good_bounds with one of its four offsets replaced by value(q0, bm, bn, S, w, right answer)."""
    def fn(q0, bm, bn, S, w):
        got = list(good_bounds(q0, bm, bn, S, w))
        got[index] = value(q0, bm, bn, S, w, got)
        return tuple(got)
    return fn


def ceil_to(x, b):
    return -(-x // b) * b


def left_edge_off_by_one(q0, block_m, block_n, S, window):
    """unmasked_start from the last query's window start minus one: a block the last query misses by one key."""
    start, _, _, end = good_bounds(q0, block_m, block_n, S, window)
    lo = ceil_to(max(0, q0 + block_m - window - 1), block_n)
    hi = min((q0 + 1) // block_n, S // block_n) * block_n
    if hi <= lo:
        lo = hi = start
    return start, lo, hi, end


def no_s_clamp(q0, block_m, block_n, S, window):
    """unmasked_end from the diagonal alone, without min(..., S // block_n): past S for query blocks at q0 >= S."""
    start, _, _, end = good_bounds(q0, block_m, block_n, S, window)
    lo = ceil_to(max(0, q0 + block_m - window), block_n)
    hi = (q0 + 1) // block_n * block_n
    if hi <= lo:
        lo = hi = start
    return start, lo, hi, end


def test_the_s_clamp_binds_only_on_query_blocks_past_the_last_key():
    """Without the clamp the bounds agree with the right ones on every block with q0 < S: only the L > S blocks
    tell them apart (the case (120, 75, 32, 16, 100) at q0 = 96 loads keys 75..95 unmasked)."""
    differ = [(L, S, q0) for L, S, bm, bn, w in check.BOUNDS_CASES for q0 in range(0, L, bm)
              if max(0, q0 - w + 1) < S and no_s_clamp(q0, bm, bn, S, w) != good_bounds(q0, bm, bn, S, w)]
    assert differ and all(q0 >= S for L, S, q0 in differ)
    assert no_s_clamp(96, 32, 16, 75, 100) == (0, 32, 96, 75)


@pytest.mark.parametrize("fn, message", [
    (no_s_clamp, "unmasked_end = .* runs past end = .* inside S"),
    (with_bound(0, lambda q0, bm, bn, S, w, g: 0), "no query of the block sees .* before the window"),
    (with_bound(0, lambda q0, bm, bn, S, w, g: max(0, q0 - w) // bn * bn), "no query of the block sees"),
    (with_bound(0, lambda q0, bm, bn, S, w, g: min(ceil_to(max(0, q0 - w + 1), bn), g[1])), "skips keys query"),
    (with_bound(3, lambda q0, bm, bn, S, w, g: S), "after the block's last query"),
    (with_bound(3, lambda q0, bm, bn, S, w, g: q0 + bm), "past S"),
    (with_bound(3, lambda q0, bm, bn, S, w, g: max(g[2], min(S, q0 + 1))), "stops before key"),
    (with_bound(1, lambda q0, bm, bn, S, w, g: g[0]), "needs the mask: query .* window starts"),
    (left_edge_off_by_one, "needs the mask: query .* window starts"),
    (with_bound(2, lambda q0, bm, bn, S, w, g: max(g[1], min((q0 + bm) // bn, S // bn) * bn)),
     "needs the mask: it holds keys after query"),
    (with_bound(2, lambda q0, bm, bn, S, w, g: g[1]), "masked but every query of the block sees all of it"),
    (with_bound(0, lambda q0, bm, bn, S, w, g: g[0] + 1), "multiples of block_n"),
    (lambda q0, bm, bn, S, w: good_bounds(q0, bm, bn, S, w)[::-1], "follow each other"),
    (lambda q0, bm, bn, S, w: good_bounds(q0, bm, bn, S, w)[:3], "four offsets"),
])
def test_window_bounds_mistakes_are_named(fn, message):
    with pytest.raises(ExerciseError, match=message) as err:
        check.check_window_bounds(fn)
    assert not ANSWER.search(str(err.value)), f"the message gives the answer away: {err.value}"


def test_window_bounds_accept_any_empty_unmasked_stage():
    """Where no tile is seen whole, where the empty unmasked stage sits is the learner's choice."""
    def at_end(q0, bm, bn, S, w):
        start, lo, hi, end = good_bounds(q0, bm, bn, S, w)
        return (start, lo, hi, end) if hi > lo else (start, end // bn * bn, end // bn * bn, end)
    check.check_window_bounds(at_end)


def test_tile_counts_by_hand():
    """Queries 32..63, window 40 (query i sees i - 39 ... i), key blocks of 16 up to S = 128."""
    counts = dict(check.tile_counts(32, 32, 16, 128, 40, 128))
    assert counts[0] == sum(max(0, min(15, i) - max(0, i - 39) + 1) for i in range(32, 64))
    assert counts[32] == sum(min(47, i) - 32 + 1 for i in range(32, 64))
    assert counts[16] == sum(31 - max(16, i - 39) + 1 for i in range(32, 64)) < 32 * 16    # query 63 misses 16..23
    assert counts[64] == counts[112] == 0


def test_window_update_says_when_triton_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(ta, "available", lambda: False)
    check.check_window_update(lambda m_i, l_i, acc, s, v, rows, keys, window: (m_i, l_i, acc))
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
    (lambda n, b: (n // b + 1,), "not one program per block"),  # right for 37 / 16, wrong for 64 / 16
    (lambda n, b: ((n + b - 1) // b, 1), "not one program per block"),
])
def test_copy_grid_mistakes_are_named(grid, message):
    with pytest.raises(ExerciseError, match=message) as err:
        check.check_copy_grid(grid)
    assert not ANSWER.search(str(err.value)), f"the message gives the answer away: {err.value}"


@needs_triton
@pytest.mark.parametrize("kernel, message", [
    (off_by_one_copy, "one past the edge"),
    (unmasked_copy, "outside the 37 x 20 matrix"),
    (wrong_stride_copy, "read n_cols apart"),
])
def test_copy_kernel_mistakes_are_named(kernel, message):
    with pytest.raises(ExerciseError, match=message) as err:
        check.check_copy_kernel(kernel)
    assert not ANSWER.search(str(err.value)), f"the message gives the answer away: {err.value}"


# ----------------------------------------------------------------------------- right answers and stubs

@pytest.mark.parametrize("checker, right", [
    pytest.param(check.check_window_update, good_update, marks=needs_triton, id="window_update"),
    pytest.param(check.check_window_bounds, good_bounds, id="window_bounds"),
    pytest.param(check.check_copy_grid, good_grid, id="copy_grid"),
    pytest.param(check.check_copy_kernel, good_copy, marks=needs_triton, id="copy_kernel"),
])
def test_right_answer_passes(checker, right, capsys):
    expect_correct(checker, right, capsys)


@pytest.mark.parametrize("checker", [check.check_window_update, check.check_window_bounds, check.check_copy_grid,
                                     check.check_copy_kernel],
                         ids=["window_update", "window_bounds", "copy_grid", "copy_kernel"])
def test_stub_is_not_attempted(checker, capsys):
    expect_not_attempted(checker, stub, capsys)


# ----------------------------------------------------------------------------- the window update under TF32 (a GPU's float32 tl.dot)

def tf32_round(x):
    """x rounded to 10 mantissa bits, to nearest (ties away): TF32 if the float32 factor is rounded first."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_cut(x):
    """x cut to 10 mantissa bits (the low 13 dropped): TF32 as the tensor core reads the raw float32 bits, what
    Triton's default input_precision="tf32" hands it."""
    return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def tf32_stream(s, v, keep, tf32=tf32_cut):
    """The right update with its dot in TF32: what a correct answer computes on an A100, an RTX 4090 or an H100.
    s natural units, keep the window (BLOCK_M, n)."""
    s = s.masked_fill(~keep, float("-inf"))
    m = torch.full((s.shape[0],), float("-inf"))
    l, acc = torch.zeros(s.shape[0]), torch.zeros(s.shape[0], v.shape[1])
    for k0 in range(0, s.shape[1], check.BLOCK_N):
        blk, v_blk = s[:, k0:k0 + check.BLOCK_N], v[k0:k0 + check.BLOCK_N]
        m_new = torch.maximum(m, blk.amax(1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(blk - m_safe[:, None])
        l = l * alpha + p.sum(1)
        acc = acc * alpha[:, None] + (tf32(p).double() @ tf32(v_blk).double()).float()
        m = m_new
    return acc / l[:, None]


@pytest.mark.parametrize("tf32", [tf32_cut, tf32_round], ids=["cut", "rounded"])
def test_tf32_error_is_inside_its_bound_and_outside_float32s(tf32):
    """A right update on a TF32 GPU misses softmax(s) @ v by more than float32's 1e-4 (a float32 bound would reject
    it) and by less than the bound from TF32's 10-bit mantissa, whether the factors are cut or rounded to it."""
    assert check.TF32_UNIT == 2.0 ** -10                  # a cut factor errs by < 2^-10 (rounded: <= 2^-11)
    x = torch.tensor([1 + 2.0 ** -10 - 2.0 ** -23])
    assert (x - tf32_cut(x)).abs().item() / x.item() > 2.0 ** -11    # the cut errs by more than rounding's unit
    s, v = check.checker_inputs()
    keep = check.window_keep()
    masked = s.masked_fill(~keep, float("-inf"))
    want = torch.softmax(masked.double(), dim=-1) @ v.double()
    err = (tf32_stream(s, v, keep, tf32).double() - want).abs()
    assert err.max() > check.FP32_ATOL
    assert (err <= check.update_tolerance(masked, v, "tf32")).all()
    assert not (err <= check.update_tolerance(masked, v, "ieee")).all()
    assert check.update_tolerance(masked, v, "tf32").max() < 4e-3          # still far below any planted mistake's error
    for kwargs in (dict(rescale_acc=False), dict(rescale_l=False)):
        wrong = check._stream(s, v, keep, **kwargs).double()
        assert not ((wrong - want).abs() <= check.update_tolerance(masked, v, "tf32")).all()


def test_dot_precision_here():
    assert check.dot_precision() == ("ieee" if ta.interpreting() or not torch.cuda.is_available() else
                                     ta.precision_for(ta.device_limits(), torch.float32))


@pytest.mark.parametrize("fn, message", [
    (good_update, "Correct"),
    (no_acc, "acc is not rescaled"),
])
def test_window_update_on_a_tf32_gpu(monkeypatch, capsys, fn, message):
    """The checker's GPU path, run on a CPU: tl.dot in TF32 (emulated for the right answer and its planted
    mistake), judged against TF32's bound. A right answer passes and says which products it was held to."""
    monkeypatch.setattr(check, "dot_precision", lambda: "tf32")
    monkeypatch.setattr(check, "_is_stub", lambda fn: False)
    monkeypatch.setattr(ta, "available", lambda: True)
    keep = check.window_keep()

    def run(_, s2, v):
        s = s2 / check.LOG2_E                                             # the kernel's base-2 scores, back
        if fn is good_update:
            return tf32_stream(s, v, keep)
        return check._stream(s, v, keep, rescale_acc=False) + (tf32_stream(s, v, keep) - check._stream(s, v, keep))
    monkeypatch.setattr(check, "_run_update", run)
    if message == "Correct":
        check.check_window_update(fn)
        assert "TF32 products" in capsys.readouterr().out
    else:
        with pytest.raises(ExerciseError, match=message):
            check.check_window_update(fn)
