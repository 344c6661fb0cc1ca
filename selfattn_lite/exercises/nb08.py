"""Checkers for notebook 08: the causal tiled loop (lesson 1); the tiles of a sliding-window kernel and causal
linear attention, as a recurrence or chunk by chunk (lesson 2)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_causal_tiled", "check_window_tiles", "check_causal_linear_attention",
           "check_chunked_linear_attention"]


def _window_tiles(n: int, window: int, block: int, *, causal: bool = True) -> int:
    """Tiles (square, of ``block``) holding at least one pair 0 <= i - j < window; |i - j| < window if not causal."""
    t = math.ceil(n / block)
    count = 0
    for a in range(t):
        r0, r1 = a * block, min(a * block + block, n) - 1
        for b in range(t):
            c0, c1 = b * block, min(b * block + block, n) - 1
            ahead = 0 if causal else window - 1           # how far after its query a key may be
            if c0 - r1 <= ahead and r0 - c1 < window:
                count += 1
    return count


_sdpa = F.scaled_dot_product_attention      # the checkers' own reference, whatever is switched off


@contextlib.contextmanager
def _switched_off(names: tuple[str, ...], why: str, *, sdpa: bool = False):
    """Replace ``efficient.<name>`` for each name (and, with ``sdpa``, torch's
    ``F.scaled_dot_product_attention``) by a function that raises ``ExerciseError(why)``; restore after."""
    from .. import efficient

    def off(*args, **kwargs):
        raise ExerciseError(why)

    targets = [(efficient, name) for name in names] + ([(F, "scaled_dot_product_attention")] if sdpa else [])
    saved = [(module, name, getattr(module, name)) for module, name in targets]
    try:
        for module, name in targets:
            setattr(module, name, off)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def check_window_tiles(fn) -> None:
    """``fn(n, window, block_size) -> int``: the tiles a causal sliding-window kernel computes.

    n queries and n keys in square tiles of ``block_size`` (the last one partial when it does not divide
    n); query i sees keys i - window + 1 .. i. A tile is computed when it holds at least one such pair.
    Counted without ``efficient.tile_plan`` (it is switched off while the checker runs).
    """
    from .. import efficient

    cases = [(64, 9, 8), (100, 10, 16), (17, 5, 3), (10, 1, 4), (10, 20, 4), (1000, 100, 128), (4096, 512, 256)]

    def no_plan(*args, **kwargs):
        raise ExerciseError("count the tiles yourself: efficient.tile_plan is the answer, not a way to it")

    saved, efficient.tile_plan = efficient.tile_plan, no_plan
    try:
        try:
            attempt(fn, 64, 9, 8)
        except NotAttempted:
            return not_attempted("window_tiles")
        for n, window, block in cases:
            got = attempt(fn, n, window, block)
            if isinstance(got, torch.Tensor) and got.numel() == 1:
                got = got.item()
            if not isinstance(got, int) or isinstance(got, bool):
                raise ExerciseError(f"return a whole number of tiles (an int), got {type(got).__name__}")
            want = _window_tiles(n, window, block)
            if got == want:
                continue
            t, t_floor = math.ceil(n / block), n // block
            where = f"n={n}, window={window}, block_size={block}"
            if got == t * (t + 1) // 2:
                raise ExerciseError(f"{where}: {got} is every causal tile; a tile whose nearest pair is window or "
                                    "more positions apart holds no key any of its queries may see: skip it too")
            if got == _window_tiles(n, window, block, causal=False):
                raise ExerciseError(f"{where}: your window looks ahead too (|i - j| < window); a causal window only "
                                    "reaches back, keys i - window + 1 .. i")
            if got == _window_tiles(n, window + 1, block):
                raise ExerciseError(f"{where}: you counted a window of window + 1 keys: query i sees i - window + 1 "
                                    "through i, so a tile is needed when its smallest i - j is below window")
            if n % block and got == _window_tiles(t_floor * block, window, block):
                raise ExerciseError(f"{where}: the last, partial tile row and column are missing: there are "
                                    f"ceil(n / block) = {t} tiles per side")
            if got == 2 * t - 1:
                raise ExerciseError(f"{where}: 2T - 1 (the diagonal and the tile before it) holds only while the "
                                    "window reaches at most one tile back; here it reaches further (or, with "
                                    "window 1, not at all)")
            raise ExerciseError(f"{where}: expected {want} tiles, got {got}. A tile (rows r0..r1, keys c0..c1) is "
                                "computed when some query sees some key in it: c0 <= r1 and r0 - c1 < window")
    finally:
        efficient.tile_plan = saved
    return passed(f"a tile is computed when c0 <= r1 and r0 - c1 < window; at n = 4096, blocks of 256, window 512: "
                  f"{_window_tiles(4096, 512, 256)} of the {16 * 17 // 2} causal tiles")


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
    (checked by counting the matmul FLOPs at n = 256). ``efficient.linear_attention`` and
    ``linear_attention_step`` are switched off while it runs.
    """
    with _switched_off(("linear_attention", "linear_attention_step"),
                       "write the recurrence yourself: efficient.linear_attention and linear_attention_step are the "
                       "answer, not a way to it (they are switched off while the checker runs)"):
        return _check_causal_linear_attention(fn)


