"""Checkers for notebook 07: expanding K/V heads for grouped-query attention; grouped-query attention without
copying K and V; a serving budget (K/V heads and cache dtype that fit a GPU)."""

from __future__ import annotations

import inspect

import torch

from ..presets import get_preset
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_expand_kv", "check_gqa_attention", "check_mean_pool", "check_serving_plans"]


def check_expand_kv(fn) -> None:
    """``fn(k, n_heads)`` must turn k (B, n_kv, S, dk) into (B, n_heads, S, dk), query head i using K/V head i // g,
    without ``repeat_interleave`` (which the notebook already shows): a group axis, ``expand``, ``reshape``."""
    gen = torch.Generator().manual_seed(7)
    B, n_kv, S, dk, n_heads = 2, 2, 5, 4, 8
    k = torch.randn(B, n_kv, S, dk, generator=gen)
    g = n_heads // n_kv
    expected = k.repeat_interleave(g, dim=1)
    try:
        got = attempt(fn, k, n_heads)
    except NotAttempted:
        return not_attempted("expand_kv")
    require_tensor("expand_kv(k, 8)", got)
    if got.shape != expected.shape:
        raise ExerciseError(f"expected shape {tuple(expected.shape)} = (B, n_heads, S, dk), got {tuple(got.shape)}: "
                            "the group axis is merged into the head axis (dim=1)")
    if close(got, k.repeat(1, g, 1, 1)):
        raise ExerciseError("the heads are tiled (kv0, kv1, kv0, kv1, ...), what `repeat` or a group axis placed "
                            "before the K/V head axis gives. Query heads 0-3 must all use K/V head 0: insert the "
                            "group axis after it, k[:, :, None], then expand and reshape")
    if not close(got, expected):
        raise ExerciseError("the heads are not in the right order: query head i must read K/V head i // g")
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    if "repeat_interleave" in source:
        raise ExerciseError("right, but that is the notebook's repeat_interleave: write it as a view instead, "
                            "k[:, :, None].expand(B, n_kv, g, S, dk), then reshape to (B, n_heads, S, dk)")
    return passed("a group axis after the K/V heads, expanded (a view) then reshaped (a full copy, as large as "
                  "repeat_interleave's): query heads 0-3 read K/V head 0, heads 4-7 head 1")


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def check_gqa_attention(fn, peak_memory=None) -> None:
    """``fn(q, k, v)``: grouped-query attention (no mask) that never copies K or V to n_heads heads.

    q (B, h, L, dk), k and v (B, h_kv, S, dk); query head i reads K/V head i // g, g = h / h_kv; returns
    softmax(q k^T / sqrt(dk)) v, (B, h, L, dk). Checked against torch's SDPA with ``enable_gqa=True`` on two
    layouts, then, when ``peak_memory`` (the course's ``memory.peak_memory``) is given, on a decode step
    (L = 1, S = 4096, dk = 64) whose peak must stay below half of one expanded K.
    """
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(9)
    layouts = [(2, 8, 2, 3, 5, 4), (1, 6, 3, 2, 7, 8)]                    # B, h, h_kv, L, S, dk
    cases = [(torch.randn(B, h, L, dk, generator=gen), torch.randn(B, hk, S, dk, generator=gen),
              torch.randn(B, hk, S, dk, generator=gen)) for B, h, hk, L, S, dk in layouts]
    try:
        got = attempt(fn, *cases[0])
    except NotAttempted:
        return not_attempted("gqa_attention")
    source = _source(fn)
    if "scaled_dot_product_attention" in source:
        raise ExerciseError("that is torch's fused kernel: write the two matmuls and the softmax yourself")
    for q, k, v in cases:
        got = attempt(fn, q, k, v)
        require_tensor("gqa_attention(q, k, v)", got)
        if got.shape != q.shape:
            raise ExerciseError(f"expected shape {tuple(q.shape)} = (B, h, L, dk) like q, got {tuple(got.shape)}")
        expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        if close(got, expected):
            continue
        g = q.shape[1] // k.shape[1]
        if close(got, F.scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1))):
            raise ExerciseError("query heads are paired with the wrong K/V heads (kv0, kv1, kv0, ...): the heads of "
                                "one group are consecutive, so q.reshape(B, h_kv, g * L, dk) keeps them together")
        if close(got, F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=True)):
            raise ExerciseError("the scores are not scaled: divide q k^T by sqrt(dk)")
        raise ExerciseError(f"for q {tuple(q.shape)}, k {tuple(k.shape)}: not SDPA with query head i reading K/V "
                            "head i // g (softmax over the keys, the last axis of the scores)")
    message = "the g query heads of a group stacked as g * L rows against their one K/V head"
    if peak_memory is not None:
        q = torch.randn(1, 8, 1, 64, generator=gen)
        k, v = (torch.randn(1, 2, 4096, 64, generator=gen) for _ in range(2))
        expanded = k.numel() * 4 * k.element_size()                      # one of K or V at 8 heads
        peak = peak_memory(lambda: fn(q, k, v))
        if peak >= expanded / 2:
            raise ExerciseError(f"right answer, but the call's peak memory is {peak / 2**20:.1f} MiB at S = 4096, "
                                f"against {expanded / 2**20:.0f} MiB for one expanded K: K or V is copied to 8 heads "
                                "(repeat_interleave, expand + reshape, and matmul broadcasting over a group axis all "
                                "copy). Reshape q instead: (B, h_kv, g * L, dk) @ k.transpose(-2, -1)")
        message += (f"; peak memory {peak / 2**20:.2f} MiB on a decode step, under half of one expanded K "
                    f"({expanded / 2**20:.0f} MiB)")
    return passed(message)


