"""Checkers for notebook 09: find and fix the bug in short, realistic snippets, and write a property test.

Each checker runs the learner's fixed function on fresh inputs and compares it with a reference
(torch, or each sequence run alone). When the answer is still wrong it names the *bug class* it sees
(a window aligned top-left or one too wide, a float mask read as a boolean one, the wrong
width in the scale, an inverted key-padding mask), never the corrected line. ``check_leaks_future``
grades a test the learner writes: it must pass correct causal attention and catch planted leaks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..masks import causal_mask
from ..positions import alibi_bias
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_window_chunk", "check_padded_sdpa", "check_multi_head_attention", "check_padded_self_attention",
           "check_leaks_future"]


def _bug(pitfall: str, message: str) -> ExerciseError:
    return ExerciseError(f"bug class: {pitfall}. {message}")


# ----------------------------------------------------------------------------- 1. a sliding window over a cache

def _band(n_new: int, n_all: int, window: int, *, offset: int | None = None, causal: bool = True) -> torch.Tensor:
    """(n_new, n_all) bool, True = may attend: query i, at position offset + i, sees the keys j with
    0 <= (offset + i) - j < window. offset defaults to n_all - n_new (the new tokens are the last positions)."""
    p = (n_all - n_new if offset is None else offset) + torch.arange(n_new)[:, None]   # (n_new, 1) query positions
    j = torch.arange(n_all)[None, :]                                                  # (1, n_all) key positions
    return ((j <= p) if causal else torch.ones_like(j <= p)) & (p - j < window)


def _window_inputs(seed: int, n_cached: int, n_new: int, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n_cached + n_new, d, generator=g) for _ in range(3))   # (B, h, T, d)
    return q[..., n_cached:, :], k, v


def check_window_chunk(fn) -> None:
    """``fn(q_new, k_all, v_all, window) -> out``: sliding-window attention for a chunk of new tokens.

    q_new (B, h, n_new, d): the queries of the n_new newest tokens; k_all, v_all (B, h, n_all, d): the
    cached tokens' keys and values followed by the new ones. The query at position p sees the keys at
    positions p - window + 1 .. p (window keys, itself included). out (B, h, n_new, d) must equal the
    last n_new rows of sliding-window attention over all n_all tokens.
    """
    n_cached, n_new, window = 6, 3, 4
    q_new, k, v = _window_inputs(9, n_cached, n_new)
    n_all = n_cached + n_new
    try:
        got = attempt(fn, q_new.clone(), k.clone(), v.clone(), window)
    except NotAttempted:
        return not_attempted("window_chunk_attention")
    got = require_tensor("window_chunk_attention(q_new, k_all, v_all, window)", got, tuple(q_new.shape))

    def with_mask(mask):
        return F.scaled_dot_product_attention(q_new, k, v, attn_mask=mask)

    if close(got, with_mask(_band(n_new, n_all, window))):
        q1, k1, v1 = _window_inputs(10, 5, 1)                                        # one decoding step, window 3
        got1 = require_tensor("window_chunk_attention for one new token", attempt(fn, q1, k1, v1, 3), tuple(q1.shape))
        if not close(got1, F.scaled_dot_product_attention(q1, k1, v1, attn_mask=_band(1, 6, 3))):
            raise ExerciseError("right for this chunk, wrong for one new token after 5 cached ones with window 3: "
                                "the mask must follow from the shapes and the window, not from these sizes")
        return passed(f"each of the {n_new} new tokens (positions {n_cached}..{n_all - 1}) sees itself and the "
                      f"{window - 1} tokens before it: the chunk equals the last rows of sliding-window attention "
                      "over the whole sequence")
    if any(close(got, with_mask(_band(n_new, n_all, w, offset=0))) for w in (window - 1, window, window + 1)):
        raise _bug("a mask aligned top-left (the alignment of pitfall 8)",
                   f"the new queries are placed at positions 0..{n_new - 1}, so new token 0 sees key 0 only. They "
                   f"are the last {n_new} of {n_all} positions. Without a cache the two alignments agree, which is "
                   "why a test on a whole prompt misses this")
    if close(got, with_mask(_band(n_new, n_all, window + 1))):
        raise _bug("a window one too wide", f"each query sees {window + 1} keys: itself and the {window} before it. "
                   f"A window of {window} holds {window} keys, itself included")
    if close(got, with_mask(_band(n_new, n_all, window - 1))):
        raise _bug("a window one too narrow", f"each query sees {window - 1} keys; a window of {window} holds "
                   f"{window} keys, itself included")
    if close(got, with_mask(causal_mask(n_new, n_all, bottom_right=True))):
        raise _bug("no window", "each new token sees the whole cache: that is causal attention, not a sliding window")
    if any(close(got, with_mask(_band(n_new, n_all, w, causal=False))) for w in (window, window + 1)) \
            or close(got, F.scaled_dot_product_attention(q_new, k, v)):
        raise _bug("the future is visible", "a new token sees the new tokens after it: the window must also stop "
                   "at the query's own position")
    if close(got, with_mask(~_band(n_new, n_all, window))):
        raise _bug("mask polarity (pitfall 3)", "the mask lets each query see exactly the keys it must not: "
                   "F.scaled_dot_product_attention reads True as may attend")
    raise ExerciseError("the output differs from the last rows of sliding-window attention over the cache and "
                        "the chunk")


# ----------------------------------------------------------------------------- 2. a float padding mask

def _padded_sdpa_inputs(seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 2, 6, 4, generator=g) for _ in range(3))              # (B, h, T, d)
    return q, k, v, torch.tensor([6, 4, 2])


def _alone(q, k, v, lengths) -> list[torch.Tensor]:
    """Each sequence run alone on its real tokens: (h, n, d) per sequence."""
    return [F.scaled_dot_product_attention(q[b, :, :n], k[b, :, :n], v[b, :, :n])
            for b, n in enumerate(lengths.tolist())]


def check_padded_sdpa(fn) -> None:
    """``fn(q, k, v, lengths) -> (B, h, T, d)``: no real token attends to a padded key (SDPA, no causal mask)."""
    q, k, v, lengths = _padded_sdpa_inputs()
    try:
        got = attempt(fn, q.clone(), k.clone(), v.clone(), lengths.clone())
    except NotAttempted:
        return not_attempted("padded_sdpa")
    got = require_tensor("padded_sdpa(q, k, v, lengths)", got, tuple(q.shape))
    if torch.isnan(got[0]).any():
        raise _bug("fully masked rows (pitfall 4)", "the full-length sequence came out NaN: its queries had every key "
                   "masked. Check which keys your mask hides")
    want = _alone(q, k, v, lengths)
    if all(close(got[b, :, :n], want[b]) for b, n in enumerate(lengths.tolist())):
        return passed("the real tokens attend only to real keys: each sequence's real rows equal the sequence run "
                      "alone, whatever its padding")
    keep = torch.arange(6)[None, :] < lengths[:, None]                               # (B, S)
    as_float = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.float()[:, None, None, :])
    if close(got[1], as_float[1]) or close(got[1], F.scaled_dot_product_attention(q, k, v)[1]):
        raise _bug("a float mask read as a boolean one",
                   "the padding is still attended. A float attn_mask is *added* to the scores (-inf hides a key, "
                   "0 keeps it), only a torch.bool mask means may attend / may not; 1.0 and 0.0 hide nothing")
    if close(got[1], F.scaled_dot_product_attention(q, k, v, attn_mask=~keep[:, None, None, :])[1]):
        raise _bug("mask polarity (pitfall 3)", "your mask hides the real tokens and keeps the padding: "
                   "F.scaled_dot_product_attention reads a boolean True as may attend")
    raise ExerciseError("the real tokens' outputs should equal each sequence run alone without its padding")


# ----------------------------------------------------------------------------- 3. the scale of a multi-head layer

def _mha_inputs(seed: int = 13, d_model: int = 32, n_heads: int = 4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, d_model, generator=g)
    w_qkv = torch.randn(d_model, 3 * d_model, generator=g) / math.sqrt(d_model)
    return x, w_qkv, n_heads


def _heads_attention(x, w_qkv, n_heads, scale=None, is_causal=True):
    B, T, d_model = x.shape
    q, k, v = (t.reshape(B, T, n_heads, -1).transpose(1, 2) for t in (x @ w_qkv).chunk(3, dim=-1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)    # (B, h, T, d_head)
    return out.transpose(1, 2).reshape(B, T, d_model)


def check_multi_head_attention(fn) -> None:
    """``fn(x, w_qkv, n_heads) -> (B, T, d_model)``: causal multi-head attention, scale 1/sqrt(d_head) per head."""
    x, w_qkv, n_heads = _mha_inputs()
    d_model = x.shape[-1]
    try:
        got = attempt(fn, x.clone(), w_qkv.clone(), n_heads)
    except NotAttempted:
        return not_attempted("multi_head_attention")
    got = require_tensor("multi_head_attention(x, w_qkv, n_heads)", got, tuple(x.shape))
    if close(got, _heads_attention(x, w_qkv, n_heads)):
        return passed(f"each head's scores are divided by sqrt(d_head) = sqrt({d_model // n_heads}), the width of "
                      "the vectors in the dot product: equal to F.scaled_dot_product_attention head by head")
    for scale, what in ((1 / math.sqrt(d_model), f"sqrt(d_model) = sqrt({d_model}), the model's width"),
                        (1.0, "nothing (pitfall 1)"), (1 / d_model, "d_model"), (1 / (d_model // n_heads), "d_head")):
        if close(got, _heads_attention(x, w_qkv, n_heads, scale=scale)):
            raise _bug("the wrong width in the scale", f"the scores are divided by {what}. The dot products are "
                       "over one head's vectors: which width sets their variance?")
    if close(got, _heads_attention(x, w_qkv, n_heads, is_causal=False)):
        raise _bug("lost causal mask", "the scale is right but the causal mask is gone")
    raise ExerciseError("the output differs from causal multi-head attention (torch's SDPA run head by head)")


# ----------------------------------------------------------------------------- 4. key padding mask polarity

def _padded_reference(mha: nn.MultiheadAttention, x: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """Each sequence run alone on its real tokens: what the real rows must equal."""
    with torch.no_grad():
        return [mha(x[b:b + 1, :n], x[b:b + 1, :n], x[b:b + 1, :n])[0][0] for b, n in enumerate(lengths.tolist())]


def check_padded_self_attention(fn) -> None:
    """``fn(mha, x, lengths) -> (B, T, d)``: no query attends to padding (nn.MultiheadAttention, batch_first)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, 6, 8, generator=g)
    lengths = torch.tensor([6, 4, 2])
    try:
        with torch.no_grad():
            got = attempt(fn, mha, x.clone(), lengths.clone())
    except NotAttempted:
        return not_attempted("padded_self_attention")
    got = require_tensor("padded_self_attention(mha, x, lengths)", got, (3, 6, 8))
    want = _padded_reference(mha, x, lengths)
    if all(close(got[b, :n], want[b], atol=1e-5) for b, n in enumerate(lengths.tolist())):
        return passed("no real token attends to padding: the real tokens' rows equal each sequence run alone")
    keep = torch.arange(6)[None, :] < lengths[:, None]
    with torch.no_grad():
        inverted = mha(x, x, x, key_padding_mask=keep)[0]
        unmasked = mha(x, x, x)[0]
    if torch.isnan(got[0]).all() or close(got[1, :4], inverted[1, :4], atol=1e-5):
        raise _bug("mask polarity (pitfall 3)", "your mask hides the real tokens and keeps the padding (the "
                   "full-length sequence has every key hidden: NaN). nn.MultiheadAttention does not read a "
                   "boolean key_padding_mask the way F.scaled_dot_product_attention reads attn_mask")
    if close(got[1, :4], unmasked[1, :4], atol=1e-5):
        raise _bug("no padding mask", "the real tokens still attend to the padding")
    raise ExerciseError("the real tokens' outputs should equal each sequence run alone without its padding")