def _check_causal_linear_attention(fn) -> None:
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 9, 4, generator=gen), torch.randn(2, 9, 4, generator=gen)
    v = torch.randn(2, 9, 3, generator=gen)
    try:
        out = attempt(fn, q, k, v)
    except NotAttempted:
        return not_attempted("causal_linear_attn")
    out = require_tensor("causal_linear_attn(q, k, v)", out, (2, 9, 3))
    want = _linear_quadratic(q, k, v, True)
    if close(out, _sdpa(q, k, v, is_causal=True), atol=1e-4):
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
    n, m = 256, 16
    big = [torch.randn(1, n, m, generator=gen) for _ in range(3)]
    flops = _matmul_flops(fn, *big)
    if flops >= n * n * m:
        raise ExerciseError(f"{flops:,} matmul FLOPs at n = {n}: your code forms the n x n matrix "
                            "phi(Q) phi(K)^T. Carry the state S (m x dv) and z (m) along the sequence instead")
    return passed("a state S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) carried token by token: causal, and no n × n matrix")


def _chunked_variant(q, k, v, chunk, *, diagonal=0, state_first=False, intra=True, norm_inter=True,
                     norm_intra=True, normalise=True):
    """Chunked causal linear attention with phi = elu + 1; each flag off (or ``diagonal=-1``, ``state_first``,
    ``diagonal`` = chunk for no mask) plants one mistake. q, k (B, n, m), v (B, n, dv) -> (B, n, dv)."""
    fq, fk = _phi(q), _phi(k)
    B, n, m = q.shape
    S, z = q.new_zeros(B, m, v.shape[-1]), q.new_zeros(B, m, 1)
    out = []
    for c0 in range(0, n, chunk):
        qc, kc, vc = fq[:, c0:c0 + chunk], fk[:, c0:c0 + chunk], v[:, c0:c0 + chunk]
        if state_first:
            S, z = S + kc.transpose(1, 2) @ vc, z + kc.sum(1)[..., None]
        a = (qc @ kc.transpose(1, 2)).tril(diagonal)
        num = qc @ S + (a @ vc if intra else 0)
        den = (qc @ z if norm_inter else 0) + (a.sum(-1, keepdim=True) if norm_intra else 0)
        out.append(num / den if normalise else num)
        if not state_first:
            S, z = S + kc.transpose(1, 2) @ vc, z + kc.sum(1)[..., None]
    return torch.cat(out, dim=1)


