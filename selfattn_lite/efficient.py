"""Efficient attention: FlashAttention's idea in plain PyTorch, sliding windows, linear attention.

Explicit attention materialises the L x S score matrix per head: O(n^2) memory. The
tiled version below never does. It walks over tiles of queries against tiles of keys and
keeps, per query row, three running quantities (the *online softmax*):

    m   running max of the scores seen so far             (..., L, 1)
    l   running sum of exp(score - m)                     (..., L, 1)
    acc running sum of exp(score - m) * value             (..., L, Ev)

When a new tile raises the max from m to m', the old sums are rescaled by exp(m - m'),
so at the end acc / l is exactly softmax(Q K^T * scale + M) V: the same numbers as
explicit attention, with O(block_q x block_k) extra memory per head.

Also here: the tile plan (which tiles are computed, masked or skipped), sliding-window
(local) attention, linear attention with a feature map, its recurrent form with a
fixed-size state. (How notebook 08 measures memory is course machinery: ``course.memory``.)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import (
    check_bool,
    check_int,
    check_positive_int,
    check_qkv,
    check_real,
    check_same_dtype,
    check_scale,
    check_shape,
    check_tensor,
    shape_str,
)
from .attention import upcast_dtype

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "CUDA_BLOCK_SIZE",
    "default_block_size",
    "TileKind",
    "tile_kind",
    "SKIP",
    "PARTIAL",
    "FULL",
    "online_softmax",
    "tile_plan",
    "flash_attention",
    "flash_attention_backward",
    "sliding_window_mask",
    "sliding_window_attention",
    "elu_feature_map",
    "random_feature_map",
    "linear_attention",
    "linear_attention_step",
]

# (block_q, block_k) when none is given. CPU: 256 queries x 512 keys, large enough that each tile
# is two real matmuls, small enough that a tile of scores for 8 heads (4 MiB in float32) stays in
# cache (512 x 512 was measurably slower). CUDA: larger tiles, fewer kernel launches.
DEFAULT_BLOCK_SIZE = (256, 512)
CUDA_BLOCK_SIZE = (1024, 1024)

LOG2_E = math.log2(math.e)   # e^x = 2^(x log2 e): the kernel folds log2(e) into the scale and uses exp2


class TileKind(enum.IntEnum):
    """What a tiled kernel does with one (query tile, key tile) pair.

    One classification for every tiled kernel of the course: ``flash_attention`` here, ring attention
    (``distributed``) and the Triton kernel (``triton_attention``).

    Taught in notebook 08, "FlashAttention's idea: tiles".
    """

    SKIP = 0       # every pair is outside the visible band: never computed
    PARTIAL = 1    # straddles the band's edge: computed, then masked
    FULL = 2       # every pair is visible: computed, no mask

    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"value must be one of {[int(k) for k in cls]} ({', '.join(k.name for k in cls)}), "
                         f"got {value!r}")


SKIP, PARTIAL, FULL = TileKind.SKIP, TileKind.PARTIAL, TileKind.FULL


def default_block_size(device: torch.device | str = "cpu") -> tuple[int, int]:
    """(block_q, block_k) that ``flash_attention`` uses on ``device`` when block_size is None.

    Taught in notebook 08, "FlashAttention's idea: tiles".
    """
    if not isinstance(device, torch.device | str):
        raise ValueError(f"device must be a torch.device or a str such as 'cpu', got {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be a torch.device or a str such as 'cpu', got {device!r}") from None
    return CUDA_BLOCK_SIZE if device.type == "cuda" else DEFAULT_BLOCK_SIZE


def _band(L: int, S: int, is_causal: bool, window: int | None) -> tuple[int, int]:
    """The allowed offsets d = j - i between key j and query i: -below <= d <= above.

    No mask: every offset. Causal: above = 0 (top-left aligned, like torch). A window of w:
    at most w - 1 positions back (and, when not causal, w - 1 forward).
    """
    if window is not None:
        check_positive_int("window", window)
    below = window - 1 if window is not None else L + S
    above = 0 if is_causal else (window - 1 if window is not None else L + S)
    return below, above


# ---------------------------------------------------------------------------------------------
# Online softmax on its own
# ---------------------------------------------------------------------------------------------

def online_softmax(x: Tensor, block_size: int) -> Tensor:
    """softmax(x) over the last dim, reading x one block of columns at a time.

    One pass keeps a running max m and a running sum l = sum exp(x - m); when a block
    raises the max to m', the old sum is rescaled: l' = l * exp(m - m') + sum exp(x_block - m').
    A second pass writes exp(x - m) / l. FlashAttention folds that second pass into the
    value sum, so it needs one pass only.

    Args:
        x: (..., n) scores. block_size: columns per block (need not divide n).

    Returns:
        (..., n) softmax(x, dim=-1).

    Taught in notebook 08, "Online softmax, on its own".
    """
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError(f"x must be a floating tensor with at least one dim, got {x!r:.60}")
    check_positive_int("block_size", block_size)
    m = torch.full_like(x[..., :1], float("-inf"))       # (..., 1) running max
    l = torch.zeros_like(x[..., :1])                     # (..., 1) running sum of exp(x - m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


# ---------------------------------------------------------------------------------------------
# The tile plan: which tiles are computed, which need a mask, which are skipped
# ---------------------------------------------------------------------------------------------

def tile_kind(q0: int, q1: int, k0: int, k1: int, below: int, above: int) -> TileKind:
    """Kind of the tile of queries [q0, q1) x keys [k0, k1) when query i sees key j iff -below <= j - i <= above.

    Causal (top-left): below = a large number (or S), above = 0. No mask: below = L, above = S.

    Taught in notebook 08, "FlashAttention's idea: tiles".
    """
    for name, n in (("q0", q0), ("q1", q1), ("k0", k0), ("k1", k1), ("below", below), ("above", above)):
        check_int(name, n, low=None)
    if q1 <= q0 or k1 <= k0:
        raise ValueError(f"a tile needs q0 < q1 and k0 < k1, got queries [{q0}, {q1}), keys [{k0}, {k1})")
    if k0 - (q1 - 1) > above or q0 - (k1 - 1) > below:
        return SKIP                  # every pair is outside the band: never computed
    if (k1 - 1) - q0 <= above and (q1 - 1) - k0 <= below:
        return FULL                  # every pair is inside: no mask needed
    return PARTIAL                   # straddles the band's edge: computed, then masked


def tile_plan(L: int, S: int | None = None, block_size=DEFAULT_BLOCK_SIZE, *, is_causal: bool = False,
              window: int | None = None) -> Tensor:
    """Which (query tile, key tile) pairs ``flash_attention`` computes.

    Args:
        L: queries, S: keys (default L). block_size: int or (block_q, block_k).
        is_causal: query i sees keys j <= i (top-left aligned).
        window: query i sees keys with |i - j| < window (and j <= i when causal).

    Returns:
        (ceil(L / block_q), ceil(S / block_k)) int8 tensor of ``SKIP`` (0), ``PARTIAL`` (1,
        computed then masked) and ``FULL`` (2, computed, no mask).

    Taught in notebook 08, "FlashAttention's idea: tiles".
    """
    check_bool("is_causal", is_causal)
    L = check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    block_q, block_k = _block_sizes(block_size)
    below, above = _band(L, S, is_causal, window)
    rows = []
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        rows.append([tile_kind(q0, q1, k0, min(k0 + block_k, S), below, above) for k0 in range(0, S, block_k)])
    return torch.tensor(rows, dtype=torch.int8)


def _band_mask(q0: int, q1: int, k0: int, k1: int, below: int, above: int, device) -> Tensor:
    """(q1 - q0, k1 - k0) bool, True = may attend: -below <= j - i <= above."""
    ones = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
    # with local indices i' = i - q0, j' = j - k0: j - i <= above  <=>  j' - i' <= above + q0 - k0
    return ones.tril(above + q0 - k0) & ones.triu(q0 - k0 - below)


# ---------------------------------------------------------------------------------------------
# FlashAttention's forward pass, tiled, in plain PyTorch
# ---------------------------------------------------------------------------------------------

def _attend_query_block(q: Tensor, k: Tensor, v: Tensor, q0: int, block_k: int, below: int, above: int,
                        compute: torch.dtype) -> Tensor:
    """Online-softmax attention of one block of queries against the key tiles it needs.

    Works in base 2: q arrives multiplied by scale * log2(e), so a score s here is the usual
    score times log2(e), and 2^(s - m) = e^(score - m'). The output is the same. FlashAttention's
    CUDA kernels work in base 2 so that the scale and the max subtraction fuse into one multiply-add
    ahead of exp2f (csrc/flash_attn/src/softmax.h); on a CPU it buys nothing (torch's exp2 is not
    faster than its exp, and torch's CPU flash kernel uses exp), so here base 2 mirrors the GPU kernels.

    Args:
        q: (N, Bq, E) queries q0 .. q0 + Bq - 1, already multiplied by scale * log2(e).
        k: (N, S, E) keys; v: (N, S, Ev) values.

    Returns:
        (N, Bq, Ev) softmax(q k^T + M) v in the ``compute`` dtype, and (N, Bq, 1) the row's
        log-sum-exp in base 2, m + log2(l) (-inf for a row that saw no key): all the backward
        pass needs to recompute any tile of P.
    """
    N, Bq, _ = q.shape
    S, Ev = k.shape[1], v.shape[-1]
    m = torch.full((N, Bq, 1), float("-inf"), dtype=compute, device=q.device)   # running max
    l = torch.zeros(N, Bq, 1, dtype=compute, device=q.device)                   # running sum
    acc = torch.zeros(N, Bq, Ev, dtype=compute, device=q.device)                # running output
    for k0 in range(0, S, block_k):
        k1 = min(k0 + block_k, S)
        kind = tile_kind(q0, q0 + Bq, k0, k1, below, above)
        if kind == SKIP:
            continue                                            # above the diagonal: never touched
        if kind == PARTIAL:                                     # drop key columns no query here may see
            k0, k1 = max(k0, q0 - below), min(k1, q0 + Bq - 1 + above + 1)
            kind = tile_kind(q0, q0 + Bq, k0, k1, below, above)
        k_tile, v_tile = k[:, k0:k1].to(compute), v[:, k0:k1].to(compute)   # half inputs: the tile in float32
        s = torch.bmm(q, k_tile.transpose(1, 2))                # (N, Bq, Bk) scores of this tile
        if kind == PARTIAL:
            s.masked_fill_(~_band_mask(q0, q0 + Bq, k0, k1, below, above, q.device), float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (N, Bq, 1)
        if kind == PARTIAL:                                     # a row may have seen no key yet:
            m_new = m_new.masked_fill(m_new == float("-inf"), 0.0)  # keep 2^(-inf - m) = 0, not NaN
        alpha = torch.exp2(m - m_new)                           # rescales what was summed so far
        p = s.sub_(m_new).exp2_()                               # in place: p = 2^(s - m_new)
        l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
        acc.mul_(alpha).baddbmm_(p, v_tile)                     # acc = acc * alpha + p @ v_tile
        m = m_new
    return acc / l.masked_fill(l == 0, 1.0), m + torch.log2(l)  # a row that saw no key: output 0, lse -inf


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False,
                    block_size=None, scale: float | None = None,
                    window: int | None = None, enable_gqa: bool = False,
                    return_lse: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + M) V computed tile by tile, never forming the L x S matrix.

    Same result as ``torch.nn.functional.scaled_dot_product_attention`` (up to float
    rounding). Tiles of ``block_q`` queries meet tiles of ``block_k`` keys; per query row an
    online softmax keeps the running max m, the running sum l and the running output acc:

        m' = max(m, rowmax(S_tile))
        l' = l * exp(m - m') + rowsum(exp(S_tile - m'))
        acc' = acc * exp(m - m') + exp(S_tile - m') @ V_tile
        output = acc / l

    With ``is_causal`` (query i sees keys j <= i, top-left aligned like torch) tiles entirely
    above the diagonal are skipped, not masked: about half the work for L = S. A tile that
    straddles the diagonal is first trimmed to the key columns its queries may see, then
    masked. For speed the exponentials are taken in base 2 (log2(e) folded into the scale),
    as FlashAttention does.

    Args:
        q: (..., L, E) queries; k: (..., S, E) keys; v: (..., S, Ev) values. Leading dims
            (batch, heads) broadcast.
        is_causal: causal mask, top-left aligned.
        block_size: int, or (block_q, block_k); need not divide L or S. None:
            ``default_block_size(q.device)``, (256, 512) on CPU.
        scale: multiplies the scores; default 1 / sqrt(E).
        window: sliding window: query i sees only keys with |i - j| < window (and j <= i
            when causal); tiles outside the band are skipped. None: no window.
        enable_gqa: q (..., Hq, L, E) with k, v (..., H, S, E): key/value head j serves
            query heads j*g .. (j+1)*g - 1, g = Hq / H (as torch's ``enable_gqa``).
        return_lse: also return the log-sum-exp of each query's scores.

    Differentiable: the forward keeps only the output O and the log-sum-exp; the backward
    (``flash_attention_backward``) recomputes P tile by tile from them and never forms an
    L x S matrix either.

    Returns:
        (..., L, Ev) output in q's dtype. Half-precision inputs: each tile is upcast and
        computed in float32 (scaled q, scores, softmax statistics, P @ V and the running output),
        and the output is rounded to q's dtype once, at the end; a GPU kernel keeps the same
        float32 accumulators while feeding its tensor cores half-precision tiles. A query that sees
        no key gets a zero output. With ``return_lse``, also
        (..., L) lse = log sum_j exp(s_ij) (natural log; -inf for a query that sees no key),
        in float32 for half inputs.

    Raises:
        ValueError: on shapes that do not fit, or a bad block size or window.

    Taught in notebook 08, "FlashAttention's idea: tiles".
    """
    tiles = _tiles(q, k, v, is_causal, block_size, scale, window, enable_gqa)
    L, Ev = q.shape[-2], v.shape[-1]
    if enable_gqa and q.shape[-3] != k.shape[-3]:       # autograd sums dK, dV over each group
        k, v = _repeat_kv(q, k), _repeat_kv(q, v)       # (..., Hq, S, E)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q3, k3, v3 = _flatten(q, batch), _flatten(k, batch), _flatten(v, batch)   # (N, L, E), (N, S, E), (N, S, Ev)
    out, lse2 = _FlashAttention.apply(q3, k3, v3, tiles)   # (N, L, Ev), (N, L, 1) base-2 lse
    out = out.reshape(*batch, L, Ev)
    if return_lse:
        return out, (lse2 / LOG2_E).reshape(*batch, L)   # log2 -> natural log
    return out


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, tiles: tuple) -> tuple[Tensor, Tensor]:
    """The tiled forward on (N, L, E), (N, S, E), (N, S, Ev): output (N, L, Ev) and base-2 lse (N, L, 1)."""
    scale, block_q, block_k, below, above, compute = tiles
    N, L, Ev = q.shape[0], q.shape[1], v.shape[-1]
    out = torch.empty(N, L, Ev, dtype=q.dtype, device=q.device)       # (N, L, Ev)
    lse2 = torch.empty(N, L, 1, dtype=compute, device=q.device)      # (N, L, 1)
    for q0 in range(0, L, block_q):
        q_block = q[:, q0:q0 + block_q].to(compute) * (scale * LOG2_E)   # (N, Bq, E): scaled once, base 2
        out[:, q0:q0 + block_q], lse2[:, q0:q0 + block_q] = _attend_query_block(
            q_block, k, v, q0, block_k, below, above, compute)
    return out, lse2


def flash_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
                             is_causal: bool = False, block_size=None, scale: float | None = None,
                             window: int | None = None, enable_gqa: bool = False,
                             grad_lse: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention's backward: dQ, dK, dV tile by tile, P recomputed from the log-sum-exp.

    The forward kept only O and lse; any tile of P comes back as P_tile = exp(S_tile - lse).
    The softmax Jacobian's row term rowsum(dP * P) equals D = rowsum(dO * O) (because O = P V,
    rowsum(dP * P) = rowsum((dO V^T) * P) = rowsum(dO * (P V))), an (L,) vector computed once.
    Then, for every tile (query block i, key block j) the forward computed:

        P_ij = exp(S_ij - lse_i)          S_ij = scale Q_i K_j^T (+ mask)
        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T
        dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += scale dS_ij K_j
        dK_j += scale dS_ij^T Q_i

    Peak extra memory: a few (N, block_q, block_k) tiles, never (N, L, S). Tiles the forward
    skipped (causal, window) are skipped here too. The order is the package's for every backward:
    the forward's inputs, then what it saved, then the incoming gradient.

    Args:
        q: (..., L, E), k: (..., S, E), v: (..., S, Ev): the forward's inputs.
        out: (..., L, Ev) and lse: (..., L) natural-log log-sum-exp, what
            ``flash_attention(q, k, v, return_lse=True)`` returned.
        grad_out: (..., L, Ev), the gradient with respect to out.
        is_causal, block_size, scale, window, enable_gqa: as given to ``flash_attention``.
        grad_lse: optional (..., L) gradient with respect to lse (d lse / d S = P, so it adds
            P * grad_lse to dS).

    Returns:
        (dq, dk, dv) shaped and typed like q, k, v.

    Taught in notebook 11, "FlashAttention's backward".
    """
    tiles = _tiles(q, k, v, is_causal, block_size, scale, window, enable_gqa)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    _check_saved(q, k, v, out, lse, grad_out, grad_lse, enable_gqa)
    k_all, v_all = (_repeat_kv(q, k), _repeat_kv(q, v)) if enable_gqa and q.shape[-3] != k.shape[-3] else (k, v)
    batch = torch.broadcast_shapes(q.shape[:-2], k_all.shape[:-2])
    lse2 = (lse.to(tiles[-1]) * LOG2_E).unsqueeze(-1)                  # (..., L, 1): base 2, as the tiles use
    grad_lse = None if grad_lse is None else grad_lse.unsqueeze(-1)
    dq, dk, dv = _flash_backward(_flatten(q, batch), _flatten(k_all, batch), _flatten(v_all, batch),
                                 _flatten(out, batch), _flatten(lse2, batch), _flatten(grad_out, batch), tiles,
                                 None if grad_lse is None else _flatten(grad_lse, batch))
    dq, dk, dv = dq.reshape(*batch, L, E), dk.reshape(*batch, S, E), dv.reshape(*batch, S, Ev)
    if k_all is not k:                                                 # each K/V head served a group of query heads
        dk, dv = _sum_groups(dk, k), _sum_groups(dv, v)
    return dq.sum_to_size(q.shape), dk.sum_to_size(k.shape), dv.sum_to_size(v.shape)


def _check_saved(q, k, v, out, lse, grad_out, grad_lse, enable_gqa) -> None:
    """out, grad_out (..., L, Ev) and lse, grad_lse (..., L) fit the forward's q, k, v."""
    q_lead, k_lead = q.shape[:-2], k.shape[:-2]
    if enable_gqa:
        k_lead = (*k_lead[:-1], q_lead[-1])
    batch = torch.broadcast_shapes(q_lead, k_lead)
    inputs = f"q {shape_str(q)}, v {shape_str(v)}"
    for name, t, shape in (("out", out, (*batch, q.shape[-2], v.shape[-1])), ("lse", lse, (*batch, q.shape[-2])),
                           ("grad_out", grad_out, (*batch, q.shape[-2], v.shape[-1])),
                           ("grad_lse", grad_lse, (*batch, q.shape[-2]))):
        if t is None and name == "grad_lse":
            continue
        check_tensor(name, t, floating=True)
        check_shape(name, t, shape, against=inputs)
    check_same_dtype(q=q, out=out, grad_out=grad_out)