# ----------------------------------------------------------------------------- 3. write the property test

def _causal_candidates():
    """(name, attn, leaks) triples: attention functions (q, k, v) -> out, all (B, T, d), meant to be causal."""
    def sdpa_causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def by_hand_causal(q, k, v):
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores.masked_fill(~causal_mask(T, T), float("-inf")), dim=-1) @ v

    def alibi_causal(q, k, v):                                        # causal, plus ALiBi's distance penalty
        T = q.shape[-2]
        bias = alibi_bias(8, T)[0]                                    # (T, T) -(i - j) / 2: the steepest of 8 heads
        bias = bias.masked_fill(~causal_mask(T, T), float("-inf"))    # -inf on the keys ahead
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def no_mask(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def one_ahead(q, k, v):                                           # each token also sees the next one
        T = q.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, T, dtype=torch.bool).tril(1))

    def softmax_over_queries(q, k, v):                                # causal mask, softmax over the wrong dim
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores.masked_fill(~causal_mask(T, T), float("-inf")), dim=-2) @ v

    return [("SDPA with is_causal=True", sdpa_causal, False),
            ("a hand-written causal attention", by_hand_causal, False),
            ("a causal attention with ALiBi's distance bias", alibi_causal, False),
            ("no mask", no_mask, True), ("one_ahead", one_ahead, True), ("queries", softmax_over_queries, True)]


