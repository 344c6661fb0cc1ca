"""Checkers for notebook 15: the online-softmax update of a sliding-window kernel, and its loop bounds.

``check_window_update`` runs the learner's update inside a small Triton kernel (under the
interpreter on a CPU, compiled on a GPU), so it needs Triton; where Triton is not installed it says
so and returns. Its float32 ``tl.dot`` runs in the precision Triton gives it on the learner's device
(``dot_precision``: TF32 on an sm_80+ GPU, exact float32 products under the interpreter and below sm_80), and
the answer is held to that precision's own bound (``update_tolerance``). ``check_window_bounds`` is plain Python,
judged against a brute-force count of the visible (query, key) pairs of every tile.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import triton_attention as ta  # first: it sets TRITON_INTERPRET=1 without CUDA, before triton loads
from . import ExerciseError, NotAttempted, attempt, not_attempted, passed
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

if ta.available():
    import triton
    import triton.language as tl

    from .. import triton_kernels  # noqa: F401  (importing it lets Triton 3.6's interpreter take loop bounds)

__all__ = ["dot_precision", "update_tolerance", "check_window_update", "check_window_bounds", "check_copy_grid",
           "check_copy_kernel"]

BLOCK_M, BLOCK_N, D = 16, 16, 16
N_KEYS, Q0, WINDOW = 64, 24, 20   # queries 24..39 see keys 5..24 up to 20..39: rows 36..39 see none of block 0
FP32_ATOL = 1e-4              # float32 products: the exp() and the sums of 20 keys stay far below this
TF32_UNIT = 2.0 ** -10        # TF32 keeps 10 of float32's 23 mantissa bits: a factor cut (or rounded) to TF32
                              # errs by < 2^-10 of itself, whichever the tensor cores do
LOG2_E = math.log2(math.e)


def dot_precision() -> str:
    """The precision of a float32 ``tl.dot`` (default ``input_precision``) where the checker runs it: "tf32" on a
    CUDA GPU of compute capability 8.0 or more (tensor cores, each factor cut to 10 mantissa bits), "ieee"
    (float32 products) under the interpreter and below sm_80, where Triton has no TF32."""
    if ta.interpreting() or not torch.cuda.is_available():
        return "ieee"
    return ta.precision_for(ta.device_limits(), torch.float32)


def update_tolerance(s: torch.Tensor, v: torch.Tensor, precision: str) -> torch.Tensor:
    """Elementwise bound (BLOCK_M, D) on |acc / l - softmax(s) @ v| for a right update whose ``tl.dot(p, v)`` runs
    in ``precision``: ``FP32_ATOL``, and with "tf32" the cut of both factors of every product p_j v_j to 10
    mantissa bits, |p_j v_j - tf32(p_j) tf32(v_j)| <= (2u + u^2) p_j |v_j| with u = 2^-10 (the bound of a
    cut; rounding to nearest would halve u), summed and divided by l:
    (2u + u^2) * (softmax(s) @ |v|). s in natural units, -inf where masked."""
    bound = torch.full((s.shape[0], v.shape[1]), FP32_ATOL, dtype=torch.float64)
    if precision == "tf32":
        u = TF32_UNIT
        bound += (2 * u + u * u) * (torch.softmax(s.double(), dim=-1) @ v.double().abs())
    return bound


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(((got.double() - want.double()).abs() <= bound).all())


def _kernel_source(S_ptr, V_ptr, O_ptr, n_keys, q0, window, UPDATE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, D: tl.constexpr):
    """One program: queries q0 ... q0 + BLOCK_M - 1, their base-2 scores (BLOCK_M, n_keys) read BLOCK_N keys at a
    time from key 0 to n_keys (every block, seen or not); the running (m, l, acc) go through UPDATE; writes acc / l.
    Turned into a kernel by ``triton.jit`` on first use."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for k0 in range(0, n_keys, BLOCK_N):
        keys = k0 + cols
        s = tl.load(S_ptr + rows[:, None] * n_keys + keys[None, :], mask=keys[None, :] < n_keys, other=float("-inf"))
        v = tl.load(V_ptr + keys[:, None] * D + d[None, :], mask=keys[:, None] < n_keys, other=0.0)
        m_i, l_i, acc = UPDATE(m_i, l_i, acc, s, v, q0 + rows, keys, window)
    tl.store(O_ptr + rows[:, None] * D + d[None, :], acc / l_i[:, None])