def _flash_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse2: Tensor, grad_out: Tensor,
                    tiles: tuple, grad_lse: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``flash_attention_backward`` on (N, L, E), (N, S, E), (N, S, Ev), a base-2 lse2 (N, L, 1) and the
    tile tuple (scale, block_q, block_k, below, above, compute dtype) of the forward."""
    scale, block_q, block_k, below, above, compute = tiles
    L, S = q.shape[1], k.shape[1]
    dq = torch.zeros(q.shape, dtype=compute, device=q.device)        # (N, L, E)
    dk = torch.zeros(k.shape, dtype=compute, device=q.device)        # (N, S, E)
    dv = torch.zeros(v.shape, dtype=compute, device=q.device)        # (N, S, Ev)
    do = grad_out.to(compute)
    D = (do * out.to(compute)).sum(dim=-1, keepdim=True)             # (N, L, 1) = rowsum(dP * P)
    if grad_lse is not None:
        D = D - grad_lse.to(compute)
    lse2 = lse2.masked_fill(lse2 == float("-inf"), float("inf"))    # a row that saw no key: P = 2^(-inf) = 0
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        q_i = q[:, q0:q1].to(compute)                                 # (N, Bq, E)
        q_scaled = q_i * (scale * LOG2_E)                             # base 2, as in the forward
        do_i, D_i, lse_i = do[:, q0:q1], D[:, q0:q1], lse2[:, q0:q1]
        for k0 in range(0, S, block_k):
            k1 = min(k0 + block_k, S)
            kind = tile_kind(q0, q1, k0, k1, below, above)
            if kind == SKIP:
                continue
            if kind == PARTIAL:                                       # the same trim as the forward
                k0, k1 = max(k0, q0 - below), min(k1, q1 - 1 + above + 1)
                kind = tile_kind(q0, q1, k0, k1, below, above)
            k_j, v_j = k[:, k0:k1].to(compute), v[:, k0:k1].to(compute)   # (N, Bk, E), (N, Bk, Ev)
            p = torch.bmm(q_scaled, k_j.transpose(1, 2)).sub_(lse_i).exp2_()   # (N, Bq, Bk) P recomputed
            if kind == PARTIAL:
                p.masked_fill_(~_band_mask(q0, q1, k0, k1, below, above, q.device), 0.0)
            dv[:, k0:k1].baddbmm_(p.transpose(1, 2), do_i)            # dV_j += P^T dO_i
            dp = torch.bmm(do_i, v_j.transpose(1, 2))                 # (N, Bq, Bk) dP = dO_i V_j^T
            ds = dp.sub_(D_i).mul_(p)                                 # dS = P * (dP - D_i), in place
            dq[:, q0:q1].baddbmm_(ds, k_j)                            # dQ_i += dS K_j
            dk[:, k0:k1].baddbmm_(ds.transpose(1, 2), q_i)            # dK_j += dS^T Q_i
    return (dq.mul_(scale).to(q.dtype), dk.mul_(scale).to(k.dtype), dv.to(v.dtype))


class _FlashAttention(torch.autograd.Function):
    """flash_attention as an autograd op: saves (q, k, v, O, lse), never P."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, tiles: tuple):
        out, lse2 = _flash_forward(q, k, v, tiles)
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.tiles = tiles
        return out, lse2

    @staticmethod
    def backward(ctx, grad_out: Tensor, grad_lse2: Tensor):
        q, k, v, out, lse2 = ctx.saved_tensors
        # lse2 = lse / ln 2 was returned; the caller's natural-log lse = lse2 * ln 2 = lse2 / LOG2_E
        grad_lse = None if grad_lse2 is None else grad_lse2 * LOG2_E
        dq, dk, dv = _flash_backward(q, k, v, out, lse2, grad_out, ctx.tiles, grad_lse)
        return dq, dk, dv, None


