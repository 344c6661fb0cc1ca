"""Checkers for notebook 06: the cache size formula, one cached attention step, a cached decoding loop."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_kv_cache_bytes", "check_cached_attention", "check_generate"]


def check_kv_cache_bytes(fn) -> None:
    """``fn(n_layers, n_kv_heads, head_dim, n_tokens, batch, bytes_per_value)`` must return the bytes."""
    cases = [  # (layers, kv heads, head_dim, tokens, batch, bytes): Llama-2-7B, Llama-3-8B, a 70B, GPT-2
        (32, 32, 128, 4096, 1, 2),
        (32, 8, 128, 8192, 4, 2),
        (80, 8, 128, 1000, 3, 1),
        (12, 12, 64, 1024, 8, 4),
    ]
    got = []
    for case in cases:
        try:
            value = attempt(fn, *case)
        except NotAttempted:
            return not_attempted("kv_bytes")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExerciseError(f"return a number of bytes, got {type(value).__name__}")
        got.append(float(value))

    def right(L, h, d, t, b, n):
        return 2 * L * h * d * t * b * n

    mistakes = [  # (what the learner computed, the diagnosis); checked on every case at once
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) / 2,
         "The cache stores keys AND values: a factor 2"),
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) * 8,
         "You counted bits: bytes_per_value is already in bytes"),
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) / L,
         "Every layer has its own cache: multiply by n_layers"),
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) / b,
         "Each sequence of the batch has its own cache: multiply by batch"),
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) / n,
         "You counted values: multiply by bytes_per_value"),
        (lambda L, h, d, t, b, n: right(L, h, d, t, b, n) / t,
         "That is one token's cache: multiply by n_tokens"),
    ]
    wrong = [(case, g) for case, g in zip(cases, got) if g != right(*case)]
    if not wrong:
        return passed("2 x layers x kv_heads x head_dim x tokens x batch x bytes; Llama-2-7B at 4,096 tokens = "
                      f"{right(*cases[0]) / 2**30:.0f} GiB")
    (L, h, d, t, b, n), value = wrong[0]
    where = (f"for layers={L}, kv_heads={h}, head_dim={d}, tokens={t}, batch={b}, bytes={n}: expected "
             f"{right(L, h, d, t, b, n):,}, got {value:,.0f}")
    for formula, hint in mistakes:
        if all(g == formula(*case) for case, g in zip(cases, got)):
            raise ExerciseError(f"wrong {where}. {hint}")
    raise ExerciseError(f"wrong {where}; the formula is 2 x layers x kv_heads x head_dim x tokens x batch x bytes")


def _attend(q, k, v, scale=True, dim=-1):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=dim) @ v


def check_cached_attention(fn) -> None:
    """``fn(q, k_new, v_new, k_cache, v_cache)`` must return (output, k_all, v_all) for one decoding step.

    q, k_new, v_new: (B, h, 1, dk) of the newest token; k_cache, v_cache: (B, h, t, dk) of
    the t earlier tokens. k_all, v_all: (B, h, t + 1, dk), oldest first; output (B, h, 1, dk):
    the new token's attention over all t + 1 keys.
    """
    gen = torch.Generator().manual_seed(6)
    B, h, t, dk = 2, 3, 5, 8
    q, k_new, v_new = (torch.randn(B, h, 1, dk, generator=gen) for _ in range(3))
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
    if k_got.shape != k_all.shape:
        raise ExerciseError(f"k_all should have shape {tuple(k_all.shape)} = (B, h, t + 1, dk), got "
                            f"{tuple(k_got.shape)}: append the new key to the cached ones along the sequence dim, "
                            "torch.cat([k_cache, k_new], dim=-2)")
    if close(k_got, torch.cat([k_new, k_cache], dim=-2)):
        raise ExerciseError("k_all has the new key first: append it at the end, so position i stays at index i")
    if not close(k_got, k_all) or not close(v_got, v_all):
        raise ExerciseError("k_all / v_all are not the cached keys / values followed by the new ones")
    require_tensor("output", out, (B, h, 1, dk))
    if close(out, _attend(q, k_cache, v_cache)):
        raise ExerciseError("the output attends to the cached keys only: the new token must see itself too "
                            "(attend over k_all, v_all)")
    if close(out, _attend(q, k_all, v_all, scale=False)):
        raise ExerciseError("the scores are not scaled: divide q . k by sqrt(dk)")
    if not close(out, _attend(q, k_all, v_all)):
        raise ExerciseError("the output differs from softmax(q k_all^T / sqrt(dk)) v_all; no mask is needed: "
                            "the newest token may see every cached one")
    return passed("one decode step: append k, v to the cache, attend once over everything stored")


def check_generate(fn, model) -> None:
    """``fn(model, ids, n)`` must greedily append n tokens to ids (1, T) using one KVCache per layer.

    Compared with ``model.generate(ids, n)``; the tokens the model is run on are counted:
    a cached loop runs T (prefill) + n - 1 (one per step) of them.
    """
    ids = torch.tensor([[int(i) for i in torch.randint(0, model.config.vocab_size, (12,),
                                                         generator=torch.Generator().manual_seed(3))]])
    n = 10
    expected = model.generate(ids, n)
    seen = []
    def count(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("ids")
        seen.append(torch.as_tensor(tokens).shape[-1])

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
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
    needed = ids.shape[1] + n - 1
    if processed > needed:
        raise ExerciseError(f"right tokens, but the model ran on {processed} tokens; with a cache it needs "
                            f"{needed} (the prompt once, then one token per step). Pass caches= and feed only "
                            "the newest token")
    return passed(f"the same tokens as model.generate, running the model on {processed} tokens instead of "
                  f"{sum(range(ids.shape[1], ids.shape[1] + n))} without a cache")
