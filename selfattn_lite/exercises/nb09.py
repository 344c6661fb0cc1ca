"""Checkers for notebook 09: find and fix the bug in four short, realistic snippets.

Each checker runs the learner's fixed function on fresh inputs, compares it with a reference, and
when it is still wrong names the *bug class* (the pitfall of the notebook it belongs to): a missing
position offset, `repeat` for GQA, an inverted key-padding mask, dropout at inference...
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..positions import RotaryEmbedding
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_decode_step", "check_gqa_attention", "check_padded_self_attention", "check_attention_step"]


def _bug(pitfall: str, message: str) -> ExerciseError:
    return ExerciseError(f"bug class: {pitfall}. {message}")


# ----------------------------------------------------------------------------- 1. decode step with RoPE

def _decode_inputs(seed: int = 9, n_cached: int = 5, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(d)
    q, k, v = (torch.randn(1, 2, n_cached + 1, d, generator=g) for _ in range(3))   # (B, h, T, d)
    pos = torch.arange(n_cached + 1)
    reference = F.scaled_dot_product_attention(rope(q, pos), rope(k, pos), v, is_causal=True)[..., -1:, :]
    k_cache = rope(k[..., :-1, :], pos[:-1])                       # cached keys, rotated when they were new
    return rope, q[..., -1:, :], k[..., -1:, :], v[..., -1:, :], k_cache, v[..., :-1, :], reference, pos


def check_decode_step(fn) -> None:
    """``fn(q_new, k_new, v_new, k_cache, v_cache, rope) -> (out, k_all, v_all)`` for one new token."""
    rope, q_new, k_new, v_new, k_cache, v_cache, reference, pos = _decode_inputs()
    try:
        got = attempt(fn, q_new.clone(), k_new.clone(), v_new.clone(), k_cache.clone(), v_cache.clone(), rope)
    except NotAttempted:
        return not_attempted("decode_step")
    if not (isinstance(got, tuple) and len(got) == 3):
        raise ExerciseError("decode_step should return three things: (out, k_all, v_all)")
    out, k_all, v_all = got
    out = require_tensor("out", out, (1, 2, 1, 8))
    k_all = require_tensor("k_all", k_all, (1, 2, 6, 8))
    require_tensor("v_all", v_all, (1, 2, 6, 8))
    if close(out, reference) and close(k_all, torch.cat([k_cache, rope(k_new, pos[-1:])], dim=-2)):
        return passed("the new token is rotated at its true position, len(cache) + 0: cached decoding equals "
                      "full recomputation")
    at_zero = rope(k_new, torch.tensor([0]))
    if close(k_all[..., -1:, :], at_zero) or close(k_all[..., :1, :], at_zero):
        raise _bug("RoPE without the position offset (pitfall 9)",
                   "the new key is rotated as if it were at position 0; its position is the number of cached "
                   "tokens: positions = k_cache.shape[-2] + torch.arange(q_new.shape[-2])")
    if close(k_all[..., :1, :], rope(k_new, pos[-1:])):
        raise _bug("cache order", "the new key went in front of the cache: torch.cat([k_cache, k_new], dim=-2)")
    if close(k_all[..., :-1, :], rope(k_cache, pos[:-1])):
        raise _bug("double rotation", "the cached keys were rotated again: they were rotated when they were new; "
                   "rotate only q_new and k_new")
    if close(out, v_cache[..., :1, :]):
        raise _bug("is_causal=True with a cache (pitfall 8)",
                   "with is_causal=True torch aligns the mask top-left, so the single new query sees only key 0. "
                   "One new token may see every cached key: no mask")
    raise ExerciseError("the output differs from full causal attention over all 6 tokens: rotate q_new and k_new "
                        "at position len(cache), append k and v to the cache, attend over all keys")


# ----------------------------------------------------------------------------- 2. GQA with repeat

def check_gqa_attention(fn) -> None:
    """``fn(q, k, v) -> out``: causal GQA, q (B, h, T, d), k and v (B, h_kv, T, d); head i reads kv head i // g."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 6, 5, 4, generator=g)
    k, v = torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    try:
        got = attempt(fn, q.clone(), k.clone(), v.clone())
    except NotAttempted:
        return not_attempted("gqa_attention")
    got = require_tensor("gqa_attention(q, k, v)", got, (2, 6, 5, 4))
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True)
    if close(got, want):
        return passed("repeat_interleave(g, dim=1): query heads 0..g-1 read kv head 0, the grouping of enable_gqa")
    if close(got, F.scaled_dot_product_attention(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1), is_causal=True)):
        raise _bug("repeat instead of repeat_interleave (pitfall 11)",
                   "`.repeat` tiles the kv heads 0, 1, 0, 1, ...: query head 1 reads kv head 1. Use "
                   "`.repeat_interleave(g, dim=1)` (or F.scaled_dot_product_attention(..., enable_gqa=True))")
    mixed = [F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat(1, 3, 1, 1), is_causal=True),
             F.scaled_dot_product_attention(q, k.repeat(1, 3, 1, 1), v.repeat_interleave(3, 1), is_causal=True)]
    if any(close(got, m) for m in mixed):
        raise _bug("repeat instead of repeat_interleave (pitfall 11)",
                   "you fixed one of k and v but not the other: both must use repeat_interleave")
    if close(got, F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))):
        raise _bug("lost causal mask", "the grouping is right but the causal mask is gone: keep is_causal=True")
    raise ExerciseError("the output differs from causal attention where query head i reads kv head i // g")


