"""Attention masks. Every boolean mask here means True = may attend, as in torch SDPA.

Shapes: a mask broadcasts to the scores (..., L, S), L queries by S keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_ids, check_int, check_keep_mask, check_positive_int, check_tensor

__all__ = [
    "causal_mask",
    "padding_mask",
    "key_padding_to_attn_mask",
    "combine_masks",
    "to_additive",
    "is_fully_masked",
    "sink_window_mask",
    "window_mask_2d",
    "document_mask",
    "document_positions",
]


def causal_mask(L: int, S: int | None = None, *, bottom_right: bool = False, device=None) -> Tensor:
    """Boolean causal mask (L, S): query i may attend to key j when j <= i (+ offset).

    Top-left alignment (torch's ``is_causal=True``): query i sees keys 0..i.
    Bottom-right alignment: the L queries are the *last* L positions of S keys, so
    query i sees keys 0..i + (S - L). That is the one to use when new queries follow
    cached keys during decoding.

    Args:
        L: number of queries. S: number of keys (default L).
        bottom_right: align the diagonal to the bottom-right corner.

    Returns:
        (L, S) bool tensor, True = may attend.

    Taught in notebook 03, "2 · The causal mask".
    """
    check_bool("bottom_right", bottom_right)
    L = check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    offset = S - L if bottom_right else 0
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=offset)


def padding_mask(lengths, max_len: int | None = None) -> Tensor:
    """Boolean (B, max_len) mask of real tokens: True = real token, False = padding.

    Args:
        lengths: (B,) sequence lengths (list or int tensor), each 0 <= length <= max_len.
        max_len: padded length (default: the largest length).

    Returns:
        (B, max_len) bool tensor. To use it as an attention mask over keys, index it as
        ``mask[:, None, None, :]`` -> (B, 1, 1, S), or call ``key_padding_to_attn_mask``.

    Taught in notebook 03, "3 · Padding".
    """
    lengths = check_ids("lengths", lengths, what="a 1-D integer sequence")
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer sequence, got shape {tuple(lengths.shape)} "
                         f"and dtype {lengths.dtype}")
    if max_len is None:
        max_len = int(lengths.max()) if len(lengths) else 0
    max_len = check_int("max_len", max_len, low=0)
    if len(lengths) and (lengths.min() < 0 or lengths.max() > max_len):
        raise ValueError(f"every length must be in [0, max_len={max_len}], got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)   # (max_len,)
    return positions[None, :] < lengths[:, None]               # (B, max_len)


def key_padding_to_attn_mask(real_tokens: Tensor) -> Tensor:
    """(B, S) True = real key -> (B, 1, 1, S) attention mask over (B, h, L, S) scores.

    ``real_tokens`` is bool, or an integer 0/1 tensor such as Hugging Face's ``attention_mask``
    (1 = real token), read the same way.

    Taught in notebook 03, "3 · Padding".
    """
    check_tensor("real_tokens", real_tokens, dim=2, layout="(B, S)")
    real_tokens = check_keep_mask("real_tokens", real_tokens)
    return real_tokens[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND of boolean masks (a pair may attend only if every mask allows it), broadcast.

    ``None`` entries are skipped; returns None if all are None.

    Taught in notebook 03, "3 · Padding".
    """
    present = [check_tensor("each mask", m) for m in masks if m is not None]
    for m in present:
        if m.dtype != torch.bool:
            raise ValueError(f"combine_masks takes bool masks (True = may attend), got dtype {m.dtype}; "
                             "add float masks instead")
    if not present:
        return None
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        shapes = ", ".join(str(tuple(m.shape)) for m in present)
        raise ValueError(f"masks of shapes {shapes} do not broadcast together") from None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def to_additive(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Boolean mask (True = may attend) -> additive mask M: 0 where allowed, -inf where not.

    Taught in notebook 03, "1 · The additive mask".
    """
    check_tensor("mask", mask)
    if not dtype.is_floating_point:
        raise ValueError(f"an additive mask holds -inf, so its dtype must be floating, got {dtype}")
    if mask.dtype != torch.bool:
        raise ValueError(f"to_additive expects a bool mask (True = may attend), got dtype {mask.dtype}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def is_fully_masked(mask: Tensor) -> Tensor:
    """(..., L) bool: True for the query rows of a (..., L, S) boolean mask that see no key.

    Taught in notebook 03, "A query with nothing to look at".
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"expected a bool mask, got dtype {mask.dtype}")
    return ~mask.any(dim=-1)


def sink_window_mask(L: int, n_sink: int, window: int, *, device=None) -> Tensor:
    """Boolean (L, L) causal mask of attention sinks + a sliding window (StreamingLLM).

    Query i sees key j when j <= i and (j < n_sink or i - j < window): the first
    ``n_sink`` tokens for ever, plus the last ``window`` tokens (itself included).
    ``n_sink = 0`` is the causal sliding window of Mistral 7B.

    Returns:
        (L, L) bool, True = may attend.

    Taught in notebook 13, "3. Attention sinks and the rolling window: caches of constant size".
    """
    L = check_positive_int("L", L)
    window = check_positive_int("window", window)
    n_sink = check_int("n_sink", n_sink, low=0)
    i = torch.arange(L, device=device)[:, None]   # (L, 1) query positions
    j = torch.arange(L, device=device)[None, :]   # (1, L) key positions
    return (j <= i) & ((j < n_sink) | (i - j < window))


def window_mask_2d(h: int, w: int, window: int, shift: int = 0, *, device=None) -> Tensor:
    """Boolean (h*w, h*w) mask of window attention over an h x w grid of patches (Swin).

    Patches are numbered in raster order, p = r * w + c. The grid is cut into window x window
    squares whose borders sit ``shift`` patches below and to the right of the regular ones, and a
    patch may attend to the patches of its own square only:

        window id of a coordinate x = floor((x - shift) / window),
        (r, c) may attend to (r', c')  iff  both window ids agree along both axes.

    ``shift = 0`` is Swin's regular partition; ``shift = window // 2`` its shifted one, where the
    squares at the borders are cut smaller (Liu et al. 2021, Section 3.2). Swin computes the shifted
    case with a cyclic shift of the grid and a mask over the pieces that wrap around; the patterns
    are the same (notebook 08 checks it).
    Taught in notebook 08, section "Windows over image patches (Swin)".

    Args:
        h, w: the grid's rows and columns, both multiples of ``window``.
        window: the side M of a square window.
        shift: 0 <= shift < window.

    Returns:
        (h*w, h*w) bool, True = may attend. Symmetric; every patch sees itself.

    Taught in notebook 08, "Windows over image patches (Swin)".
    """
    h, w = check_positive_int("h", h), check_positive_int("w", w)
    window = check_positive_int("window", window)
    shift = check_int("shift", shift, low=0, high=window - 1)
    if h % window or w % window:
        raise ValueError(f"the grid h x w = {h} x {w} must be a whole number of windows of {window} x {window}")
    rows = torch.arange(h, device=device).repeat_interleave(w)     # (h*w,) row of each patch
    cols = torch.arange(w, device=device).repeat(h)                # (h*w,) column of each patch
    win_r = torch.div(rows - shift, window, rounding_mode="floor")
    win_c = torch.div(cols - shift, window, rounding_mode="floor")
    return (win_r[:, None] == win_r[None, :]) & (win_c[:, None] == win_c[None, :])


def _check_doc_ids(doc_ids) -> Tensor:
    doc_ids = check_ids("doc_ids", doc_ids, what="a (T,) or (B, T) integer tensor of document ids")
    if doc_ids.dim() not in (1, 2) or doc_ids.is_floating_point() or doc_ids.dtype == torch.bool \
            or doc_ids.shape[-1] < 1:
        raise ValueError(f"doc_ids must be a (T,) or (B, T) integer tensor with T >= 1, one document id per token, "
                         f"got shape {tuple(doc_ids.shape)} and dtype {doc_ids.dtype}")
    return doc_ids


def document_mask(doc_ids, *, is_causal: bool = False) -> Tensor:
    """Block-diagonal mask of a packed sequence: token i sees token j only in its own document.

    Packing puts several documents in one row to avoid padding; this mask keeps them
    from attending to each other, so the packed row computes what each document alone
    would (with per-document positions, ``document_positions``).

    Args:
        doc_ids: (T,) or (B, T) integer document id of each token (e.g. 0 0 0 1 1 2 2 2).
        is_causal: also require j <= i (a decoder). Default False, as every mask function here.

    Returns:
        (T, T) or (B, T, T) bool, True = may attend (same document, and j <= i if is_causal).

    Taught in notebook 13, "4. Packed sequences".
    """
    doc_ids = _check_doc_ids(doc_ids)
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be True or False, got {is_causal!r}")
    same = doc_ids[..., :, None] == doc_ids[..., None, :]      # (..., T, T)
    if is_causal:
        T = doc_ids.shape[-1]
        same = same & torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return same


def document_positions(doc_ids) -> Tensor:
    """Position of each token within its own document: 0, 1, 2, ... restarting at each new document.

    A document is a run of equal consecutive ids. With RoPE these positions make a packed
    document rotate its queries and keys exactly as it would alone.

    Args:
        doc_ids: (T,) or (B, T) integer document ids.

    Returns:
        Long tensor of doc_ids' shape.

    Taught in notebook 13, "4. Packed sequences".
    """
    doc_ids = _check_doc_ids(doc_ids)
    T = doc_ids.shape[-1]
    idx = torch.arange(T, device=doc_ids.device).expand(doc_ids.shape)          # (..., T)
    starts = torch.ones(doc_ids.shape, dtype=torch.bool, device=doc_ids.device)
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]                     # a new document begins
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - start_idx
