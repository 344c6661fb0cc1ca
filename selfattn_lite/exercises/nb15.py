"""Checkers for notebook 15: the online-softmax update inside a Triton kernel, and the causal loop bounds.

``check_online_update`` runs the learner's update inside a small Triton kernel (under the
interpreter on a CPU, compiled on a GPU), so it needs Triton; where Triton is not installed it says
so and returns. Its float32 ``tl.dot`` runs in the precision Triton gives it on the learner's device
(``dot_precision``: TF32 on an sm_80+ GPU, exact float32 products under the interpreter and below sm_80), and
the answer is held to that precision's own bound (``update_tolerance``). ``check_causal_bounds`` is plain Python.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import triton_attention as ta  # first: it sets TRITON_INTERPRET=1 without CUDA, before triton loads
from . import ExerciseError, NotAttempted, attempt, not_attempted, passed

if ta.available():
    import triton
    import triton.language as tl

    from .. import triton_kernels  # noqa: F401  (importing it lets Triton 3.6's interpreter take loop bounds)

__all__ = ["dot_precision", "update_tolerance", "check_online_update", "check_causal_bounds", "check_copy_grid",
           "check_copy_kernel"]

BLOCK_M, BLOCK_N, D = 16, 16, 16
FP32_ATOL = 1e-4              # float32 products: the exp() and the sums of 40 keys stay far below this
TF32_UNIT = 2.0 ** -11        # TF32 keeps 10 of float32's 23 mantissa bits: rounding a factor errs by <= 2^-11


def dot_precision() -> str:
    """The precision of a float32 ``tl.dot`` (default ``input_precision``) where the checker runs it: "tf32" on a
    CUDA GPU of compute capability 8.0 or more (tensor cores, each factor rounded to 10 mantissa bits), "ieee"
    (float32 products) under the interpreter and below sm_80, where Triton has no TF32."""
    if ta.interpreting() or not torch.cuda.is_available():
        return "ieee"
    return ta.precision_for(ta.device_limits(), torch.float32)


def update_tolerance(s: torch.Tensor, v: torch.Tensor, precision: str) -> torch.Tensor:
    """Elementwise bound (BLOCK_M, D) on |acc / l - softmax(s) @ v| for a right update whose ``tl.dot(p, v)`` runs
    in ``precision``: ``FP32_ATOL``, and with "tf32" the rounding of both factors of every product p_j v_j,
    |p_j v_j - tf32(p_j) tf32(v_j)| <= (2u + u^2) p_j |v_j| with u = 2^-11, summed and divided by l:
    (2u + u^2) * (softmax(s) @ |v|)."""
    bound = torch.full((s.shape[0], v.shape[1]), FP32_ATOL, dtype=torch.float64)
    if precision == "tf32":
        u = TF32_UNIT
        bound += (2 * u + u * u) * (torch.softmax(s.double(), dim=-1) @ v.double().abs())
    return bound


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(((got.double() - want.double()).abs() <= bound).all())


def _kernel_source(S_ptr, V_ptr, O_ptr, n_keys, UPDATE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, D: tl.constexpr):
    """One program: BLOCK_M rows of scores (BLOCK_M, n_keys) read BLOCK_N keys at a time; the running
    (m, l, acc) go through UPDATE; writes acc / l. Turned into a kernel by ``triton.jit`` on first use."""
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
        m_i, l_i, acc = UPDATE(m_i, l_i, acc, s, v)
    tl.store(O_ptr + rows[:, None] * D + d[None, :], acc / l_i[:, None])


_KERNEL = None


def _run_update(fn, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """acc / l after streaming scores s (BLOCK_M, n) and values v (n, D) through ``fn`` in a kernel."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = triton.jit(_kernel_source)
    device = "cpu" if ta.interpreting() else "cuda"
    s, v = s.to(device).contiguous(), v.to(device).contiguous()
    out = torch.empty(BLOCK_M, D, device=device)
    with np.errstate(all="ignore"):         # a wrong update may overflow: the checker says so, numpy need not
            _KERNEL[(1,)](s, v, out, s.shape[1], UPDATE=triton.jit(fn), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D=D)
    return out.cpu()