def check_mean_pool(fn) -> None:
    """``fn(weight, n_heads, n_kv_heads)`` must average the K (or V) projection over each group of heads.

    weight: (n_heads * dk, d_in), rows h*dk .. (h+1)*dk - 1 produce head h. Result
    (n_kv_heads * dk, d_in): K/V head j = mean of heads j*g .. (j+1)*g - 1.
    """
    gen = torch.Generator().manual_seed(8)
    n_heads, n_kv, dk, d_in = 8, 2, 3, 5
    g = n_heads // n_kv
    weight = torch.randn(n_heads * dk, d_in, generator=gen)
    heads = weight.view(n_heads, dk, d_in)
    expected = heads.view(n_kv, g, dk, d_in).mean(1).reshape(n_kv * dk, d_in)
    try:
        got = attempt(fn, weight.clone(), n_heads, n_kv)
    except NotAttempted:
        return not_attempted("mean_pool_kv")
    require_tensor("mean_pool_kv(weight, 8, 2)", got)
    if got.shape != expected.shape:
        raise ExerciseError(f"expected shape {tuple(expected.shape)} = (n_kv_heads * dk, d_in), got "
                            f"{tuple(got.shape)}: reshape to (n_kv_heads, g, dk, d_in) and average over g")
    strided = heads.view(g, n_kv, dk, d_in).mean(0).reshape(n_kv * dk, d_in)
    if close(got, strided):
        raise ExerciseError("you averaged heads j, j + n_kv, j + 2 n_kv ... (a strided group). The heads that "
                            "share K/V head j are the consecutive ones j*g .. (j+1)*g - 1 (repeat_interleave order)")
    if close(got, expected * g):
        raise ExerciseError("you summed the heads of each group: take the mean, or the keys grow g times larger")
    if close(got, heads.view(n_kv, g, dk, d_in)[:, 0].reshape(n_kv * dk, d_in)):
        raise ExerciseError("you kept the first head of each group: the GQA recipe averages all of them")
    if not close(got, expected):
        raise ExerciseError("not the per-group mean of the heads: view the rows as (n_kv_heads, g, dk, d_in) "
                            "and average over dim 1")
    return passed("K/V head j = mean of query-group j's heads, as in the GQA paper's conversion")


CACHE_DTYPES = (2, 1, 0.5)   # bytes per cached value: bf16, 8-bit, 4-bit
SCALE_BYTES = 2 / 128        # a common 4-bit layout's overhead: one 2-byte scale per block of 128 values


def _kv_options(p) -> list[int]:
    """K/V head counts p converts to by mean-pooling its own K/V heads in equal groups: divisors of n_kv_heads."""
    return [h for h in range(1, p.n_kv_heads + 1) if p.n_kv_heads % h == 0]


def _plans(name, batch, seq_len, gpu_bytes, weight_bytes, *, weights=True, kv_factor=1.0, kv_options=None,
           batch_factor=True):
    p = get_preset(name)
    options = _kv_options(p) if kv_options is None else kv_options(p)
    fixed = p.weight_bytes(weight_bytes) if weights else 0
    return {(h, b) for h in options for b in CACHE_DTYPES
            if fixed + kv_factor * p.kv_bytes(seq_len, batch if batch_factor else 1, b, n_kv_heads=h) <= gpu_bytes}


