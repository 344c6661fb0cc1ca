"""Checkers for notebook 08: merging online-softmax statistics, counting tiles, a sliding-window
mask, causal linear attention as a recurrence, and the causal tiled loop itself."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_stats", "check_tile_count", "check_window_mask", "check_causal_linear_attention",
           "check_causal_tiled"]


def _merge_reference(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, l1 * torch.exp(m1 - safe) + l2 * torch.exp(m2 - safe)


def check_merge_stats(fn) -> None:
    """``fn(m1, l1, m2, l2) -> (m, l)``: the running max and sum of two chunks of a score row.

    (m_c, l_c) are max(x_c) and sum(exp(x_c - m_c)) of chunk c; (m, l) must be those of both
    chunks together. Tensors of shape (R,), one entry per row.
    """
    gen = torch.Generator().manual_seed(8)
    x1, x2 = torch.randn(6, 4, generator=gen), torch.randn(6, 5, generator=gen)
    x2[:3] += 10.0                   # rows 0-2: chunk 2 has the larger max; rows 3-5: chunk 1 has it
    x1[3:] += 10.0
    m1, m2 = x1.amax(-1), x2.amax(-1)
    l1, l2 = torch.exp(x1 - m1[:, None]).sum(-1), torch.exp(x2 - m2[:, None]).sum(-1)
    try:
        result = attempt(fn, m1.clone(), l1.clone(), m2.clone(), l2.clone())
    except NotAttempted:
        return not_attempted("merge_stats")
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseError("return a pair (m, l)")
    m, l = (require_tensor(name, t, (6,)) for name, t in zip(("m", "l"), result, strict=True))
    whole = torch.cat([x1, x2], dim=-1)
    want_m, want_l = whole.amax(-1), torch.exp(whole - whole.amax(-1, keepdim=True)).sum(-1)
    if close(m, torch.minimum(m1, m2)):
        raise ExerciseError("m is the smaller of the two maxima: the running max is max(m1, m2)")
    if not close(m, want_m):
        raise ExerciseError("m should be the max of the whole row, max(m1, m2)")
    if close(l, l1 + l2):
        raise ExerciseError("l = l1 + l2 adds sums taken against different maxima: rescale each by "
                            "exp(m_c - m) first")
    if close(l[:3], want_l[:3]) != close(l[3:], want_l[3:]):
        raise ExerciseError("right only when one particular chunk holds the max: rescale *both* sums, "
                            "l = l1 * exp(m1 - m) + l2 * exp(m2 - m)")
    if close(l, l1 * torch.exp(m - m1) + l2 * torch.exp(m - m2)):
        raise ExerciseError("the rescale factor is upside down: exp(m_c - m) (<= 1), not exp(m - m_c)")
    if not close(l, want_l):
        raise ExerciseError("l should equal sum(exp(x - m)) over both chunks: l1 * exp(m1 - m) + l2 * exp(m2 - m)")
    # an empty chunk (no key yet: m = -inf, l = 0) must leave the other unchanged, without NaN
    ninf = torch.full((6,), float("-inf"))
    m_e, l_e = attempt(fn, ninf, torch.zeros(6), m2.clone(), l2.clone())
    if not (torch.isfinite(torch.as_tensor(l_e)).all() and close(m_e, m2) and close(l_e, l2)):
        raise ExerciseError("merging with an empty chunk (m1 = -inf, l1 = 0) should give (m2, l2); yours gives "
                            "NaN or changes it. exp(-inf - m) is 0 as long as m is finite")
    return passed("(m, l) of two chunks merged exactly: l = l1·exp(m1 − m) + l2·exp(m2 − m)")


def _tiles(n: int, block: int, is_causal: bool) -> int:
    t = math.ceil(n / block)
    return t * (t + 1) // 2 if is_causal else t * t


def check_tile_count(fn) -> None:
    """``fn(n, block_size, is_causal) -> int``: tiles a tiled kernel computes for n queries = n keys."""
    cases = [(16, 4, False), (16, 4, True), (10, 4, False), (10, 4, True), (4096, 512, True), (1000, 128, True),
             (5, 8, True)]
    try:
        attempt(fn, 16, 4, False)
    except NotAttempted:
        return not_attempted("tiles_computed")
    for n, block, causal in cases:
        got = attempt(fn, n, block, causal)
        if isinstance(got, torch.Tensor):
            got = got.item()
        want = _tiles(n, block, causal)
        if got == want:
            continue
        floor_t = n // block
        if causal and got == _tiles(n, block, False):
            raise ExerciseError(f"n={n}, block={block}, causal: you counted every tile ({got}); tiles entirely above "
                                "the diagonal are skipped")
        if got in (floor_t * floor_t, floor_t * (floor_t + 1) // 2) and n % block:
            raise ExerciseError(f"n={n}, block={block}: the last, partial tile is missing; there are "
                                f"ceil(n / block) = {math.ceil(n / block)} tiles per side, not n // block")
        t = math.ceil(n / block)
        if causal and got in (t * t // 2, t * (t - 1) // 2):
            raise ExerciseError(f"n={n}, block={block}, causal: {got} leaves out the diagonal tiles; they are "
                                "computed (with a mask): T(T+1)/2 for T tiles per side")
        raise ExerciseError(f"n={n}, block={block}, is_causal={causal}: expected {want} tiles, got {got}")
    return passed("T = ceil(n / block) tiles per side: T² in all, T(T+1)/2 when causal")


def check_window_mask(fn) -> None:
    """``fn(n, window) -> (n, n) bool``: causal sliding window, True = may attend, ``window`` keys each."""
    try:
        got = attempt(fn, 7, 3)
    except NotAttempted:
        return not_attempted("window_mask")
    got = require_tensor("window_mask(7, 3)", got, (7, 7))
    i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
    want = (j <= i) & (i - j < 3)
    if got.dtype != torch.bool:
        raise ExerciseError(f"return a bool mask (True = may attend), got dtype {got.dtype}")
    if torch.equal(got, ~want):
        raise ExerciseError("polarity is flipped: True must mean 'may attend' (torch SDPA's convention)")
    if torch.equal(got, (j <= i) & (i - j <= 3)):
        raise ExerciseError("each query sees window + 1 keys: use i - j < window (itself and window - 1 before it)")
    if torch.equal(got, (j <= i) & (i - j < 2)):
        raise ExerciseError("each query sees window - 1 keys: query i sees keys i - window + 1 .. i")
    if torch.equal(got, (i - j).abs() < 3):
        raise ExerciseError("your window looks ahead too: a causal window also needs j <= i")
    if torch.equal(got, j <= i):
        raise ExerciseError("that is the plain causal mask: also drop keys window or more positions back")
    if not torch.equal(got, want):
        raise ExerciseError(f"expected query i to see keys i-2..i for window=3; row 5 should be "
                            f"{want[5].int().tolist()}, yours is {got[5].int().tolist()}")
    if not torch.equal(attempt(fn, 12, 5), (torch.arange(12)[None] <= torch.arange(12)[:, None])
                       & (torch.arange(12)[:, None] - torch.arange(12)[None] < 5)):
        raise ExerciseError("right for window_mask(7, 3) but not for window_mask(12, 5): use n and window")
    return passed("a causal sliding window: query i sees keys i − window + 1 .. i")


def _phi(x):
    return F.elu(x) + 1


def _linear_quadratic(q, k, v, is_causal):
    """Linear attention the n x n way: (phi(Q) phi(K)^T, lower triangle when causal) V / row sums."""
    a = _phi(q) @ _phi(k).transpose(-2, -1)                   # (B, n, n)
    if is_causal:
        a = a.tril()
    return (a @ v) / a.sum(-1, keepdim=True)


def check_causal_linear_attention(fn) -> None:
    """``fn(q, k, v) -> (B, n, dv)``: causal linear attention, phi(x) = elu(x) + 1, as a recurrence.

    out_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i = sum_{j <= i} phi(k_j) v_j^T and
    z_i = sum_{j <= i} phi(k_j): a state of fixed size carried along the sequence, no n x n matrix
    (checked by counting the matmul FLOPs at n = 256).
    """
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 9, 4, generator=gen), torch.randn(2, 9, 4, generator=gen)
    v = torch.randn(2, 9, 3, generator=gen)
    try:
        out = attempt(fn, q, k, v)
    except NotAttempted:
        return not_attempted("causal_linear_attn")
    out = require_tensor("causal_linear_attn(q, k, v)", out, (2, 9, 3))
    want = _linear_quadratic(q, k, v, True)
    if close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-4):
        raise ExerciseError("that is softmax attention; use the feature map phi(x) = elu(x) + 1 instead of exp")
    if close(out, _linear_quadratic(q, k, v, False), atol=1e-4):
        raise ExerciseError("every output uses every key: that is the non-causal form. Token i may see keys 0..i: "
                            "read the state after adding token i, never the total over the sequence")
    a = (_phi(q) @ _phi(k).transpose(-2, -1)).tril(-1)
    if close(out[:, 1:], ((a @ v) / a.sum(-1, keepdim=True))[:, 1:], atol=1e-4):
        raise ExerciseError("token i does not see its own key: add phi(k_i) v_i^T to the state before reading it")
    if close(out, (_phi(q) @ _phi(k).transpose(-2, -1)).tril() @ v, atol=1e-4):
        raise ExerciseError("the normaliser is missing: divide by phi(q_i) . z_i, z_i = sum_{j <= i} phi(k_j)")
    if not close(out, want, atol=1e-4):
        raise ExerciseError("expected out_i = phi(q_i)^T S_i / phi(q_i)^T z_i, S_i = sum_{j<=i} phi(k_j) v_j^T, "
                            "z_i = sum_{j<=i} phi(k_j), with phi = elu + 1")
    from torch.utils.flop_counter import FlopCounterMode

    n, m = 256, 16
    big = [torch.randn(1, n, m, generator=gen) for _ in range(3)]
    with FlopCounterMode(display=False) as counter:
        fn(*big)
    if counter.get_total_flops() >= n * n * m:
        raise ExerciseError(f"{counter.get_total_flops():,} matmul FLOPs at n = {n}: your code forms the n x n matrix "
                            "phi(Q) phi(K)^T. Carry the state S (m x dv) and z (m) along the sequence instead")
    return passed("a state S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) carried token by token: causal, and no n × n matrix")


def _causal_reference(q, k, v):
    """Causal softmax attention in float64, returned in q's dtype."""
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    return out.to(q.dtype)


