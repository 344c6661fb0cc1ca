"""Checkers for notebook 06: attention through a paged cache's block table, int8 quantisation of a cache,
attention of new tokens over a cache, a cached decoding loop."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_paged_decode", "check_quantize_int8", "check_cached_attention", "check_generate"]


def _through_table(pool, table, n, *, heads_first=True):
    """(h, n, dk): tokens 0..n-1 of a request, pool (n_blocks, h, block_size, dk), its blocks ``table`` in order."""
    blocks = pool[torch.tensor(table)]                                   # (len(table), h, block_size, dk)
    if heads_first:
        return blocks.transpose(0, 1).reshape(pool.shape[1], -1, pool.shape[-1])[:, :n]
    return blocks.reshape(pool.shape[1], -1, pool.shape[-1])[:, :n]    # the mistake: heads and blocks mixed


def check_paged_decode(fn) -> None:
    """``fn(q, k_pool, v_pool, table, n)`` must return one decode query's attention over a paged cache.

    q: (h, 1, dk); k_pool, v_pool: (n_blocks, h, block_size, dk); table: the request's pool blocks in
    order (a list of ints); n: its tokens, token i in block table[i // block_size] at slot
    i % block_size. Returns (h, 1, dk): softmax(q K^T / sqrt(dk)) V over those n tokens.
    """
    gen = torch.Generator().manual_seed(6)
    n_blocks, h, block, dk = 10, 2, 4, 8
    cases = [([7, 2, 5], 2 * block + 3),     # out of pool order; the last block holds 3 of its 4 slots
             ([9, 0, 3], 3 * block)]         # every block full
    for table, n in cases:
        k_pool = 4 * torch.randn(n_blocks, h, block, dk, generator=gen)   # every slot filled: a slot read
        v_pool = 4 * torch.randn(n_blocks, h, block, dk, generator=gen)   # by mistake changes the output
        q = torch.randn(h, 1, dk, generator=gen) / 2
        try:
            got = attempt(fn, q.clone(), k_pool.clone(), v_pool.clone(), list(table), n)
        except NotAttempted:
            return not_attempted("paged_decode")
        require_tensor("the output", got, (h, 1, dk))
        k, v = _through_table(k_pool, table, n), _through_table(v_pool, table, n)
        if close(got, _attend(q, k, v)):
            continue
        where = f"table {table}, n = {n}, block_size {block}"
        wrongs = [
            (_attend(q, _through_table(k_pool, sorted(table), n), _through_table(v_pool, sorted(table), n)),
             "the blocks were read in pool order: the table lists them in the request's order, so read "
             "k_pool[table] as the table gives it, never sorted"),
            (_attend(q, _through_table(k_pool, list(range(len(table))), n),
                     _through_table(v_pool, list(range(len(table))), n)),
             "the request's blocks are not the first blocks of the pool: table[j] is the pool index of its "
             "j-th block, k_pool[table]"),
            (_attend(q, _through_table(k_pool, table, len(table) * block),
                     _through_table(v_pool, table, len(table) * block)),
             "the last block is only partly filled: after joining the blocks keep the first n tokens ([:, :n]); "
             "the empty slots hold whatever was there before"),
            (_attend(q, _through_table(k_pool, table, n, heads_first=False),
                     _through_table(v_pool, table, n, heads_first=False)),
             "k_pool[table] is (blocks, h, block_size, d_k): move the heads first (transpose(0, 1)) before "
             "merging blocks and slots into one token axis, or each head reads another head's keys"),
            (_attend(q, k, v, scale=False), "divide the scores by sqrt(d_k)"),
            (_attend(q, k, v, dim=-2), "softmax over the keys (the last dim of q K^T), not over the queries"),
        ]
        for wrong, hint in wrongs:
            if close(got, wrong):
                raise ExerciseError(f"{where}: {hint}")
        raise ExerciseError(f"{where}: the output differs from attention over the request's n tokens read "
                            "through the table (token i in block table[i // block_size], slot i % block_size)")
    return passed("attention through a block table: the blocks in the table's order, heads first, the first n "
                  "tokens: the same output as attention over a contiguous copy of the request")


def check_quantize_int8(fn) -> None:
    """``fn(x)`` must return (q, scale): absmax int8 quantisation of each vector along the last dim.

    x: (B, h, T, dk) floats; q: int8 of x's shape; scale: (B, h, T, 1) with scale = max|x| / 127 per
    vector and q = round(x / scale), so |q * scale - x| <= scale / 2 everywhere.
    """
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 6, 16, generator=gen)
    x[0, 1, 2, 5] = -9.0                                   # a negative outlier: the largest |x| of its vector
    x[1, 0, 4] *= 0.01                                      # a small vector: its own scale, not the tensor's
    try:
        result = attempt(fn, x.clone())
    except NotAttempted:
        return not_attempted("quantize_int8")
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseError("return a pair (q, scale)")
    q, scale = result
    require_tensor("q", q)
    require_tensor("scale", scale)
    if q.dtype != torch.int8:
        raise ExerciseError(f"q is {q.dtype}: store it as int8, q.to(torch.int8), one byte per value")
    require_tensor("q", q, tuple(x.shape))
    absmax = x.abs().amax(dim=-1, keepdim=True)            # (B, h, T, 1)
    if scale.numel() == 1:
        raise ExerciseError("one scale for the whole tensor: a single large value then crushes every other "
                            "vector to a few levels. Take the max over the last dim only, "
                            "x.abs().amax(dim=-1, keepdim=True): one scale per head and token")
    if tuple(scale.shape) == tuple(x.shape[:-1]):
        raise ExerciseError(f"scale has shape {tuple(scale.shape)}: keep the last dim (keepdim=True), "
                            f"shape {tuple(absmax.shape)}, so q * scale broadcasts over each vector")
    require_tensor("scale", scale, tuple(absmax.shape))
    scale = scale.to(torch.float32)
    for wrong, hint in ((x.amax(dim=-1, keepdim=True) / 127, "the max of x, not of |x|: a vector whose "
                         "largest magnitude is negative then overflows int8. Use x.abs().amax(...)"),
                        (absmax / 255, "scale = max|x| / 255 uses the unsigned range: int8 holds -127..127, "
                         "so scale = max|x| / 127"),
                        (absmax / 128, "scale = max|x| / 128 sends the largest value to 128, one past int8's "
                         "127: scale = max|x| / 127"),
                        (absmax, "scale = max|x| maps every vector into [-1, 1], so q is only -1, 0 or 1: "
                         "scale = max|x| / 127")):
        if close(scale, wrong) and not close(scale, absmax / 127):
            raise ExerciseError(hint)
    if not close(scale, absmax / 127):
        raise ExerciseError("scale should be max|x| / 127 for each vector (the max over the last dim)")
    error = (q.to(torch.float32) * scale - x).abs()
    if bool((error > scale / 2 * (1 + 1e-4) + 1e-7).any()):
        truncated = (x / scale).to(torch.int8)
        if torch.equal(q, truncated):
            raise ExerciseError("q truncates toward zero ((x / scale).to(torch.int8)): round first, "
                                "torch.round(x / scale), so the error is at most half a step")
        raise ExerciseError(f"q * scale misses x by up to {float((error / scale).max()):.2f} steps; "
                            "q = round(x / scale) misses it by at most half a step")
    return passed("absmax int8: one scale per vector, every value within half a step (scale / 2) of x")


def _attend(q, k, v, scale=True, dim=-1, mask=None):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=dim) @ v


def _causal(m, s, bottom_right):
    """(m, s) boolean, True = may attend; bottom-right: query i sees keys 0 .. s - m + i."""
    offset = s - m if bottom_right else 0
    return torch.arange(s)[None, :] <= torch.arange(m)[:, None] + offset


def check_cached_attention(fn) -> None:
    """``fn(q, k_new, v_new, k_cache, v_cache)`` must return (output, k_all, v_all) for m new tokens.

    q, k_new, v_new: (B, h, m, dk) of the m newest tokens (at positions t .. t + m - 1); k_cache,
    v_cache: (B, h, t, dk) of the t earlier tokens. k_all, v_all: (B, h, t + m, dk), oldest first;
    output (B, h, m, dk): new token i attends to keys 0 .. t + i (the causal mask aligned bottom-right).
    Tried with m = 3 new tokens after t = 5, then with one new token (a decode step).
    """
    gen = torch.Generator().manual_seed(6)
    B, h, t, dk = 2, 3, 5, 8
    for m in (3, 1):
        q, k_new, v_new = (torch.randn(B, h, m, dk, generator=gen) for _ in range(3))
        k_cache, v_cache = (torch.randn(B, h, t, dk, generator=gen) for _ in range(2))
        k_all = torch.cat([k_cache, k_new], dim=-2)
        v_all = torch.cat([v_cache, v_new], dim=-2)
        try:
            result = attempt(fn, q, k_new, v_new, k_cache.clone(), v_cache.clone())
        except NotAttempted:
            return not_attempted("cached_attention")
        if not isinstance(result, tuple) or len(result) != 3:
            raise ExerciseError("return a triple (output, k_all, v_all)")
        out, k_got, v_got = result
        require_tensor("output", out)
        require_tensor("k_all", k_got)
        require_tensor("v_all", v_got)
        where = f"with {m} new token{'s' if m > 1 else ''} after {t} cached ones"
        if k_got.shape != k_all.shape:
            raise ExerciseError(f"{where}, k_all should have shape {tuple(k_all.shape)} = (B, h, t + m, dk), got "
                                f"{tuple(k_got.shape)}: append the new keys to the cached ones along the sequence "
                                "dim, torch.cat([k_cache, k_new], dim=-2)")
        if close(k_got, torch.cat([k_new, k_cache], dim=-2)):
            raise ExerciseError("k_all has the new keys first: append them at the end, so position i stays at "
                                "index i")
        if not close(k_got, k_all) or not close(v_got, v_all):
            raise ExerciseError("k_all / v_all are not the cached keys / values followed by the new ones")
        require_tensor("output", out, (B, h, m, dk))
        right = _attend(q, k_all, v_all, mask=_causal(m, t + m, bottom_right=True))
        if close(out, right):
            continue
        if close(out, _attend(q, k_cache, v_cache)):
            raise ExerciseError("the output attends to the cached keys only: each new token must see itself too "
                                "(attend over k_all, v_all)")
        if close(out, _attend(q, k_all, v_all, scale=False, mask=_causal(m, t + m, bottom_right=True))):
            raise ExerciseError("the scores are not scaled: divide q . k by sqrt(dk)")
        if m > 1 and close(out, _attend(q, k_all, v_all)):
            raise ExerciseError(f"{where}, new token 0 sees the new tokens after it: mask the scores, new token i "
                                f"at position t + i may see keys 0 .. t + i only")
        if m > 1 and close(out, _attend(q, k_all, v_all, mask=_causal(m, t + m, bottom_right=False))):
            raise ExerciseError(f"{where}, the causal mask is aligned top-left (what is_causal=True does): new "
                                "token i sits at position t + i, so it may see keys 0 .. t + i; align the mask "
                                "bottom-right, key j visible when j <= t + i")
        raise ExerciseError(f"{where}, the output differs from softmax(q k_all^T / sqrt(dk) + M) v_all, M the "
                            "causal mask aligned bottom-right")
    return passed("new tokens after a cache: append k, v, attend over everything stored with the causal mask "
                  "aligned bottom-right (one new token needs no mask)")


def check_generate(fn, model) -> None:
    """``fn(model, ids, n)`` must greedily append n tokens to ids (1, T) using one KVCache per layer.

    Compared with ``model.generate(ids, n)``, which ``fn`` may not call; the tokens the model is run on are
    counted: a cached loop runs T (prefill) + n - 1 of them (the n-th token needs no forward pass), and
    T + n when it also runs the last token.
    """
    ids = torch.tensor([[int(i) for i in torch.randint(0, model.config.vocab_size, (12,),
                                                         generator=torch.Generator().manual_seed(3))]])
    n = 10
    expected = model.generate(ids, n)
    seen, delegated = [], []

    def count(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("ids")
        seen.append(torch.as_tensor(tokens).shape[-1])

    def no_generate(*args, **kwargs):
        delegated.append(True)
        raise ExerciseError("you called model.generate: write the loop yourself, a prefill "
                            "model(ids, caches=caches) and then one model(next_id, caches=caches) per token")

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    model.generate = no_generate                        # an instance attribute shadows the method
    try:
        try:
            got = attempt(fn, model, ids, n)
        except NotAttempted:
            return not_attempted("generate_with_cache")
        except ValueError as err:
            if "overflow" in str(err) or "exceed" in str(err):
                raise ExerciseError(f"the cache overflowed ({err}). After the prefill, run only the newest token: "
                                    "model(next_id, caches=caches)") from None
            raise
    finally:
        hook.remove()
        del model.generate
    if delegated:                                       # the learner caught the error and carried on
        raise ExerciseError("you called model.generate: write the loop yourself")
    require_tensor("the result", got)
    got = got.reshape(1, -1) if got.dim() == 1 else got
    if got.shape != expected.shape:
        raise ExerciseError(f"expected shape {tuple(expected.shape)} (prompt + {n} tokens), got {tuple(got.shape)}")
    if not torch.equal(got[:, :ids.shape[1]], ids):
        raise ExerciseError("the result should start with the prompt")
    if not torch.equal(got, expected):
        first = int((got != expected).nonzero()[0, 1])
        raise ExerciseError(f"token {first} differs from model.generate: take argmax of the LAST position's logits "
                            "each step, and feed that token (not the whole sequence) to the next step")
    processed = sum(seen)
    T = ids.shape[1]
    if processed > T + n:
        raise ExerciseError(f"right tokens, but the model ran on {processed} tokens; with a cache it needs "
                            f"{T + n - 1} (the prompt once, then each new token once; the last one needs no "
                            "forward pass): you re-ran earlier tokens. Pass caches= and, after the prefill, feed "
                            "only the newest token")
    note = "" if processed == T + n - 1 else " (the last call is not needed: its logits are never used)"
    return passed(f"the same tokens as model.generate, running the model on {processed} tokens{note} instead of "
                  f"{sum(range(T, T + n))} without a cache")