# ----------------------------------------------------------------------------- 3. key padding mask polarity

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
        return passed("nn.MultiheadAttention reads key_padding_mask as True = ignore: pass ~keep (the real "
                      "tokens' rows equal each sequence run alone)")
    keep = torch.arange(6)[None, :] < lengths[:, None]
    with torch.no_grad():
        inverted = mha(x, x, x, key_padding_mask=keep)[0]
        unmasked = mha(x, x, x)[0]
    if close(got[1, :4], inverted[1, :4], atol=1e-5):
        raise _bug("mask polarity (pitfall 3)", "nn.MultiheadAttention reads a boolean key_padding_mask as "
                   "True = ignore, the opposite of F.scaled_dot_product_attention: your mask hides the real tokens "
                   "and keeps the padding. Pass ~keep")
    if close(got[1, :4], unmasked[1, :4], atol=1e-5):
        raise _bug("no padding mask", "the real tokens still attend to the padding: pass key_padding_mask")
    raise ExerciseError("the real tokens' outputs should equal each sequence run alone without its padding")


# ----------------------------------------------------------------------------- 4. dropout at inference

def check_attention_step(fn) -> None:
    """``fn(q, k, v, dropout_p, training) -> out``: causal SDPA with dropout only while training."""
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    try:
        first = attempt(fn, q, k, v, 0.5, False)
    except NotAttempted:
        return not_attempted("attention_step")
    first = require_tensor("attention_step(q, k, v, 0.5, training=False)", first, (1, 2, 6, 4))
    second = fn(q, k, v, 0.5, False)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if not torch.equal(first, second):
        raise _bug("SDPA dropout in eval mode (pitfall 7)",
                   "two calls with training=False differ: F.scaled_dot_product_attention is a function and "
                   "knows nothing about .eval(); pass dropout_p=dropout_p if training else 0.0")
    if close(first, F.scaled_dot_product_attention(q, k, v)):
        raise _bug("lost causal mask", "dropout is gated, but the causal mask is gone: keep is_causal=True")
    if not close(first, want):
        raise ExerciseError("with training=False the output should be plain causal attention")
    with torch.random.fork_rng():                                  # the learner's RNG state is left as it was
        torch.manual_seed(0)
        trained = fn(q, k, v, 0.5, True)
    if close(trained, want):
        raise _bug("dropout never applied", "with training=True the weights must be dropped (dropout_p=0.5): "
                   "gate dropout on training, do not remove it")
    return passed("dropout_p=dropout_p if training else 0.0: deterministic at inference, dropout while training")