def _matmul_flops(fn, *args) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def check_causal_tiled(fn, peak_memory=None) -> None:
    """``fn(q, k, v, block_size) -> out``: causal attention by tiles with an online softmax.

    q, k, v (B, h, n, d); square tiles of ``block_size`` queries x ``block_size`` keys, the tiles
    above the diagonal skipped. Graded beyond the output: the same answer at every block size
    (block sizes that do not divide n included), stable at scores of about 1e4, no work on
    the skipped tiles (matmul FLOPs counted), and, when ``peak_memory`` (the course's
    ``memory.peak_memory``) is given, a peak memory well below that of the n x n scores.
    """
    gen = torch.Generator().manual_seed(80)
    q, k, v = (torch.randn(2, 3, 19, 8, generator=gen) for _ in range(3))
    try:
        out = attempt(fn, q, k, v, 4)
    except NotAttempted:
        return not_attempted("causal_tiled_attention")
    out = require_tensor("the output", out, q.shape)
    want = _causal_reference(q, k, v)
    if close(out, F.scaled_dot_product_attention(q, k, v)):
        raise ExerciseError("the output is non-causal attention: mask the keys j > i inside the tiles that "
                            "straddle the diagonal (and skip the tiles above it)")
    if close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)):
        raise ExerciseError("the scores are not scaled: divide q k^T by sqrt(d)")
    one_tile = attempt(fn, q, k, v, 19)          # one tile holds every row: no running statistics needed
    by_row = attempt(fn, q, k, v, 1)             # 1 x 1 tiles: none straddles the diagonal
    if not close(one_tile, want):
        if close(by_row, want):
            raise ExerciseError("right with 1 x 1 tiles, wrong when a tile straddles the diagonal: inside such a "
                                "tile, mask the keys j > i before the softmax")
        raise ExerciseError("wrong even with block_size = n (one tile): check the scores, the causal mask "
                            "and the division by the row sum")
    for block in (1, 2, 3, 4, 5, 8, 16, 32):
        got = attempt(fn, q, k, v, block)
        if not close(got, want):
            raise ExerciseError(f"right with one tile but wrong with block_size={block}: when a new tile raises a "
                                "row's max m, rescale the running sum l and the accumulator by exp(m_old - m_new) "
                                "before adding the tile's part (and divide by l only at the end)")
    big_q, big_k = 100 * q, 100 * k              # scores q k^T / sqrt(d) of order 1e4
    big = attempt(fn, big_q, big_k, v, 4)
    if not torch.isfinite(torch.as_tensor(big)).all():
        raise ExerciseError("NaN or inf when the scores are about 1e4: exp(1e4) overflows. Subtract the running "
                            "max m before exponentiating: exp(s - m), with m updated tile by tile")
    if not close(big, _causal_reference(big_q, big_k, v), atol=1e-4, rtol=1e-3):
        raise ExerciseError("inaccurate when the scores are about 1e4: subtract the running max before exp "
                            "and rescale by exp(m_old - m_new), never by exp(m_new - m_old)")
    # the work: 64 queries and keys in tiles of 8 -> 36 of the 64 tiles are at or below the diagonal
    small = [torch.randn(1, 1, 64, 16, generator=gen) for _ in range(3)]
    flops = _matmul_flops(fn, *small, 8)
    per_tile = 2 * 2 * 8 * 8 * 16                # q k^T and p v, one multiply-add = 2 FLOPs
    if flops > 1.05 * 36 * per_tile:
        raise ExerciseError(f"your loop computes {flops / per_tile:.0f} tiles' worth of matmuls where 36 of 64 are "
                            "needed: stop the key loop at the query block's last row (k0 < q0 + block_size), the "
                            "tiles after it are entirely masked")
    message = ("the same causal attention at every block size, stable at scores of 1e4, "
               "the 28 masked tiles of 64 skipped")
    if peak_memory is not None:
        n, block = 512, 64
        large = [torch.randn(1, 2, n, 16, generator=gen) for _ in range(3)]
        scores_bytes = 1 * 2 * n * n * 4
        peak = peak_memory(lambda: fn(*large, block))
        if peak >= scores_bytes / 4:
            raise ExerciseError(f"peak memory {peak / 2**20:.1f} MiB at n = {n}, against "
                                f"{scores_bytes / 2**20:.0f} MiB for the n x n scores: some step forms a matrix as "
                                "large as the scores (a full mask, a full score row, or all tiles kept until the "
                                "end); keep one tile at a time")
        message += f", peak memory under a quarter of the n x n scores at n = {n}"
    return passed(message)