_KERNEL = None


def _run_update(fn, s2: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """acc / l after streaming base-2 scores s2 (BLOCK_M, N_KEYS) and values v (N_KEYS, D) through ``fn``."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = triton.jit(_kernel_source)
    device = "cpu" if ta.interpreting() else "cuda"
    s2, v = s2.to(device).contiguous(), v.to(device).contiguous()
    out = torch.empty(BLOCK_M, D, device=device)
    with np.errstate(all="ignore"):         # a wrong update may overflow: the checker says so, numpy need not
        _KERNEL[(1,)](s2, v, out, s2.shape[1], Q0, WINDOW, UPDATE=triton.jit(fn), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                      D=D)
    return out.cpu()


def window_keep(n_keys: int = N_KEYS, q0: int = Q0, window: int = WINDOW, *, below: int | None = None,
                causal_edge: int = 0) -> torch.Tensor:
    """(BLOCK_M, n_keys) True where query i = q0 + row sees key j: i - window < j <= i. ``below`` replaces
    window - 1 (keys seen to the left of i), ``causal_edge`` = -1 drops key i itself (the learner's slips)."""
    i = torch.arange(q0, q0 + BLOCK_M)[:, None]
    j = torch.arange(n_keys)[None, :]
    below = window - 1 if below is None else below
    return (j <= i + causal_edge) & (j >= i - below)


def _masked(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return s.masked_fill(~keep, float("-inf"))


def _stream(s: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, *, rescale_acc=True, rescale_l=True) -> torch.Tensor:
    """The right loop in torch (natural units, -inf guarded), with the rescale slips switched on."""
    s = _masked(s, keep)
    m = torch.full((s.shape[0],), float("-inf"))
    l, acc = torch.zeros(s.shape[0]), torch.zeros(s.shape[0], v.shape[1])
    for k0 in range(0, s.shape[1], BLOCK_N):
        blk, v_blk = s[:, k0:k0 + BLOCK_N], v[k0:k0 + BLOCK_N]
        m_new = torch.maximum(m, blk.amax(1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(blk - m_safe[:, None])
        l = l * alpha + p.sum(1) if rescale_l else l + p.sum(1)
        acc = acc * alpha[:, None] + p @ v_blk if rescale_acc else acc + p @ v_blk
        m = m_new
    return acc / l[:, None]


def _is_stub(fn) -> bool:
    """A stub raises NotImplementedError on its first line, before it touches its arguments."""
    try:
        attempt(fn, *([None] * 8))
    except NotAttempted:
        return True
    except Exception:          # a real update fails on None arguments outside a kernel: it is attempted
        return False
    return False


def checker_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The checker's draw: natural-unit scores s (BLOCK_M, N_KEYS) and values v (N_KEYS, D); later keys score
    higher, so the running max rises from block to block and the rescale matters."""
    gen = torch.Generator().manual_seed(15)
    s = torch.randn(BLOCK_M, N_KEYS, generator=gen)
    s[:, 24:] += 3.0
    return s, torch.randn(N_KEYS, D, generator=gen)


def check_window_update(fn) -> None:
    """``fn(m_i, l_i, acc, s, v, rows, keys, window) -> (m_new, l_new, acc_new)``: one step of the online softmax
    of a sliding-window kernel, in Triton, in base 2.

    m_i, l_i (BLOCK_M,) running max and sum; acc (BLOCK_M, D) running output; s (BLOCK_M, BLOCK_N) the
    scores of one key block already times scale * log2(e), not masked (-inf only for keys past the end);
    v (BLOCK_N, D); rows (BLOCK_M,) and keys (BLOCK_N,) the query and key indices; query i sees keys j with
    i - window < j <= i. The checker's kernel streams all 64 keys in blocks of 16 for queries 24 ... 39
    (window 20): some rows see nothing of the first block, every row nothing of the last. acc / l must equal
    softmax(masked scores) @ v within ``update_tolerance`` for the precision ``tl.dot`` has there.
    """
    if _is_stub(fn):
        return not_attempted("window_update")
    if not ta.available():
        print("Triton is not installed here (Linux only): this checker needs it to run your update inside a "
              "kernel. Compare it with attn_fwd_inner in selfattn_lite/triton_kernels.py instead.")
        return None
    s, v = checker_inputs()
    try:
        got = _run_update(fn, s * LOG2_E, v)
    except Exception as err:
        cause = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ExerciseError(f"the kernel failed with your update: {cause!r}. It must return three values "
                            "(m_new, l_new, acc_new) with the shapes of (m_i, l_i, acc), built from tl.* "
                            "operations (tl.where, tl.maximum, tl.max, tl.exp2, tl.sum, tl.dot)") from None
    precision = dot_precision()
    keep = window_keep()
    want = torch.softmax(_masked(s, keep), dim=-1) @ v

    def close(ref, scores=s, mask=keep):
        return _within(got, ref, update_tolerance(_masked(scores, mask), v, precision))

    if close(want):
        big = s * 40.0                                 # scores up to about +-200: exp2() overflows without the max
        got_big = _run_update(fn, big * LOG2_E, v)
        if not torch.isfinite(got_big).all():
            raise ExerciseError("right for small scores, but inf/NaN for large ones: exp2 overflows, so the "
                                "scores were not shifted by the running max before exponentiating (subtract the "
                                "running max)")
        want_big = torch.softmax(_masked(big, keep), dim=-1) @ v
        if not _within(got_big, want_big, update_tolerance(_masked(big, keep), v, precision)):
            raise ExerciseError("wrong for large scores: the max you shift by is not the running max over every "
                                "key seen so far (the earlier blocks' and this block's)")
        products = "TF32 products (10-bit mantissa)" if precision == "tf32" else "float32 products"
        return passed(f"acc / l == softmax(masked s) @ v within the bound of tl.dot's {products}, for a window of "
                      f"{WINDOW} streamed 16 keys at a time, rows that see nothing of a block included")
    late = ~keep[:, :BLOCK_N].any(1)                   # rows whose window starts after the first key block
    bad = ~torch.isfinite(got).all(1)
    if bad.any():
        if torch.equal(bad, late):
            raise ExerciseError("NaN in exactly the rows that see no key of the first block (queries "
                                f"{Q0 + int(late.nonzero()[0])} ... {Q0 + BLOCK_M - 1}): there the running max is "
                                "still "
                                "-inf, and -inf - (-inf) is NaN. Such a row must come out of the step with nothing "
                                "added, not NaN: guard that case")
        raise ExerciseError("the output has inf or NaN: check the rescale factor (it can never exceed 1) and the "
                            "rows that have seen no key yet")
    slips = [
        (torch.softmax(_masked(s * LOG2_E, keep), dim=-1) @ v,
         "you used tl.exp on scores in base 2: they are already times log2(e), so take tl.exp2"),
        (torch.softmax(_masked(s, window_keep(below=N_KEYS)), dim=-1) @ v,
         "the window's left edge is missing (this is the causal mask): query i sees only keys j > i - window"),
        (torch.softmax(s, dim=-1) @ v, "no mask: every key of every block counts, the window is never applied"),
        (torch.softmax(_masked(s, window_keep(below=WINDOW)), dim=-1) @ v,
         "off by one at the window's left edge: query i sees `window` keys, j > i - window (not >=)"),
        (torch.softmax(_masked(s, window_keep(below=WINDOW - 2)), dim=-1) @ v,
         "off by one at the window's left edge: query i sees `window` keys, i - window < j, itself included"),
        (torch.softmax(_masked(s, window_keep(causal_edge=-1)), dim=-1) @ v,
         "a query must see itself: keep j <= i, not j < i"),
        (_stream(s, v, keep, rescale_acc=False), "acc is not rescaled when the running max rises"),
        (_stream(s, v, keep, rescale_l=False), "l is not rescaled when the running max rises"),
    ]
    for ref, message in slips:
        if torch.isfinite(ref).all() and _within(got, ref, update_tolerance(_masked(s, keep), v, precision) + 1e-4):
            raise ExerciseError(message)
    raise ExerciseError("acc / l differs from softmax(masked s) @ v, and by none of the mistakes this checker "
                        "knows: compare your step with attn_fwd_inner's, piece by piece (the mask, the new max, "
                        "the guard, the rescale, the sums)")


# ------------------------------------------------------------------ the sliding-window loop bounds

# (L, S, block_m, block_n, window): L != S both ways, sizes that are not multiples of the blocks, windows narrower
# than a block, a window whose left edge q0 - window + 1 falls on a block start (q0 = 48, window 33), one where the
# last query's q0 + block_m - window is one past a block start (q0 = 32, window 47), a window wider than everything.
BOUNDS_CASES = [(128, 128, 32, 16, 40), (100, 90, 32, 16, 17), (70, 130, 16, 32, 48), (128, 128, 16, 16, 33),
                (200, 200, 64, 16, 1), (96, 96, 16, 16, 16), (120, 75, 32, 16, 100), (300, 300, 128, 64, 500),
                (50, 37, 16, 16, 5), (100, 100, 32, 16, 47)]


def tile_counts(q0: int, block_m: int, block_n: int, S: int, window: int, k_stop: int) -> list[tuple[int, int]]:
    """[(k0, visible pairs)] for the key blocks k0 = 0, block_n, ... < k_stop, counted pair by pair: query i in
    q0 ... q0 + block_m - 1 sees key j < S when i - window < j <= i. block_m * block_n visible pairs: no mask."""
    i = torch.arange(q0, q0 + block_m)[:, None]
    out = []
    for k0 in range(0, k_stop, block_n):
        j = torch.arange(k0, k0 + block_n)[None, :]
        out.append((k0, int(((j < S) & (j <= i) & (j > i - window)).sum())))
    return out


def check_window_bounds(fn) -> None:
    """``fn(q0, block_m, block_n, S, window) -> (start, unmasked_start, unmasked_end, end)``: the loop bounds of
    the program of queries q0 ... q0 + block_m - 1 in a sliding-window kernel (query i sees keys j < S with
    i - window < j <= i).

    Key blocks [start, unmasked_start) run with the mask (the window's left edge), [unmasked_start,
    unmasked_end) without, [unmasked_end, end) with it (the diagonal, the tail of S); nothing before start or
    from end on is loaded. start, unmasked_start and unmasked_end are multiples of block_n and
    start <= unmasked_start <= unmasked_end <= end. Judged for every query block q0 = 0, block_m, ... < L of
    ``BOUNDS_CASES`` whose queries see a key (with L > S that includes blocks at q0 >= S, where the unmasked stage
    must stop at the last whole key block inside S) against a count of the visible pairs of each tile
    (``tile_counts``): every tile with one is loaded, none without one, the unmasked range holds exactly the tiles
    whose block_m * block_n pairs are all visible.
    """
    try:
        attempt(fn, 0, 32, 16, 128, 40)
    except NotAttempted:
        return not_attempted("window_bounds")
    for L, S, bm, bn, w in BOUNDS_CASES:
        for q0 in range(0, L, bm):
            if max(0, q0 - w + 1) >= S:      # every query of the block has its whole window past the last key
                continue
            got = attempt(fn, q0, bm, bn, S, w)
            where = f"(q0={q0}, block_m={bm}, block_n={bn}, S={S}, window={w})"
            if not isinstance(got, tuple) or len(got) != 4:
                raise ExerciseError(f"return four offsets (start, unmasked_start, unmasked_end, end), got {got!r}")
            start, lo, hi, end = (int(x) for x in got)
            if any(x % bn for x in (start, lo, hi)):
                raise ExerciseError(f"{(start, lo, hi)} at {where}: start, unmasked_start and unmasked_end must be "
                                    "multiples of block_n (the loops step through whole key blocks)")
            if start <= lo <= hi and hi > end:
                raise ExerciseError(f"unmasked_end = {hi} at {where} runs past end = {end}: the unmasked stage loads "
                                    f"whole key blocks without the mask, so it must stop at a whole block inside S")
            if not start <= lo <= hi <= end:
                raise ExerciseError(f"{(start, lo, hi, end)} at {where}: the three stages must follow each other, "
                                    "start <= unmasked_start <= unmasked_end <= end")
            counts = tile_counts(q0, bm, bn, S, w, max(end, S))
            seen = [k0 for k0, c in counts if c]
            first_key, last_key = max(0, q0 - w + 1), min(S, q0 + bm) - 1    # keys some query of the block sees
            loaded = set(range(start, end, bn))
            if seen[0] < start:
                raise ExerciseError(f"start = {start} at {where} skips keys query {q0} sees (from key {first_key} on)")
            if end <= last_key:
                raise ExerciseError(f"end = {end} at {where} stops before key {last_key}, the last one query "
                                    f"{min(S - 1, q0 + bm - 1)} sees")
            for k0 in sorted(loaded):
                if k0 >= S:
                    raise ExerciseError(f"end = {end} at {where} loads key block {k0}, past S (the last key is "
                                        f"{S - 1})")
                if dict(counts)[k0] == 0:
                    side = "after the block's last query" if k0 > q0 else "before the window of its first query"
                    raise ExerciseError(f"at {where} the loop loads key block [{k0}, {k0 + bn}), which no query of "
                                        f"the block sees (it lies {side})")
            full = [k0 for k0, c in counts if c == bm * bn]
            for k0 in range(lo, hi, bn):
                if k0 not in full:
                    if k0 + bn > S:
                        why = f"it runs past the last key, {S - 1}"
                    elif k0 + bn > q0 + 1:
                        why = f"it holds keys after query {q0}, the block's first"
                    else:
                        why = f"query {q0 + bm - 1}'s window starts at {q0 + bm - w}, after key {k0}"
                    raise ExerciseError(f"key block [{k0}, {k0 + bn}) at {where} needs the mask: {why}")
            missed = [k0 for k0 in full if not lo <= k0 < hi]
            if missed:
                raise ExerciseError(f"at {where} the key block [{missed[0]}, {missed[0] + bn}) is masked but every "
                                    f"query of the block sees all of it, so it belongs in the unmasked range")
    return passed("every query block's loop loads exactly the key blocks its window touches, and skips the mask on "
                  "exactly the blocks it sees whole")


# ------------------------------------------------------------------ a kernel of your own: pointers, masks, grid

COPY_ROWS, COPY_COLS, COPY_BLOCK_R, COPY_BLOCK_C = 37, 20, 16, 32    # blocks that divide nothing
STRIDE_X, STRIDE_Y = 48, 40                                          # rows of x, y lie this far apart


def _copy_buffers() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (37, 20) and y (37, 20), each a window of a larger buffer (row strides 48 and 40) whose margin of
    BLOCK_R rows and BLOCK_C columns catches reads and writes past the edges without leaving the buffer."""
    x_full = torch.arange((COPY_ROWS + COPY_BLOCK_R) * STRIDE_X, dtype=torch.float32).reshape(-1, STRIDE_X)
    y_full = torch.full((COPY_ROWS + COPY_BLOCK_R, STRIDE_Y), -1.0)
    return x_full, y_full, x_full[:COPY_ROWS, :COPY_COLS], y_full[:COPY_ROWS, :COPY_COLS]


def _stub(fn, *args) -> bool:
    """True when fn still raises NotImplementedError (called with placeholder arguments)."""
    try:
        attempt(fn, *args)
    except NotAttempted:
        return True
    except Exception:          # a real kernel body fails outside a kernel: it is attempted
        return False
    return False


def check_copy_grid(copy_grid) -> None:
    """``copy_grid(n_rows, block_r) -> grid``: the launch grid of ``copy_rows``, one program per block of
    block_r rows (a tuple, as Triton takes it). Names a grid that drops the last, partial block."""
    if _stub(copy_grid, COPY_ROWS, COPY_BLOCK_R):
        return not_attempted("copy_grid")
    for n_rows, block_r in ((COPY_ROWS, COPY_BLOCK_R), (64, 16), (1, 32), (4097, 128)):
        grid = attempt(copy_grid, n_rows, block_r)
        want = -(-n_rows // block_r)
        if not isinstance(grid, tuple) or not grid or not all(isinstance(g, int) for g in grid):
            raise ExerciseError(f"copy_grid must return a tuple of ints, e.g. (programs,), got {grid!r}")
        if len(grid) != 1 or grid[0] != want:
            hint = " (floor division drops the last, partial block of rows)" if grid[0] == n_rows // block_r else ""
            raise ExerciseError(f"copy_grid({n_rows}, {block_r}) = {grid}: that is not one program per block of "
                                f"{block_r} rows, with {n_rows} rows to cover{hint}")
    return passed("one program per block of rows, the last partial block included: (ceil(n_rows / block_r),)")


def check_copy_kernel(copy_rows) -> None:
    """``copy_rows(X, Y, n_rows, n_cols, stride_x, stride_y, BLOCK_R, BLOCK_C)``, a Triton kernel body: copy an
    (n_rows, n_cols) matrix whose rows lie stride_x elements apart into one whose rows lie stride_y apart,
    BLOCK_R rows per program.

    The checker launches it (under the interpreter on a CPU) on the grid (ceil(37 / 16),) over 37 x 20
    windows of larger buffers, with blocks of 16 x 32 that divide nothing, and names the mistake: a mask
    that lets row n_rows or column n_cols through (<= for <) or is missing, a row stride taken as n_cols.
    """
    if _stub(copy_rows, *([None] * 8)):
        return not_attempted("copy_kernel")
    if not ta.available():
        print("Triton is not installed here (Linux only): this checker needs it to launch your kernel.")
        return None
    grid = (-(-COPY_ROWS // COPY_BLOCK_R),)
    x_full, y_full, _, _ = _copy_buffers()
    device = ta.best_device()
    x_full, y_full = x_full.to(device), y_full.to(device)
    kernel = triton.jit(copy_rows)
    try:
        kernel[grid](x_full, y_full, COPY_ROWS, COPY_COLS, STRIDE_X, STRIDE_Y, BLOCK_R=COPY_BLOCK_R,
                     BLOCK_C=COPY_BLOCK_C)
    except Exception as err:
        cause = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ExerciseError(f"the kernel failed: {cause!r}. Its offsets must be tl.arange blocks and its pointers "
                            "a (BLOCK_R, BLOCK_C) block built from them") from None
    x_full, y_full = x_full.cpu(), y_full.cpu()
    x, y = x_full[:COPY_ROWS, :COPY_COLS], y_full[:COPY_ROWS, :COPY_COLS]
    margin = y_full.clone()
    margin[:COPY_ROWS, :COPY_COLS] = -1.0
    touched = margin != -1.0
    if touched.any():
        rows, cols = touched.nonzero(as_tuple=True)
        if rows.max() == COPY_ROWS and cols.max() <= COPY_COLS or cols.max() == COPY_COLS and rows.max() <= COPY_ROWS:
            raise ExerciseError("your kernel wrote row n_rows or column n_cols, one past the edge: the mask must be "
                                "rows < n_rows and cols < n_cols (< where you wrote <=)")
        raise ExerciseError(f"your kernel wrote outside the {COPY_ROWS} x {COPY_COLS} matrix (up to row "
                            f"{int(rows.max())}, column {int(cols.max())}): the load and the store need a mask, "
                            "for the "
                            "rows and for the columns")
    if torch.equal(y, x):
        return passed("copied a 37 x 20 window with strides 48 and 40, blocks of 16 x 32, and nothing outside it")
    flat = x_full.reshape(-1)
    index = torch.arange(COPY_ROWS)[:, None] * COPY_COLS + torch.arange(COPY_COLS)[None, :]
    if torch.equal(y, flat[index]):
        raise ExerciseError("the rows of x were read n_cols apart, but x's rows lie stride_x elements apart")
    if (y == -1).any():
        raise ExerciseError("some elements of y were never written: check the store's pointers (y's own row "
                            "stride) and that its mask matches the load's")
    raise ExerciseError("y differs from x: check the load's and the store's pointers, each matrix with its own "
                        "row stride")