def _stream(s: torch.Tensor, v: torch.Tensor, *, rescale_acc=True, rescale_l=True, flip=False) -> torch.Tensor:
    """The same loop in torch, with the mistakes a learner may make switched on."""
    m = torch.full((s.shape[0],), float("-inf"))
    l, acc = torch.zeros(s.shape[0]), torch.zeros(s.shape[0], v.shape[1])
    for k0 in range(0, s.shape[1], BLOCK_N):
        blk, v_blk = s[:, k0:k0 + BLOCK_N], v[k0:k0 + BLOCK_N]
        m_new = torch.maximum(m, blk.amax(1))
        alpha = torch.exp(m_new - m) if flip else torch.exp(m - m_new)
        p = torch.exp(blk - m_new[:, None])
        l = l * alpha + p.sum(1) if rescale_l else l + p.sum(1)
        acc = acc * alpha[:, None] + p @ v_blk if rescale_acc else acc + p @ v_blk
        m = m_new
    return acc / l[:, None]


def _is_stub(fn) -> bool:
    """A stub raises NotImplementedError on its first line, before it touches its arguments."""
    try:
        attempt(fn, None, None, None, None, None)
    except NotAttempted:
        return True
    except Exception:          # a real update fails on None arguments outside a kernel: it is attempted
        return False
    return False


def check_online_update(fn) -> None:
    """``fn(m_i, l_i, acc, s, v) -> (m_new, l_new, acc_new)``: one step of the online softmax, in Triton.

    m_i, l_i (BLOCK_M,) running max and sum; acc (BLOCK_M, D) running output; s (BLOCK_M, BLOCK_N)
    scores of one key block (natural units, -inf where masked); v (BLOCK_N, D); all float32.
    The checker calls it from a kernel that streams 40 keys in blocks of 16 and compares acc / l
    with softmax(s) @ v within ``update_tolerance`` for the precision ``tl.dot`` has there (``dot_precision``).
    """
    if _is_stub(fn):
        return not_attempted("online_update")
    if not ta.available():
        print("Triton is not installed here (Linux only): this checker needs it to run your update inside a "
              "kernel. Compare it with attn_fwd_inner in selfattn_lite/triton_kernels.py instead.")
        return None
    gen = torch.Generator().manual_seed(15)
    s = torch.randn(BLOCK_M, 40, generator=gen)
    s[:, 20:] += 3.0                                   # later blocks raise the max: the rescale matters
    v = torch.randn(40, D, generator=gen)
    try:
        got = _run_update(fn, s, v)
    except Exception as err:
        cause = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ExerciseError(f"the kernel failed with your update: {cause!r}. It must return three values "
                            "(m_new, l_new, acc_new) with the shapes of (m_i, l_i, acc), built from tl.* "
                            "operations (tl.maximum, tl.max, tl.exp, tl.sum, tl.dot)") from None
    precision = dot_precision()
    want = torch.softmax(s, dim=-1) @ v
    if _within(got, want, update_tolerance(s, v, precision)):
        big = s * 40.0                                 # scores up to about +-200: exp() overflows without the max
        got_big = _run_update(fn, big, v)
        if not torch.isfinite(got_big).all():
            raise ExerciseError("right for small scores, but inf/NaN for large ones: subtract the running max "
                                "before exponentiating, p = exp(s - m_new[:, None])")
        if not _within(got_big, torch.softmax(big, dim=-1) @ v, update_tolerance(big, v, precision)):
            raise ExerciseError("wrong for large scores: use the running max m_new = max(m_i, rowmax(s))")
        products = "TF32 products (10-bit mantissa)" if precision == "tf32" else "float32 products"
        return passed(f"acc / l == softmax(s) @ v within the bound of tl.dot's {products}, streamed through your "
                      "update 16 keys at a time")
    if not torch.isfinite(got).all():
        raise ExerciseError("the output has inf or NaN: is the rescale factor exp(m_i - m_new) (<= 1), with "
                            "m_new = max(m_i, rowmax(s))? exp(m_new - m_i) blows up on the first block")
    mistakes = [
        (dict(rescale_acc=False), "acc is not rescaled: acc_new = acc * alpha[:, None] + tl.dot(p, v)"),
        (dict(rescale_l=False), "l is not rescaled: l_new = l_i * alpha + tl.sum(p, 1)"),
        (dict(flip=True), "the rescale factor is upside down: alpha = exp(m_i - m_new), not exp(m_new - m_i)"),
    ]
    for kwargs, message in mistakes:
        if _within(got, _stream(s, v, **kwargs), update_tolerance(s, v, precision)):
            raise ExerciseError(message)
    raise ExerciseError("acc / l differs from softmax(s) @ v: m_new = max(m_i, rowmax(s)), alpha = exp(m_i - m_new), "
                        "p = exp(s - m_new[:, None]), l_new = l_i * alpha + rowsum(p), acc_new = acc * alpha + p @ v")