def _tiles(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, block_size, scale, window, enable_gqa) -> tuple:
    """Check q, k, v and the options; the tile tuple (scale, block_q, block_k, below, above, compute dtype)."""
    check_qkv(q, k, v, enable_gqa=enable_gqa, names=("q", "k", "v"))
    check_bool("is_causal", is_causal)
    scale = check_scale(scale)
    block_q, block_k = _block_sizes(default_block_size(q.device) if block_size is None else block_size)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if L == 0 or S == 0:
        raise ValueError(f"flash_attention needs at least one query and one key, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    below, above = _band(L, S, is_causal, window)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    return scale, block_q, block_k, below, above, upcast_dtype(q.dtype)


def _repeat_kv(q: Tensor, kv: Tensor) -> Tensor:
    """(..., H, S, E) -> (..., Hq, S, E): K/V head j repeated for its g = Hq / H query heads."""
    return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)


def _sum_groups(grad: Tensor, kv: Tensor) -> Tensor:
    """(..., Hq, S, E) -> (..., H, S, E): the gradients of the g query heads one K/V head served, summed."""
    H = kv.shape[-3]
    return grad.unflatten(-3, (H, grad.shape[-3] // H)).sum(-3)


def _flatten(t: Tensor, batch: torch.Size) -> Tensor:
    """(..., T, E) broadcast to (*batch, T, E), then (N, T, E) with N = product of the batch dims."""
    return t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])