def _count_ops(fn, *args) -> int:
    """How many torch operations ``fn(*args)`` dispatches (every aten call, matmul or not)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn(*args)
    return Counter.calls


def _chunked_flops(n: int, m: int, dv: int, chunk: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of chunked causal linear attention, chunk dividing n: per chunk of C
    tokens, phi(Q_c) S and the state update phi(K_c)^T V_c (2 C m dv each), the masked (C, C) product
    phi(Q_c) phi(K_c)^T (2 C^2 m) and its product with V_c (2 C^2 dv): n (4 m dv + 2 C (m + dv)) in all."""
    return n * (4 * m * dv + 2 * chunk * (m + dv))


def check_chunked_linear_attention(fn) -> None:
    """``fn(q, k, v, chunk) -> (B, n, dv)``: causal linear attention, phi(x) = elu(x) + 1, a chunk at a time.

    q, k (B, n, m), v (B, n, dv). For each chunk c of ``chunk`` tokens (the last one shorter when chunk does
    not divide n), with the state S = sum phi(k_j) v_j^T, z = sum phi(k_j) over the chunks before it:

        out_c = (phi(Q_c) S + A V_c) / (phi(Q_c) z + A 1),   A = lower triangle of phi(Q_c) phi(K_c)^T (C x C),

    then S += phi(K_c)^T V_c, z += sum_c phi(k_j). Graded: the causal answer at every chunk size, the matmul
    FLOPs of that form (``_chunked_flops``, counted at n = 256), and a number of torch operations that falls as
    the chunk grows (one step per chunk, not per token). ``efficient.linear_attention`` and
    ``linear_attention_step`` are switched off while it runs.
    """
    with _switched_off(("linear_attention", "linear_attention_step"),
                       "write the chunked loop yourself: efficient.linear_attention (which is chunked) and "
                       "linear_attention_step are the answer, not a way to it (they are switched off while the "
                       "checker runs)"):
        return _check_chunked_linear_attention(fn)


