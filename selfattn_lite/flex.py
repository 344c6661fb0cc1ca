"""The course's masks written for torch's FlexAttention (``torch.nn.attention.flex_attention``).

FlexAttention (Dong et al., 2024) takes attention variants as two small functions:

* ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query q_idx attend to key kv_idx?
* ``score_mod(score, b, h, q_idx, kv_idx) -> score``: change one scaled score q.k / sqrt(E).

``create_block_mask`` evaluates the mask_mod for every (query, key) pair (``create_mask``: the function
vmapped over the whole B x H x L x S grid), then sums the dense mask per block of 128 x 128 pairs
(``_convert_mask_to_block_mask``) and records which blocks are empty (skipped), full (no masking
needed) or partial. A fused kernel
(``torch.compile(flex_attention)``, on a GPU) then never touches the empty blocks.

Here everything runs eagerly on the CPU, which torch allows for checking: eager flex_attention
computes the full score matrix (it warns that it is not fused; ``flex_attention`` below silences
exactly that warning, because equality, not speed, is what we use it for).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ._checks import check_bool, check_ids, check_int, check_positive_int, check_qkv, check_real, is_int, shape_str
from .positions import alibi_slopes

__all__ = [
    "causal_mod",
    "sliding_window_mod",
    "sink_window_mod",
    "document_mod",
    "alibi_score_mod",
    "block_mask",
    "flex_attention",
    "block_counts",
]

_UNFUSED_WARNING = "flex_attention called without torch.compile"


def causal_mod(b, h, q_idx, kv_idx):
    """mask_mod of causal attention: kv_idx <= q_idx.

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    _check_indices(q_idx, kv_idx)
    return q_idx >= kv_idx


def _check_indices(q_idx, kv_idx) -> None:
    for name, i in (("q_idx", q_idx), ("kv_idx", kv_idx)):
        if not (isinstance(i, Tensor) or is_int(i)):
            raise ValueError(f"{name} must be an integer tensor (or int) of positions, got {type(i).__name__}")


def sliding_window_mod(window: int):
    """mask_mod of a causal sliding window: q_idx - window < kv_idx <= q_idx (``window`` keys).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    check_positive_int("window", window)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def sink_window_mod(n_sink: int, window: int):
    """mask_mod of attention sinks + a causal window (``masks.sink_window_mask``).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    check_positive_int("window", window)
    n_sink = check_int("n_sink", n_sink, low=0)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((kv_idx < n_sink) | (q_idx - kv_idx < window))
    return mask_mod


def document_mod(doc_ids: Tensor, *, is_causal: bool = False):
    """mask_mod of a packed sequence (``masks.document_mask``): same document (and causal).

    Args:
        doc_ids: (T,) integer document id per token (one packed row).
        is_causal: also require kv_idx <= q_idx (default False, as ``masks.document_mask``).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    check_bool("is_causal", is_causal)
    doc_ids = check_ids("doc_ids", doc_ids)
    if doc_ids.dim() != 1 or doc_ids.is_floating_point() or doc_ids.dtype == torch.bool or len(doc_ids) < 1:
        raise ValueError(f"doc_ids must be a (T,) integer tensor, got shape {tuple(doc_ids.shape)} "
                         f"and dtype {doc_ids.dtype}")

    def mask_mod(b, h, q_idx, kv_idx):
        same = doc_ids[q_idx] == doc_ids[kv_idx]
        return same & (q_idx >= kv_idx) if is_causal else same
    return mask_mod


def alibi_score_mod(n_heads: int):
    """score_mod of ALiBi: score - m_h |q_idx - kv_idx| (``positions.alibi_bias`` as a function).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    slopes = alibi_slopes(check_positive_int("n_heads", n_heads))   # (h,)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()
    return score_mod