def check_leaks_future(fn) -> None:
    """``fn(attn) -> bool``: True when the causal attention ``attn(q, k, v)`` lets an output row see a later token.

    The checker hands ``fn`` three correct causal attentions (one adds ALiBi's distance bias, so its output
    differs from SDPA's: comparing with a reference is not the property) and three that leak the future (no
    mask, a mask that also shows the next token, a softmax taken over the queries), and names the one it gets
    wrong.
    """
    verdicts = {}
    for name, attn, leaks in _causal_candidates():
        try:
            got = attempt(fn, attn)
        except NotAttempted:
            return not_attempted("leaks_future")
        if not isinstance(got, (bool, torch.Tensor)) or (isinstance(got, torch.Tensor) and got.numel() != 1):
            raise ExerciseError(f"leaks_future(attn) should return True or False, got {type(got).__name__}")
        verdicts[name] = (bool(got), leaks)
    for name in ("SDPA with is_causal=True", "a hand-written causal attention"):
        if verdicts[name][0]:
            raise ExerciseError(f"your test says {name} leaks the future, but it is correct: change only tokens "
                                "after the rows you compare, and compare with a tolerance (float rounding)")
    if verdicts["a causal attention with ALiBi's distance bias"][0]:
        raise ExerciseError("your test says a causal attention with ALiBi's distance bias leaks the future, but it "
                            "is correct: its numbers differ from SDPA's, and differing from a reference is not a "
                            "leak. Test the property itself: the rows before a change must not move")
    if not verdicts["no mask"][0]:
        raise ExerciseError("your test misses an attention with no mask at all: change a later token, run attn "
                            "again, and compare the rows before it")
    if not verdicts["one_ahead"][0]:
        raise ExerciseError("your test misses a mask that lets each token see only the *next* one: a change "
                            "to a late token moves only the row just before it, so compare every earlier row "
                            "(and try more than one position)")
    if not verdicts["queries"][0]:
        raise ExerciseError("your test misses a leak through the queries: with softmax over the wrong dim, a row's "
                            "weights depend on later *queries*, so changing a later value alone shows nothing; "
                            "change the later token itself (its q, k and v)")
    return passed("your test accepts the three correct causal attentions, one of them with numbers unlike SDPA's, "
                  "and catches all three leaks")