def _check_chunked_linear_attention(fn) -> None:
    gen = torch.Generator().manual_seed(11)
    q, k = torch.randn(2, 10, 4, generator=gen), torch.randn(2, 10, 4, generator=gen)
    v = torch.randn(2, 10, 3, generator=gen)
    try:
        out = attempt(fn, q, k, v, 4)
    except NotAttempted:
        return not_attempted("chunked_linear_attn")
    out = require_tensor("chunked_linear_attn(q, k, v, 4)", out, (2, 10, 3))
    want = _linear_quadratic(q, k, v, True)
    if not close(out, want, atol=1e-4):
        diagnoses = [
            (_sdpa(q, k, v, is_causal=True), "that is softmax attention; use the feature map phi(x) = elu(x) + 1"),
            (_linear_quadratic(q, k, v, False), "every output uses every key: that is the non-causal form; token i "
             "sees the chunks before its own and, inside its chunk, the keys up to i"),
            (_chunked_variant(q, k, v, 4, diagonal=-1), "token i does not see its own key: inside a chunk keep the "
             "lower triangle of phi(Q_c) phi(K_c)^T with its diagonal (tril(), not tril(-1))"),
            (_chunked_variant(q, k, v, 4, diagonal=4), "a token sees the later keys of its own chunk: mask the "
             "(C, C) product phi(Q_c) phi(K_c)^T to its lower triangle, numerator and normaliser alike"),
            (_chunked_variant(q, k, v, 4, state_first=True), "each chunk's keys are counted twice: read the state S, "
             "z of the chunks before, add the chunk's own keys through the masked (C, C) product, and only then "
             "add the chunk to the state"),
            (_chunked_variant(q, k, v, 4, intra=False), "the numerator lacks the chunk's own keys: add "
             "tril(phi(Q_c) phi(K_c)^T) V_c to phi(Q_c) S"),
            (_chunked_variant(q, k, v, 4, normalise=False), "the normaliser is missing: divide by "
             "phi(Q_c) z + the row sums of the masked (C, C) product"),
            (_chunked_variant(q, k, v, 4, norm_inter=False), "the normaliser lacks the earlier chunks: add "
             "phi(Q_c) z (z = sum of phi(k_j) over the chunks before) to the masked product's row sums"),
            (_chunked_variant(q, k, v, 4, norm_intra=False), "the normaliser lacks the chunk's own keys: add the "
             "row sums of the masked (C, C) product to phi(Q_c) z"),
        ]
        for variant, message in diagnoses:             # from token 1 on: token 0 may divide by zero
            if close(out[:, 1:].nan_to_num(), variant[:, 1:].nan_to_num(), atol=1e-4):
                raise ExerciseError(message)
        if close(attempt(fn, q, k, v, 5), want, atol=1e-4) and close(attempt(fn, q, k, v, 2), want, atol=1e-4):
            raise ExerciseError("right when the chunk divides n (2, 5 for n = 10), wrong at chunk = 4: the last "
                                "chunk has n - 8 = 2 tokens; slice q[:, c0:c0 + chunk] and let it be shorter")
        raise ExerciseError("expected causal linear attention, out_i = phi(q_i)^T S_i / phi(q_i)^T z_i over keys "
                            "j <= i, computed chunk by chunk: (phi(Q_c) S + A V_c) / (phi(Q_c) z + A 1), "
                            "A = tril(phi(Q_c) phi(K_c)^T)")
    for chunk in (1, 2, 3, 5, 7, 10, 16):
        if not close(attempt(fn, q, k, v, chunk), want, atol=1e-4):
            raise ExerciseError(f"right at chunk = 4 but wrong at chunk = {chunk}: every chunk size must give the "
                                "same answer (a chunk of 1 is the token-by-token recurrence; a chunk of n or more "
                                "is the masked n x n form)")
    n, m, chunk = 256, 16, 32
    big = [torch.randn(1, n, m, generator=gen) for _ in range(3)]
    flops = _matmul_flops(fn, *big, chunk)
    expected = _chunked_flops(n, m, m, chunk)
    allowed = 1.25 * (expected + n * (2 * m + 2 * chunk))      # + normalisers done as matmuls, if they are
    if flops >= n * n * m:
        raise ExerciseError(f"{flops:,} matmul FLOPs at n = {n}: your code forms the n x n matrix phi(Q) phi(K)^T. "
                            "Only a (chunk, chunk) block of it, per chunk, and the state S, z between chunks")
    if flops > allowed:
        raise ExerciseError(f"{flops:,} matmul FLOPs at n = {n}, chunk = {chunk}, where the chunked form needs "
                            f"{expected:,} (n (4 m dv + 2 C (m + dv))): some product is larger than one chunk's "
                            "(C, C) block or its (m, dv) state update")
    few, many = _count_ops(fn, *big, 64), _count_ops(fn, *big, 8)
    if many < 2 * few:
        raise ExerciseError(f"{few} torch operations with chunks of 64 and {many} with chunks of 8: the work does "
                            "not follow the chunk. Step through the sequence one chunk at a time (n / chunk steps), "
                            "not token by token and not all at once")
    return passed(f"the causal answer at every chunk size; {flops:,} matmul FLOPs at n = {n}, m = dv = {m}, "
                  f"chunk {chunk} (the chunked form: n (4 m dv + 2 C (m + dv)) = {expected:,}, and 2 n m more where "
                  f"phi(Q_c) z is a matmul, against "
                  f"{4 * n * n * m:,} for the masked n x n product); n / C steps, one per chunk. The count rises "
                  "with C, so C = 1, the recurrence, costs the fewest FLOPs; a larger C buys fewer sequential steps "
                  "and larger matmuls, which keep the hardware busier")


def _causal_reference(q, k, v):
    """Causal softmax attention in float64, returned in q's dtype."""
    out = _sdpa(q.double(), k.double(), v.double(), is_causal=True)
    return out.to(q.dtype)