def block_mask(mask_mod, L: int, S: int | None = None, *, B: int | None = None, H: int | None = None,
               block_size: int = 128, device: torch.device | str | None = None):
    """``create_block_mask``: which (query block, key block) tiles hold any allowed pair.

    torch evaluates ``mask_mod`` on every (q_idx, kv_idx) pair, then counts the allowed pairs of each tile:
    none = skipped, all = full, some = partial (the kernel applies mask_mod inside those).

    Args:
        mask_mod: as above. L, S: queries and keys. B, H: None = the same mask for every
            batch row / head (broadcast). block_size: tile side (128 is torch's default).
        device: where the BlockMask lives (that of the q, k, v it will be used with). None: the
            device of the tensors ``mask_mod`` closes over (``document_mod``'s doc_ids, say), else the CPU.

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` on ``device``.

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if isinstance(mask_mod, Tensor) or not callable(mask_mod):
        hint = (": block_mask takes a mask *function* mask_mod(b, h, q_idx, kv_idx) -> bool, e.g. causal_mod; "
                "for a boolean (L, S) mask use attn_mask in scaled_dot_product_attention")
        raise ValueError(f"mask_mod must be a function, got {type(mask_mod).__name__}{hint}")
    L = check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    B = None if B is None else check_positive_int("B", B)
    H = None if H is None else check_positive_int("H", H)
    block_size = check_positive_int("block_size", block_size)
    device = _closure_device(mask_mod) if device is None else torch.device(device)
    return create_block_mask(mask_mod, B, H, L, S, device=device, BLOCK_SIZE=block_size)


def _closure_device(fn) -> torch.device:
    """The device of the first tensor a function closes over; the CPU when it closes over none."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:        # an empty cell
            continue
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")


def flex_attention(q: Tensor, k: Tensor, v: Tensor, *, score_mod=None, block_mask=None, scale: float | None = None):
    """torch's ``flex_attention``, eager (on the CPU), without its 'not compiled' warning.

    Args:
        q: (B, h, L, E), k: (B, h, S, E), v: (B, h, S, Ev).

    Returns:
        (B, h, L, Ev).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    from torch.nn.attention.flex_attention import flex_attention as _flex

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"flex_attention takes (B, h, T, E) tensors; {name} is {got}")
    check_qkv(q, k, v, enable_gqa=None, names=("q", "k", "v"))
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q {shape_str(q)} and k {shape_str(k)} must have the same number of heads")
    if score_mod is not None and not callable(score_mod):
        raise ValueError(f"score_mod must be None or a function (score, b, h, q_idx, kv_idx), "
                         f"got {type(score_mod).__name__}")
    if block_mask is not None:
        from torch.nn.attention.flex_attention import BlockMask

        if not isinstance(block_mask, BlockMask):
            raise ValueError(f"block_mask must be None or a BlockMask (see flex.block_mask), "
                             f"got {type(block_mask).__name__}")
        if tuple(block_mask.seq_lengths) != (q.shape[2], k.shape[2]):
            raise ValueError(f"block_mask was made for (L, S) = {tuple(block_mask.seq_lengths)}, but q "
                             f"{shape_str(q)} and k {shape_str(k)} have (L, S) = ({q.shape[2]}, {k.shape[2]})")
    if scale is not None:
        check_real("scale", scale)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNFUSED_WARNING, category=UserWarning)
        return _flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def block_counts(mask) -> dict:
    """Count the tiles of a ``BlockMask``: full, partial (need the mask_mod) and skipped.

    Read from the BlockMask itself: ``kv_num_blocks`` counts, per query block, the key
    blocks that are partial, and ``full_kv_num_blocks`` those that are fully allowed;
    every other tile is skipped.

    Returns:
        dict with ``total``, ``full``, ``partial``, ``skipped`` (tile counts over batch and
        heads as stored) and ``share_skipped`` (skipped / total).

    Taught in notebook 13, "5. The same masks as FlexAttention".
    """
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(mask, BlockMask):
        raise ValueError(f"mask must be a BlockMask (see flex.block_mask), got {type(mask).__name__}")
    q_blocks = mask.kv_num_blocks.shape[-1]
    kv_blocks = -(-mask.seq_lengths[1] // mask.BLOCK_SIZE[1])
    rows = mask.kv_num_blocks.numel() // q_blocks                    # (batch x heads) as stored
    partial = int(mask.kv_num_blocks.sum())
    full = int(mask.full_kv_num_blocks.sum()) if mask.full_kv_num_blocks is not None else 0
    total = rows * q_blocks * kv_blocks
    skipped = total - partial - full
    return dict(total=total, full=full, partial=partial, skipped=skipped, share_skipped=skipped / total)