# ---------------------------------------------------------------------------------------------
# Sliding-window (local) attention
# ---------------------------------------------------------------------------------------------

def sliding_window_mask(L: int, window: int, S: int | None = None, *, is_causal: bool = True,
                        device=None) -> Tensor:
    """Boolean (L, S) mask, True = may attend: |i - j| < window, and j <= i when causal.

    Causal: query i sees keys i - window + 1 .. i (``window`` keys, itself included), as in
    Mistral-style local attention. Not causal: ``window - 1`` keys on each side and itself.

    Taught in notebook 08, "Sliding-window (local) attention".
    """
    L = check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    below, above = _band(L, S, is_causal, check_positive_int("window", window))
    return _band_mask(0, L, 0, S, below, above, device)


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, is_causal: bool = True,
                             block_size=None, scale: float | None = None) -> Tensor:
    """Attention restricted to a band of width ``window``, tiled so the cost is O(n * window).

    Equals ``F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(L, window, S))``,
    but only the tiles that meet the band are computed (see ``tile_plan``).

    Args:
        q: (..., L, E), k: (..., S, E), v: (..., S, Ev). window: keys seen per query (causal).

    Returns:
        (..., L, Ev).

    Taught in notebook 08, "Sliding-window (local) attention".
    """
    return flash_attention(q, k, v, is_causal=is_causal, block_size=block_size, scale=scale,
                           window=check_positive_int("window", window))