def _inplace_matmul_flops() -> dict:
    """Flop formulas for the in-place matmuls torch's counter has none for (``baddbmm_``, ``addmm_``, ``addbmm``).

    ``FlopCounterMode`` looks an op up by its packet: ``aten.baddbmm`` covers ``torch.baddbmm`` and its ``out=``
    form, but ``Tensor.baddbmm_`` is the packet ``aten.baddbmm_``, which it does not know, so a loop could hide
    its matmuls in place. Each formula here is the out-of-place one's: 2 FLOPs per multiply-add.
    """
    from torch.utils import flop_counter

    aten = torch.ops.aten

    def batched(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
        return flop_counter.bmm_flop(a_shape, b_shape)

    def plain(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
        return flop_counter.mm_flop(a_shape, b_shape)

    return {aten.baddbmm_: batched, aten.addbmm: batched, aten.addbmm_: batched, aten.addmm_: plain}


def _matmul_flops(fn, *args) -> int:
    """The matmul FLOPs ``fn(*args)`` runs, in-place matmuls (``baddbmm_`` and kin) included."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_inplace_matmul_flops()) as counter:
        fn(*args)
    return counter.get_total_flops()


def check_causal_tiled(fn, peak_memory=None) -> None:
    """``fn(q, k, v, block_size) -> out``: causal attention by tiles with an online softmax.

    q, k, v (B, h, n, d); square tiles of ``block_size`` queries x ``block_size`` keys, the tiles
    above the diagonal skipped. Graded beyond the output: the same answer at every block size
    (block sizes that do not divide n included), stable at scores of about 1e4, no work on
    the skipped tiles (matmul FLOPs counted), and, when ``peak_memory`` (the course's
    ``memory.peak_memory``) is given, a peak memory that grows at most linearly
    from n = 256 to 1024 and stays below one n x n bool mask (n^2 bytes).
    ``efficient.flash_attention``, ``sliding_window_attention`` and ``F.scaled_dot_product_attention`` are
    switched off while it runs.
    """
    with _switched_off(("flash_attention", "sliding_window_attention"),
                       "write the tile loop yourself: efficient.flash_attention, sliding_window_attention and "
                       "torch's F.scaled_dot_product_attention are the answer, not a way to it (they are switched "
                       "off while the checker runs)", sdpa=True):
        return _check_causal_tiled(fn, peak_memory)


def _check_causal_tiled(fn, peak_memory) -> None:
    gen = torch.Generator().manual_seed(80)
    q, k, v = (torch.randn(2, 3, 19, 8, generator=gen) for _ in range(3))
    try:
        out = attempt(fn, q, k, v, 4)
    except NotAttempted:
        return not_attempted("causal_tiled_attention")
    out = require_tensor("the output", out, q.shape)
    want = _causal_reference(q, k, v)
    if close(out, _sdpa(q, k, v)):
        raise ExerciseError("the output is non-causal attention: mask the keys j > i inside the tiles that "
                            "straddle the diagonal (and skip the tiles above it)")
    if close(out, _sdpa(q, k, v, is_causal=True, scale=1.0)):
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
        # two sizes, 4x apart: a tiled loop's peak (the output, a few tiles) grows at most like n, while any
        # n x n structure, even a boolean mask (1 byte an entry), grows like n^2 and outgrows n^2 bytes
        (n_small, n), block = (256, 1024), 64
        peaks = {}
        for size in (n_small, n):
            large = [torch.randn(1, 2, size, 16, generator=gen) for _ in range(3)]
            peaks[size] = peak_memory(lambda: fn(*large, block))
        growth, mask_bytes = peaks[n] / peaks[n_small], n * n     # one n x n bool
        if peaks[n] >= mask_bytes or growth >= n / n_small:
            raise ExerciseError(f"peak memory {peaks[n_small] / 2**20:.2f} MiB at n = {n_small} and "
                                f"{peaks[n] / 2**20:.2f} MiB at n = {n} (x{growth:.1f} for x{n // n_small} in n; "
                                f"one n x n bool mask is {mask_bytes / 2**20:.2f} MiB): some step forms a structure "
                                "that grows like n^2 (a full mask, even a boolean one, a full score row per query, "
                                "or all tiles kept until the end); build each tile's mask from its own positions "
                                "and keep one tile at a time")
        message += (f", peak memory growing at most linearly from n = {n_small} to {n} and under one {n} x {n} "
                    "bool mask")
    return passed(message)