def check_causal_bounds(fn) -> None:
    """``fn(q0, block_m, block_n, S) -> (unmasked_end, end)``: the causal loop bounds of one query block.

    Key blocks [0, unmasked_end) run without a mask, [unmasked_end, end) with it; nothing after end
    is loaded. Must agree with ``triton_attention.key_block_bounds(..., is_causal=True)``.
    """
    cases = [(0, 64, 64, 4096), (64, 64, 64, 4096), (128, 128, 64, 4096), (63, 64, 64, 4096), (100, 16, 32, 90),
             (96, 32, 16, 50), (0, 16, 16, 5), (4000, 128, 64, 4096)]
    try:
        attempt(fn, *cases[0])
    except NotAttempted:
        return not_attempted("causal_bounds")
    for q0, bm, bn, S in cases:
        got = attempt(fn, q0, bm, bn, S)
        if not isinstance(got, tuple) or len(got) != 2:
            raise ExerciseError(f"return a pair (unmasked_end, end), got {got!r}")
        unmasked_end, end = (int(x) for x in got)
        want_unmasked, want_end = ta.key_block_bounds(q0, bm, bn, S, True)
        where = f"(q0={q0}, block_m={bm}, block_n={bn}, S={S})"
        if end == S and want_end < S:
            raise ExerciseError(f"end = S at {where}: the loop then loads key blocks after the block's last query, "
                                f"all masked. Stop at min(S, q0 + block_m) = {want_end}")
        if end < want_end:
            raise ExerciseError(f"end = {end} at {where} stops before the last key a query of this block sees "
                                f"(query {q0 + bm - 1} sees keys up to {min(S, q0 + bm) - 1}): "
                                "end = min(S, q0 + block_m)")
        if end != want_end:
            raise ExerciseError(f"end = {end} at {where}, expected min(S, q0 + block_m) = {want_end}")
        if unmasked_end % bn:
            raise ExerciseError(f"unmasked_end = {unmasked_end} at {where} is not a multiple of block_n: the loop "
                                "steps through whole key blocks from 0")
        if unmasked_end > want_unmasked:
            raise ExerciseError(f"unmasked_end = {unmasked_end} at {where}: the block from {want_unmasked} holds keys "
                                f"after query {q0}, so it needs the mask. unmasked_end = floor((q0 + 1) / block_n) * "
                                "block_n (and not past S)")
        if unmasked_end < want_unmasked:
            raise ExerciseError(f"unmasked_end = {unmasked_end} at {where}: correct, but masks whole blocks it need "
                                f"not; a block ending at or before q0 is whole for every query, so {want_unmasked}")
    return passed("the causal loop bounds: no mask up to floor((q0 + 1) / block_n) * block_n, end at "
                  "min(S, q0 + block_m)")


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
            raise ExerciseError(f"copy_grid({n_rows}, {block_r}) = {grid}: one program per block of rows needs "
                                f"(ceil(n_rows / block_r),) = ({want},){hint}")
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
        raise ExerciseError(f"the kernel failed: {cause!r}. Build rows = pid * BLOCK_R + tl.arange(0, BLOCK_R) and "
                            "cols = tl.arange(0, BLOCK_C), then X + rows[:, None] * stride_x + cols[None, :]") from None
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
                            f"{int(rows.max())}, column {int(cols.max())}): mask both loads and stores with "
                            "(rows[:, None] < n_rows) & (cols[None, :] < n_cols)")
    if torch.equal(y, x):
        return passed("copied a 37 x 20 window with strides 48 and 40, blocks of 16 x 32, and nothing outside it")
    flat = x_full.reshape(-1)
    index = torch.arange(COPY_ROWS)[:, None] * COPY_COLS + torch.arange(COPY_COLS)[None, :]
    if torch.equal(y, flat[index]):
        raise ExerciseError("the rows of x were read n_cols apart: x's rows lie stride_x elements apart "
                            "(X + rows[:, None] * stride_x + cols[None, :])")
    if (y == -1).any():
        raise ExerciseError("some elements of y were never written: check the store's pointers, "
                            "Y + rows[:, None] * stride_y + cols[None, :], and that its mask matches the load's")
    raise ExerciseError("y differs from x: load X + rows[:, None] * stride_x + cols[None, :] and store to "
                        "Y + rows[:, None] * stride_y + cols[None, :], both with the mask")