# ---------------------------------------------------------------------------------------------
# Linear attention
# ---------------------------------------------------------------------------------------------

def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1: positive features (Katharopoulos et al., 2020).

    Taught in notebook 08, "Linear attention".
    """
    check_tensor("x", x, floating=True)
    return F.elu(x) + 1.0


def random_feature_map(x: Tensor, projection: Tensor) -> Tensor:
    """Positive random features whose dot products estimate exp(q . k / sqrt(dk)).

    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) with x' = x / dk^(1/4) and W (m, dk) Gaussian
    rows (Performer's FAVOR+, Choromanski et al., 2021): E[phi(q) . phi(k)] = exp(q . k / sqrt(dk)),
    so linear attention with these features approaches softmax attention as m grows.

    Args:
        x: (..., n, dk). projection: (m, dk) rows drawn from N(0, I).

    Returns:
        (..., n, m) features.

    Taught in notebook 08, "Linear attention".
    """
    check_tensor("x", x, floating=True)
    if x.dim() < 1:
        raise ValueError("x must have at least 1 dim (..., n, dk), got a 0-dim tensor")
    if not isinstance(projection, Tensor) or projection.dim() != 2 or projection.shape[1] != x.shape[-1]:
        shape = shape_str(projection) if isinstance(projection, Tensor) else type(projection).__name__
        raise ValueError(f"projection must be (m, dk) with dk = {x.shape[-1]} (x is {shape_str(x)}), got {shape}")
    check_tensor("projection", projection, floating=True)
    check_same_dtype(x=x, projection=projection)
    x = x / x.shape[-1] ** 0.25
    wx = x @ projection.T                                         # (..., n, m)
    return torch.exp(wx - (x * x).sum(dim=-1, keepdim=True) / 2) / math.sqrt(projection.shape[0])


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
                     is_causal: bool = False, chunk_size: int = 128, eps: float = 1e-6) -> Tensor:
    """Attention with the kernel phi(q) . phi(k) in place of exp(q . k / sqrt(dk)): O(n) cost.

        out_i = phi(q_i) (sum_j phi(k_j)^T v_j) / (phi(q_i) . sum_j phi(k_j))

    Not causal: the two sums over keys are computed once, a (m, Ev) matrix and an (m,)
    vector, and every query reads them. Causal (j <= i): the sums become running sums,
    carried from chunk to chunk as a fixed-size state; inside a chunk of ``chunk_size``
    queries a small masked (C, C) product adds the keys of the chunk itself. Either way the
    cost grows like n, not n^2. It is *not* softmax attention: how close it comes depends on
    how well phi(q) . phi(k) matches exp(q . k / sqrt(dk)).

    Args:
        q: (..., L, E), k: (..., S, E), v: (..., S, Ev).
        feature_map: (..., n, E) -> (..., n, m), non-negative (default elu + 1).
        is_causal: query i sums over keys j <= i (needs L = S).
        chunk_size: queries per chunk in the causal case.

    Returns:
        (..., L, Ev).

    Taught in notebook 08, "Linear attention".
    """
    check_qkv(q, k, v, enable_gqa=None, names=("q", "k", "v"))
    check_bool("is_causal", is_causal)
    check_real("eps", eps, low=0)
    if not callable(feature_map):
        raise ValueError(f"feature_map must be a function (..., n, E) -> (..., n, m), got {type(feature_map).__name__}")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs as many queries as keys, "
                         f"got q {shape_str(q)}, k {shape_str(k)}")
    check_positive_int("chunk_size", chunk_size)
    phi_q, phi_k = feature_map(q), feature_map(k)                 # (..., L, m), (..., S, m)
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(f"feature_map gave {phi_q.shape[-1]} features for q and {phi_k.shape[-1]} for k")
    if not is_causal:
        kv = phi_k.transpose(-2, -1) @ v                                     # (..., m, Ev) one summary
        z = phi_k.sum(dim=-2, keepdim=True)                                  # (..., 1, m)
        return (phi_q @ kv) / ((phi_q * z).sum(dim=-1, keepdim=True) + eps)  # (..., L, Ev)

    batch = torch.broadcast_shapes(phi_q.shape[:-2], phi_k.shape[:-2])
    m, Ev = phi_k.shape[-1], v.shape[-1]
    kv = torch.zeros(*batch, m, Ev, dtype=v.dtype, device=v.device)         # state: sum phi(k)^T v so far
    z = torch.zeros(*batch, 1, m, dtype=v.dtype, device=v.device)           # state: sum phi(k) so far
    outs = []
    for c0 in range(0, q.shape[-2], chunk_size):
        pq, pk = phi_q[..., c0:c0 + chunk_size, :], phi_k[..., c0:c0 + chunk_size, :]   # (..., C, m)
        vc = v[..., c0:c0 + chunk_size, :]                                   # (..., C, Ev)
        a = (pq @ pk.transpose(-2, -1)).tril()                               # (..., C, C) within the chunk
        num = pq @ kv + a @ vc                                               # (..., C, Ev)
        den = (pq * z).sum(dim=-1, keepdim=True) + a.sum(dim=-1, keepdim=True)  # (..., C, 1)
        outs.append(num / (den + eps))
        kv = kv + pk.transpose(-2, -1) @ vc                                  # carry the state forward
        z = z + pk.sum(dim=-2, keepdim=True)
    return torch.cat(outs, dim=-2)                                           # (..., L, Ev)


def linear_attention_step(state: tuple[Tensor, Tensor] | None, q: Tensor, k: Tensor, v: Tensor, *,
                          feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
                          eps: float = 1e-6) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One decoding step of causal linear attention: a fixed-size state instead of a cache.

    The state is (kv, z) = (sum_j phi(k_j)^T v_j, sum_j phi(k_j)): (..., m, Ev) and (..., m),
    the same size after 10 tokens or 10 million. A KV cache instead grows by one key and one
    value per token.

    Args:
        state: (kv, z) from the previous step, or None at the start.
        q, k: (..., E), v: (..., Ev) the new token's query, key and value.

    Returns:
        output (..., Ev) and the new state.

    Taught in notebook 08, "A fixed-size state versus a growing cache".
    """
    _check_step(q, k, v)
    phi_q, phi_k = feature_map(q), feature_map(k)                 # (..., m)
    if state is not None:
        lead, m, Ev = tuple(q.shape[:-1]), phi_k.shape[-1], v.shape[-1]
        if not isinstance(state, tuple | list) or len(state) != 2:
            raise ValueError(f"state must be None or the pair (kv, z) of the previous step, got {type(state).__name__}")
        check_tensor("state kv", state[0], floating=True)
        check_tensor("state z", state[1], floating=True)
        check_shape("state kv", state[0], (*lead, m, Ev), layout="(..., m, Ev)",
                    against=f"q {shape_str(q)}, v {shape_str(v)}")
        check_shape("state z", state[1], (*lead, m), layout="(..., m)", against=f"q {shape_str(q)}")
        check_same_dtype(v=v, **{"state kv": state[0], "state z": state[1]})
    if state is None:
        kv = torch.zeros(*phi_k.shape, v.shape[-1], dtype=v.dtype, device=v.device)
        z = torch.zeros_like(phi_k)
    else:
        kv, z = state
    kv = kv + phi_k.unsqueeze(-1) * v.unsqueeze(-2)               # (..., m, Ev)
    z = z + phi_k                                                 # (..., m)
    out = (phi_q.unsqueeze(-2) @ kv).squeeze(-2) / ((phi_q * z).sum(-1, keepdim=True) + eps)
    return out, (kv, z)


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_step(q, k, v) -> None:
    """One token's q, k (..., E) and v (..., Ev): floating, one dtype, the same leading dims."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() < 1:
            raise ValueError(f"{name} must have at least 1 dim (..., E), got a 0-dim tensor")
    check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {shape_str(q)} and k {shape_str(k)} must share the last dim E")
    if not (q.shape[:-1] == k.shape[:-1] == v.shape[:-1]):
        raise ValueError(f"q, k and v must agree in every dim but the last, got q {shape_str(q)}, "
                         f"k {shape_str(k)}, v {shape_str(v)}")


def _block_sizes(block_size) -> tuple[int, int]:
    """block_size: an int (square tiles) or a pair (block_q, block_k)."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(f"block_size must be an int or a pair (block_q, block_k), got {block_size!r}")
        return check_positive_int("block_q", block_size[0]), check_positive_int("block_k", block_size[1])
    size = check_positive_int("block_size", block_size)
    return size, size
