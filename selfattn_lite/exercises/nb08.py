"""Checkers for notebook 08: merging online-softmax statistics, counting tiles, a sliding-window
mask, and linear attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_stats", "check_tile_count", "check_window_mask", "check_linear_attention"]


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


def check_linear_attention(fn) -> None:
    """``fn(q, k, v) -> (..., L, Ev)``: non-causal linear attention with phi(x) = elu(x) + 1."""
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 5, 4, generator=gen), torch.randn(2, 7, 4, generator=gen)
    v = torch.randn(2, 7, 3, generator=gen)
    try:
        out = attempt(fn, q, k, v)
    except NotAttempted:
        return not_attempted("linear_attn")
    out = require_tensor("linear_attn(q, k, v)", out, (2, 5, 3))
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    num = phi(q) @ (phi(k).transpose(-2, -1) @ v)
    den = phi(q) @ phi(k).sum(-2, keepdim=True).transpose(-2, -1)
    if close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-4):
        raise ExerciseError("that is softmax attention; use the feature map phi(x) = elu(x) + 1 instead of exp")
    if close(out, num, atol=1e-4):
        raise ExerciseError("the normaliser is missing: divide by phi(q) . sum_j phi(k_j) so the weights sum to 1")
    relu = torch.relu(q) @ (torch.relu(k).transpose(-2, -1) @ v)
    relu = relu / (torch.relu(q) @ torch.relu(k).sum(-2, keepdim=True).transpose(-2, -1) + 1e-6)
    if close(out, relu, atol=1e-4):
        raise ExerciseError("phi is relu; use elu(x) + 1, which is positive everywhere (relu can give 0 / 0)")
    if close(out, phi(q) @ (phi(k).transpose(-2, -1) @ v) / (phi(q).sum(-1, keepdim=True)), atol=1e-4):
        raise ExerciseError("the normaliser is phi(q_i) . sum_j phi(k_j), a dot product with the summed key features")
    if not close(out, num / den, atol=1e-4):
        raise ExerciseError("expected phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(k_j)) with phi = elu + 1")
    return passed("phi(Q) (phi(K)ᵀ V) / (phi(Q) Σ phi(k)): the n × n matrix is never formed")
