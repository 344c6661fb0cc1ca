"""Running the tiny decoder when the text outgrows its cache: windows, attention sinks, masks.

A cache that keeps only some keys (``kv_cache.SinkKVCache``, ``kv_cache.RollingKVCache``)
computes, token by token, what one causal forward pass computes under the equivalent mask
(``masks.sink_window_mask``). ``decode_logits`` does the first, ``masked_logits`` the
second; ``window_loss`` uses the mask to measure held-out loss for many windows at once.
``first_key_attention`` measures how much attention each head puts on the first token,
the "attention sink" of Xiao et al. (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_int, check_positive_int, check_tensor, shape_str
from .kv_cache import SinkKVCache
from .masks import sink_window_mask

__all__ = ["masked_logits", "sink_caches", "decode_logits", "window_loss", "first_key_attention"]


@torch.no_grad()
def masked_logits(model, ids: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """The tiny decoder's logits with an extra (T, T) boolean mask ANDed with its causal mask.

    ``model(ids, attn_mask=attn_mask)``: the model's own forward, positions 0 .. T-1 (keys keep their own).

    Args:
        model: a ``models.TinyDecoder``. ids: (B, T). attn_mask: (T, T) bool, True = may attend.

    Returns:
        (B, T, vocab) logits.

    Taught in notebook 13, "What it does to the tiny decoder".
    """
    _check_model(model)
    return model(ids, attn_mask=attn_mask)


def sink_caches(model, batch: int, *, window: int, n_sink: int = 0) -> list[SinkKVCache]:
    """One ``SinkKVCache`` per layer of ``model`` (n_sink = 0: a rolling window).

    Taught in notebook 13, "What it does to the tiny decoder".
    """
    _check_model(model)
    c, p = model.config, model.embed.weight
    return [SinkKVCache(batch, c.n_kv_heads, c.head_dim, window=window, n_sink=n_sink, dtype=p.dtype,
                        device=p.device) for _ in range(c.n_layers)]


@torch.no_grad()
def decode_logits(model, ids: Tensor, caches: list) -> Tensor:
    """Logits of every position, computed as a server would: prefill, then one token per step.

    The prompt prefilled at once is as long as the caches can take without evicting
    (n_sink + window tokens, or all of ids for a plain ``KVCache``); the rest is decoded
    one token at a time, each step attending only to what the caches still hold.

    Returns:
        (B, T, vocab) logits.

    Taught in notebook 13, "What it does to the tiny decoder".
    """
    _check_model(model)
    ids = model._check_ids(ids)
    if not isinstance(caches, list | tuple) or len(caches) != model.config.n_layers:
        got = f"{len(caches)} caches" if isinstance(caches, list | tuple) else type(caches).__name__
        raise ValueError(f"caches must be a list of one cache per layer ({model.config.n_layers}), got {got}")
    first = min(ids.shape[1], getattr(caches[0], "capacity", ids.shape[1]))
    logits = [model(ids[:, :first], caches=caches)]                      # prefill
    for t in range(first, ids.shape[1]):
        logits.append(model(ids[:, t:t + 1], caches=caches))             # decode: (B, 1, V)
    return torch.cat(logits, dim=1)


@torch.no_grad()
def window_loss(model, ids: Tensor, *, window: int | None, n_sink: int = 0, start: int = 0) -> float:
    """Mean next-token loss (nats) at positions >= start, each query seeing n_sink + window keys at most.

    Args:
        ids: (B, T) token ids (T <= the model's max_len).
        window: keys kept besides the sinks (None = full causal context).
        n_sink: first tokens every query keeps.
        start: first position whose prediction is scored (e.g. where the window starts to bite).

    Taught in notebook 13, "What it does to the tiny decoder".
    """
    _check_model(model)
    ids = model._check_ids(ids)
    start = check_int("start", start, low=0)
    n_sink = check_int("n_sink", n_sink, low=0)
    if window is not None:
        check_positive_int("window", window)
    T = ids.shape[1] - 1
    if start >= T:
        raise ValueError(f"start={start} leaves no prediction to score: ids {shape_str(ids)} give {T} "
                         f"next-token predictions, so start must be < {T}")
    mask = None if window is None else sink_window_mask(T, n_sink, window, device=ids.device)
    logits = masked_logits(model, ids[:, :-1], mask)[:, start:]          # (B, T - start, V)
    targets = ids[:, 1:][:, start:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)).item()


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "_check_ids"):
        raise ValueError(f"model must be a TinyDecoder (see models.load_tiny_decoder), got {type(model).__name__}")


def first_key_attention(weights: Tensor, start: int = 1) -> Tensor:
    """Attention each head puts on key 0, averaged over queries start .. T-1 (and the batch).

    Args:
        weights: (n_layers, B, h, T, T) or (n_layers, h, T, T) attention weights.
        start: first query counted (1 leaves out query 0 of a causal model, which can only see key 0).

    Returns:
        (n_layers, h) mean weight on the first key.

    Taught in notebook 13, "What it does to the tiny decoder".
    """
    check_tensor("weights", weights, floating=True)
    start = check_int("start", start, low=0)
    if weights.dim() == 4:
        weights = weights[:, None]
    if weights.dim() != 5 or weights.shape[-1] != weights.shape[-2] or not 0 <= start < weights.shape[-1]:
        raise ValueError(f"weights must be (n_layers, [B,] h, T, T) with 0 <= start < T, got "
                         f"{tuple(weights.shape)} and start={start}")
    return weights[..., start:, 0].mean(dim=(1, 3))                     # (n_layers, h)
