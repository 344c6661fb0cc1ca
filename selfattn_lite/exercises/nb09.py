"""Checkers for notebook 09: fix four classic bugs (merging heads, the decoding mask, GQA
expansion, fully masked rows)."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_merge_heads", "check_decode_mask", "check_expand_kv", "check_masked_weights"]


def check_merge_heads(fn) -> None:
    """``fn(out) -> (B, T, h * dk)`` for out (B, h, T, dk): token t's row holds every head's output for t."""
    B, h, T, dk = 2, 3, 4, 5
    out = torch.arange(B * h * T * dk, dtype=torch.float32).reshape(B, h, T, dk)
    try:
        got = attempt(fn, out.clone())
    except NotAttempted:
        return not_attempted("merge_heads")
    except RuntimeError as err:
        if "view" in str(err):
            raise ExerciseError("`.view` after `.transpose` fails: the transposed tensor is not contiguous. "
                                "Use `.reshape(...)` (or `.contiguous().view(...)`)") from None
        raise
    got = require_tensor("merge_heads(out)", got, (B, T, h * dk))
    want = out.transpose(1, 2).reshape(B, T, h * dk)
    if torch.equal(got, out.reshape(B, T, h * dk)):
        raise ExerciseError("you reshaped without transposing: row t now holds pieces of other tokens. "
                            "Bring the heads next to dk first: out.transpose(1, 2) -> (B, T, h, dk)")
    if torch.equal(got, out.permute(0, 2, 3, 1).reshape(B, T, h * dk)):
        raise ExerciseError("the features are ordered (dk, h): concatenate whole heads, head 0's dk values "
                            "first: transpose(1, 2) -> (B, T, h, dk), then reshape")
    if not torch.equal(got, want):
        raise ExerciseError(f"row 1 of batch 0 should be {want[0, 1, :6].tolist()}...: token 1 of head 0, then "
                            "token 1 of head 1, ...")
    return passed("transpose(1, 2) then reshape: each row is one token, heads concatenated in order")


def check_decode_mask(fn) -> None:
    """``fn(L, S) -> (L, S) bool``: L new queries after S - L cached keys, True = may attend."""
    try:
        got = attempt(fn, 3, 7)
    except NotAttempted:
        return not_attempted("decode_mask")
    got = require_tensor("decode_mask(3, 7)", got, (3, 7))
    if got.dtype != torch.bool:
        raise ExerciseError(f"return a bool mask (True = may attend), got dtype {got.dtype}")
    want = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)
    top_left = torch.ones(3, 7, dtype=torch.bool).tril()
    if torch.equal(got, top_left):
        raise ExerciseError("that is the top-left causal mask (what is_causal=True builds): new query 0 sees only "
                            "key 0. The new queries are the last L positions: query i sees keys 0 .. i + S - L")
    if torch.equal(got, ~want) or torch.equal(got, ~top_left):
        raise ExerciseError("polarity is flipped: True must mean 'may attend' (torch SDPA's convention)")
    if got.all():
        raise ExerciseError("no key is masked: new query 0 must not see the keys of new queries 1 and 2")
    if not torch.equal(got, want):
        raise ExerciseError(f"expected row 0 = {want[0].int().tolist()} (4 cached keys and itself); "
                            f"yours is {got[0].int().tolist()}")
    if not torch.equal(attempt(fn, 1, 5), torch.ones(1, 5, dtype=torch.bool)):
        raise ExerciseError("a single new token (L = 1) must see every key: decode_mask(1, 5) should be all True")
    return passed("a bottom-right causal mask: tril(diagonal = S - L)")


def check_expand_kv(fn) -> None:
    """``fn(k, n_heads) -> (B, n_heads, S, d)`` for k (B, h_kv, S, d): query heads j*g..(j+1)*g-1 share kv head j."""
    k = torch.arange(2 * 2 * 3 * 4, dtype=torch.float32).reshape(2, 2, 3, 4)   # h_kv = 2
    try:
        got = attempt(fn, k.clone(), 6)
    except NotAttempted:
        return not_attempted("expand_kv")
    got = require_tensor("expand_kv(k, 6)", got, (2, 6, 3, 4))
    if torch.equal(got, k.repeat(1, 3, 1, 1)):
        raise ExerciseError("`.repeat` tiles the heads as kv0, kv1, kv0, kv1, ...: query head 1 gets kv head 1. "
                            "Use `.repeat_interleave(g, dim=1)` for kv0, kv0, kv0, kv1, ...")
    want = k.repeat_interleave(3, dim=1)
    if not torch.equal(got, want):
        raise ExerciseError("query heads 0, 1, 2 must all read kv head 0, heads 3, 4, 5 kv head 1 "
                            "(repeat_interleave along dim 1)")
    return passed("repeat_interleave(n_heads // h_kv, dim=1), the grouping SDPA's enable_gqa uses")


def check_masked_weights(fn) -> None:
    """``fn(scores, mask) -> weights``: softmax over keys, True = may attend, zeros on rows with no key."""
    g = torch.Generator().manual_seed(9)
    scores = torch.randn(2, 3, 4, generator=g)
    mask = torch.rand(2, 3, 4, generator=g) > 0.3
    mask[..., 0] = True
    mask[1, 2] = False                                       # one query with no key at all
    try:
        got = attempt(fn, scores.clone(), mask.clone())
    except NotAttempted:
        return not_attempted("masked_weights")
    got = require_tensor("masked_weights(scores, mask)", got, scores.shape)
    want = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    if torch.isnan(got).any():
        raise ExerciseError("NaN in the fully masked row: softmax of all -inf is 0/0. Zero the rows where "
                            "mask.any(dim=-1) is False after the softmax")
    flipped = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1).nan_to_num(0.0)
    if close(got[0], flipped[0]):
        raise ExerciseError("polarity is flipped: True means 'may attend', so fill -inf where the mask is False")
    if close(got[1, 2], torch.full((4,), 0.25)):
        raise ExerciseError("the fully masked row is uniform (1/4 each): a large finite negative keeps softmax "
                            "finite but attends to keys that are all forbidden. Set that row's weights to 0")
    if not close(got[0], want[0]) or not close(got[1, :2], want[1, :2]):
        raise ExerciseError("rows with allowed keys should be softmax over the keys (dim=-1) of the masked scores")
    if not close(got[1, 2], torch.zeros(4)):
        raise ExerciseError("the row with no allowed key should be all zeros")
    return passed("masked softmax with zero weights (not NaN) where a query has no key")