def _scales_verdict(name, batch, seq_len, gpu_bytes, weight_bytes) -> str:
    """What the budget's exact 0.5 byte per 4-bit value hides: the 4-bit-cache plan with the most K/V heads that
    fits, its bytes, and its bytes with ``SCALE_BYTES`` more per 4-bit value (the cache's, and the weights' if
    4-bit)."""
    p = get_preset(name)
    h = max(h for h, b in _plans(name, batch, seq_len, gpu_bytes, weight_bytes) if b == 0.5)
    used = p.weight_bytes(weight_bytes) + p.kv_bytes(seq_len, batch, 0.5, n_kv_heads=h)
    scaled = (p.weight_bytes(weight_bytes + (SCALE_BYTES if weight_bytes == 0.5 else 0))
              + p.kv_bytes(seq_len, batch, 0.5 + SCALE_BYTES, n_kv_heads=h))
    verdict = "no longer fits" if scaled > gpu_bytes else "still fits"
    return (f"that plan ({h} K/V heads) uses {used / 1e9:.1f} of the {gpu_bytes / 1e9:.0f} GB, counting exactly 0.5 "
            f"byte per 4-bit value; with one 2-byte scale per 128 values in weights and cache it needs "
            f"{scaled / 1e9:.1f} GB and {verdict}")


def check_serving_plans(fn) -> None:
    """``fn(name, batch, seq_len, gpu_bytes, weight_bytes_per_value)`` -> the set of (n_kv_heads, bytes_per_value).

    Every pair, with n_kv_heads a divisor of the model's own n_kv_heads (its K/V heads pooled in equal groups) and
    bytes_per_value in (2, 1, 0.5), for which the weights (n_params x weight_bytes_per_value) plus the
    KV cache of ``batch`` sequences of ``seq_len`` tokens fit in ``gpu_bytes``.
    """
    cases = [("Llama-3-70B", 32, 32768, 80 * 10**9, 0.5), ("Llama-3-70B", 32, 32768, 80 * 10**9, 2),
             ("Llama-3-8B", 16, 8192, 24 * 10**9, 2), ("Mistral-7B", 8, 32768, 40 * 10**9, 1),
             ("Llama-3-70B", 4, 8192, 160 * 10**9, 2)]
    try:
        attempt(fn, *cases[0])
    except NotAttempted:
        return not_attempted("plans_that_fit")
    for case in cases:
        got = attempt(fn, *case)
        try:
            got = {(int(h), float(b)) for h, b in got}
        except (TypeError, ValueError):
            raise ExerciseError("return a set (or list) of pairs (n_kv_heads, bytes_per_value)") from None
        want = _plans(*case)
        if got == want:
            continue
        where = f"for {case[0]}, batch {case[1]}, {case[2]:,} tokens, {case[3] / 1e9:.0f} GB, weights at {case[4]} B"
        if got == _plans(*case, weights=False):
            raise ExerciseError(f"{where}: the weights need memory too: n_params x weight_bytes_per_value "
                                "(get_preset(name).weight_bytes(...)) comes out of the same GPU")
        if got == _plans(*case, kv_factor=0.5):
            raise ExerciseError(f"{where}: the cache holds keys AND values: 2 x layers x kv_heads x head_dim x tokens "
                                "x batch x bytes")
        if got == _plans(*case, batch_factor=False):
            raise ExerciseError(f"{where}: the cache is per sequence: multiply by the batch")
        if got == _plans(*case, kv_options=lambda p: [p.n_kv_heads]):
            raise ExerciseError(f"{where}: try every K/V head count the model could be converted to (the divisors "
                                "of its own n_kv_heads), not only its own")
        if any(h < 1 or get_preset(case[0]).n_kv_heads % h for h, _ in got):
            raise ExerciseError(f"{where}: K/V head counts must divide the model's own n_kv_heads (converting "
                                "mean-pools its K/V heads in equal groups; GQA shares heads, it does not add them)")
        missing, extra = sorted(want - got), sorted(got - want)
        raise ExerciseError(f"{where}: expected {sorted(want)}; missing {missing}, not fitting but returned {extra}")
    return passed("weights + 2 x layers x kv_heads x head_dim x tokens x batch x bytes <= the GPU; Llama-3-70B "
                  "at 32 x 32k tokens fits 80 x 10^9 bytes only with 4-bit weights, and then with at most 4 K/V "
                  f"heads, those in a 4-bit cache; {_scales_verdict(*cases[0])} (at 80 GiB, 85.9 x 10^9 bytes, "
                  "8-bit weights with 1 K/V head in a 4-bit cache fit too)")

