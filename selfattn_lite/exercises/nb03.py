"""Checkers for notebook 03: a combined causal + padding mask, the decoding mask, cross-attention."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_causal_padding_mask", "check_decode_mask", "check_cross_attention"]


def _reference_causal_padding(lengths: list[int], T: int) -> torch.Tensor:
    causal = torch.ones(T, T, dtype=torch.bool).tril()                    # (T, T)
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]       # (B, T) True = real token
    return causal[None] & real[:, None, :]                                 # (B, T, T)


def _require_bool(name: str, mask, shape) -> torch.Tensor:
    mask = require_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise ExerciseError(f"{name} should be a bool tensor (True = may attend), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ExerciseError(f"{name} should have shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask


def check_causal_padding_mask(fn) -> None:
    """``fn(lengths, T)`` -> (B, T, T) bool: query i may attend to key j iff j <= i and key j is real."""
    lengths, T = [4, 2, 5], 5
    try:
        got = attempt(fn, list(lengths), T)
    except NotAttempted:
        return not_attempted("causal_padding_mask")
    expected = _reference_causal_padding(lengths, T)
    got = _require_bool("causal_padding_mask(lengths, T)", got, expected.shape)
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if torch.equal(got, ~expected):
        raise ExerciseError("the polarity is flipped: True must mean 'may attend' (torch SDPA's convention), "
                            "so real past keys are True and future or padding keys are False")
    if torch.equal(got, causal[None] & real[:, :, None]):
        raise ExerciseError("you masked padded *queries* (rows) instead of padded *keys* (columns): index the "
                            "real-token mask as real[:, None, :] so it broadcasts over the query dim")
    if torch.equal(got, torch.ones(T, T, dtype=torch.bool).triu()[None] & real[:, None, :]):
        raise ExerciseError("your triangle is the upper one: that lets a query see the future. Key j is allowed "
                            "for query i when j <= i (lower triangle, torch.tril)")
    if torch.equal(got, causal[None].expand_as(got)):
        raise ExerciseError("the causal part is right but padding is missing: keys j >= lengths[b] must be False")
    if torch.equal(got, real[:, None, :].expand_as(got)):
        raise ExerciseError("the padding part is right but the causal part is missing: also require j <= i")
    if torch.equal(got, causal[None] & (torch.arange(T)[None, :] <= torch.tensor(lengths)[:, None])[:, None, :]):
        raise ExerciseError("off by one: a sequence of length n has real tokens 0..n-1, so use j < lengths[b]")
    if not torch.equal(got, expected):
        wrong = (got != expected).nonzero()[0].tolist()
        raise ExerciseError(f"entry (b, i, j) = {tuple(wrong)} is {bool(got[tuple(wrong)])}, expected "
                            f"{bool(expected[tuple(wrong)])} (lengths {lengths})")
    return passed("causal AND key padding, True = may attend, shape (B, T, T)")


def check_decode_mask(fn) -> None:
    """``fn(n_new, n_cached)`` -> (n_new, n_cached + n_new) bool, the causal mask aligned bottom-right."""
    n_new, n_cached = 3, 4
    try:
        got = attempt(fn, n_new, n_cached)
    except NotAttempted:
        return not_attempted("decode_mask")
    S = n_cached + n_new
    expected = torch.ones(n_new, S, dtype=torch.bool).tril(diagonal=n_cached)
    got = _require_bool("decode_mask(3, 4)", got, expected.shape)
    if torch.equal(got, torch.ones(n_new, S, dtype=torch.bool).tril()):
        raise ExerciseError("this is the top-left alignment (what is_causal=True does): the first new query would "
                            "see only key 0. New queries come after the cached keys: shift the diagonal by n_cached")
    if torch.equal(got, ~expected):
        raise ExerciseError("the polarity is flipped: True must mean 'may attend'")
    if torch.equal(got, torch.ones(n_new, S, dtype=torch.bool).tril(diagonal=n_cached - 1)):
        raise ExerciseError("off by one: each new query must also see itself (its own key is the last one stored)")
    if torch.equal(got, torch.ones(n_new, S, dtype=torch.bool)):
        raise ExerciseError("every key is allowed: new query i must not see the new tokens after it")
    if not torch.equal(got, expected):
        raise ExerciseError(f"expected query i to see keys 0..n_cached + i; got\n{got.int()}")
    for n_new, n_cached in ((1, 6), (5, 0)):                               # one decode step; a prefill
        got = attempt(fn, n_new, n_cached)
        got = _require_bool(f"decode_mask({n_new}, {n_cached})", got, (n_new, n_cached + n_new))
        if not torch.equal(got, torch.ones(n_new, n_cached + n_new, dtype=torch.bool).tril(diagonal=n_cached)):
            raise ExerciseError(f"decode_mask({n_new}, {n_cached}) is wrong: it must work for one new token "
                                "(it sees every key) and for an empty cache (plain causal)")
    return passed("bottom-right causal mask: new queries see every cached key and the new keys up to themselves")


def check_cross_attention(fn) -> None:
    """``fn(y, x, W_q, W_k, W_v)`` -> (output (L, dv), weights (L, S)), queries from y, keys/values from x."""
    gen = torch.Generator().manual_seed(3)
    L, S, d, dk = 3, 5, 6, 4
    y, x = torch.randn(L, d, generator=gen), torch.randn(S, d, generator=gen)
    W_q, W_k, W_v = (torch.randn(d, dk, generator=gen) for _ in range(3))
    try:
        result = attempt(fn, y, x, W_q, W_k, W_v)
    except NotAttempted:
        return not_attempted("cross_attention")
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseError("return a pair (output, weights)")
    out, w = result
    w = require_tensor("weights", w)
    if tuple(w.shape) == (S, L):
        raise ExerciseError(f"weights have shape {(S, L)}: queries and keys are swapped. Queries come from y "
                            f"(L={L} rows), keys and values from x (S={S} rows); weights are L x S")
    if tuple(w.shape) == (L, L):
        raise ExerciseError("weights are L x L: your keys come from y. In cross-attention keys and values come "
                            "from the other sequence, x")
    require_tensor("weights", w, (L, S))
    require_tensor("output", out, (L, dk))
    q, k, v = y @ W_q, x @ W_k, x @ W_v
    raw = q @ k.T
    if close(w, torch.softmax(raw, dim=-1)):
        raise ExerciseError("the weights are softmax(q k^T) without scaling: divide the scores by sqrt(dk)")
    if close(w, torch.softmax(raw / math.sqrt(dk), dim=0)):
        raise ExerciseError("softmax ran over the queries (dim=0): normalise each row over the keys, dim=-1")
    expected_w = torch.softmax(raw / math.sqrt(dk), dim=-1)
    if not close(w, expected_w):
        raise ExerciseError("the weights differ from softmax((y W_q)(x W_k)^T / sqrt(dk))")
    if not close(out, expected_w @ v):
        raise ExerciseError("the weights are right but the output is not weights @ (x W_v): values come from x")
    return passed("queries from one sequence, keys and values from the other: an L x S weight matrix")
