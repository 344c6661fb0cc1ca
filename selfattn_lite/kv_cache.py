"""The KV cache: keep every past key and value so a decoding step only computes the new token's.

During generation each new token attends to the keys and values of every earlier token,
in every layer. Without a cache they are recomputed from the whole context at each step;
with one they are computed once, stored, and read back. Its size is

    bytes = 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes_per_value

This module holds the per-layer ``KVCache`` and what serving systems add: a paged block allocator
(``PagedKVCache``), an 8-bit cache (``Int8KVCache``), and two caches of constant size,
``SinkKVCache`` (StreamingLLM's first tokens + a rolling window) and ``RollingKVCache``
(a ring buffer of the last ``window`` tokens, as in Mistral 7B). The size formula
``kv_cache_bytes`` and the presets of real models are in ``presets`` (re-exported here).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_float_dtype, check_int, check_positive_int, check_tensor, shape_str
from .presets import PRESETS, ModelPreset, format_bytes, get_preset, kv_cache_bytes  # re-exported

__all__ = [
    "TokenCache",
    "KVCache",
    "kv_cache_bytes",
    "ModelPreset",
    "PRESETS",
    "get_preset",
    "format_bytes",
    "PagedKVCache",
    "paging_waste",
    "quantize_int8",
    "dequantize_int8",
    "Int8KVCache",
    "SinkKVCache",
    "RollingKVCache",
]


# --------------------------------------------------------------------------------------
# The cache of one layer
# --------------------------------------------------------------------------------------
class TokenCache:
    """What every cache here shares: B sequences, at most ``max_len`` tokens, filled left to right.

    Subclasses allocate their buffers (``_buffers`` names them) and write into them; this class
    does the bookkeeping: ``len``, ``reset``, ``crop``, ``nbytes`` and the overflow check.
    ``len(cache)`` is the number of tokens stored, which is also the position of the next token
    (what RoPE needs).

    Taught in notebook 13, "1. Multi-head latent attention".
    """

    _buffers: tuple[str, ...] = ()
    kind = "KV cache"                                   # in messages

    def __init__(self, batch: int, max_len: int):
        self.batch = check_positive_int("batch", batch)
        self.max_len = check_positive_int("max_len", max_len)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated buffers (all max_len slots)."""
        return sum(getattr(self, name).nbytes for name in self._buffers)

    def _reserve(self, t_new: int) -> tuple[int, int]:
        """The slots [start, end) of ``t_new`` more tokens; ValueError when they do not fit."""
        if t_new < 1:
            raise ValueError(f"an update must hold at least one new token, got T_new = {t_new}")
        if self._len + t_new > self.max_len:
            raise ValueError(
                f"{self.kind} overflow: it holds {self._len} tokens, {t_new} more would make "
                f"{self._len + t_new} > max_len = {self.max_len}; allocate a larger max_len or reset()")
        return self._len, self._len + t_new

    def reset(self) -> None:
        """Forget every stored token (the buffers stay allocated, for the next sequence)."""
        self._len = 0

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` tokens (roll back a rejected draft, re-decode a suffix)."""
        self._len = check_int("crop length", length, low=0, high=self._len)


class KVCache(TokenCache):
    """Preallocated keys and values of one attention layer, filled left to right.

    ``update(k, v)`` writes the new tokens' keys and values at positions
    [len, len + T_new) and returns everything stored so far; ``len(cache)`` is the number
    of tokens stored, which is also the position of the next token (what RoPE needs).

    Args:
        batch: B, sequences decoded together.
        n_kv_heads: key/value heads of the layer (n_heads for MHA, fewer for GQA/MQA).
        max_len: the most tokens the cache can hold (prompt + generated).
        head_dim: dk, the size of one head's key/value vector.
        dtype, device: of the keys and values ``update`` takes and returns.

    Attributes:
        k, v: the (B, n_kv_heads, max_len, head_dim) buffers (only [:len] is meaningful).

    Taught in notebook 06, "The package's `KVCache`".
    """

    _buffers = ("k", "v")

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, max_len)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.dtype = check_float_dtype("dtype", dtype)
        self._allocate((self.batch, self.n_kv_heads, self.max_len, self.head_dim), device)

    def _allocate(self, shape: tuple[int, int, int, int], device) -> None:
        self.k = torch.zeros(shape, dtype=self.dtype, device=device)  # (B, h_kv, max_len, dk)
        self.v = torch.zeros(shape, dtype=self.dtype, device=device)  # (B, h_kv, max_len, dk)

    @property
    def device(self) -> torch.device:
        return self.k.device

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch={self.batch}, n_kv_heads={self.n_kv_heads}, "
                f"max_len={self.max_len}, head_dim={self.head_dim}, dtype={self.dtype}, len={self._len})")

    @property
    def n_kept(self) -> int:
        """Slots in use (the tokens stored)."""
        return self._len

    @property
    def used_bytes(self) -> int:
        """Bytes of the slots in use: 2 x B x h_kv x n_kept x dk x bytes per value."""
        return 2 * self.batch * self.n_kv_heads * self.n_kept * self.head_dim * self.k.element_size()

    def _check(self, k: Tensor, v: Tensor) -> int:
        """T_new of the new keys and values, if they fit this cache's shape, dtype and device."""
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t)
            if t.dim() != 4 or t.shape[0] != self.batch or t.shape[1] != self.n_kv_heads \
                    or t.shape[3] != self.head_dim:
                raise ValueError(
                    f"{name} must have shape (B={self.batch}, n_kv_heads={self.n_kv_heads}, T_new, "
                    f"head_dim={self.head_dim}) to fit this cache, got {shape_str(t)}")
            if t.dtype != self.dtype:
                raise ValueError(f"{name} has dtype {t.dtype} but the cache holds {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device} but the cache is on {self.device}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got k {shape_str(k)} and v {shape_str(v)}")
        if k.shape[2] < 1:
            raise ValueError(f"k and v must hold at least one new token, got T_new = 0 ({shape_str(k)})")
        return k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new tokens' keys and values; return all stored keys and values.

        Args:
            k, v: (B, n_kv_heads, T_new, head_dim), the new tokens (T_new = prompt length
                at prefill, 1 per decoding step, or a chunk).

        Returns:
            k_all, v_all: (B, n_kv_heads, len + T_new, head_dim) views of the buffers
            (no copy), oldest token first.

        Raises:
            ValueError: on a shape, dtype or device that does not fit, or on overflow.
        """
        start, end = self._reserve(self._check(k, v))
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self._len = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, h_kv, len, dk)


# --------------------------------------------------------------------------------------
# Paged allocation (the idea of vLLM's PagedAttention)
# --------------------------------------------------------------------------------------
class PagedKVCache:
    """A KV cache for many sequences, stored in fixed-size blocks taken from one shared pool.

    Instead of reserving max_len slots per request up front, a sequence gets a new block
    of ``block_size`` token slots only when its last block is full. A per-sequence
    *block table* lists the pool blocks it owns, in order; reading a sequence back
    gathers those blocks. The only waste is the unfilled tail of each sequence's last block.

    Args:
        n_blocks: size of the pool, in blocks.
        block_size: token slots per block.
        n_kv_heads, head_dim: as in ``KVCache``.

    Attributes:
        k_pool, v_pool: (n_blocks, n_kv_heads, block_size, head_dim).
        block_tables: sequence id -> list of pool block indices.
        lengths: sequence id -> tokens stored.

    Taught in notebook 06, "Paged allocation".
    """

    def __init__(self, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self.n_blocks = check_positive_int("n_blocks", n_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        check_float_dtype("dtype", dtype)
        shape = (n_blocks, n_kv_heads, block_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.free_blocks = list(range(n_blocks - 1, -1, -1))  # a stack: pop() gives 0, 1, 2, ...
        self.block_tables: dict = {}
        self.lengths: dict = {}

    def blocks_needed(self, seq_id, n_new: int) -> int:
        """How many new blocks appending ``n_new`` tokens to a sequence takes."""
        n_new = check_int("n_new", n_new, low=0)
        length = self.lengths.get(seq_id, 0)
        have = len(self.block_tables.get(seq_id, []))
        return math.ceil((length + n_new) / self.block_size) - have

    def append(self, seq_id, k: Tensor, v: Tensor) -> None:
        """Store T_new >= 1 tokens of one sequence: k, v (n_kv_heads, T_new, head_dim)."""
        check_tensor("k", k)
        check_tensor("v", v)
        expected = (self.n_kv_heads, k.shape[1] if k.dim() == 3 else -1, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or tuple(t.shape) != expected or t.dtype != self.k_pool.dtype:
                raise ValueError(f"{name} must be (n_kv_heads={self.n_kv_heads}, T_new, head_dim={self.head_dim}) "
                                 f"of dtype {self.k_pool.dtype}, got {shape_str(t)} of dtype {t.dtype}")
            if t.device != self.k_pool.device:
                raise ValueError(f"{name} is on {t.device} but the cache is on {self.k_pool.device}")
        if k.shape[1] < 1:
            raise ValueError(f"an append must hold at least one new token, got k {shape_str(k)}")
        needed = self.blocks_needed(seq_id, k.shape[1])
        if needed > len(self.free_blocks):
            raise ValueError(f"paged cache out of blocks: sequence {seq_id!r} needs {needed} more but only "
                             f"{len(self.free_blocks)} of the {self.n_blocks} blocks of {self.block_size} tokens "
                             f"are free; free a finished sequence")
        table = self.block_tables.setdefault(seq_id, [])
        length = self.lengths.get(seq_id, 0)
        for t in range(k.shape[1]):
            slot = length % self.block_size
            if slot == 0:                      # the last block is full (or there is none yet)
                table.append(self.free_blocks.pop())
            block = table[-1]
            self.k_pool[block, :, slot] = k[:, t]
            self.v_pool[block, :, slot] = v[:, t]
            length += 1
        self.lengths[seq_id] = length

    def gather(self, seq_id) -> tuple[Tensor, Tensor]:
        """The keys and values of one sequence, contiguous: (n_kv_heads, len, head_dim) each."""
        if seq_id not in self.block_tables:
            raise ValueError(f"unknown sequence {seq_id!r}: seq_id must be one of the stored {list(self.block_tables)}")
        table = torch.tensor(self.block_tables[seq_id], device=self.k_pool.device)
        n = self.lengths[seq_id]
        k = self.k_pool[table].transpose(0, 1).reshape(self.n_kv_heads, -1, self.head_dim)[:, :n]
        v = self.v_pool[table].transpose(0, 1).reshape(self.n_kv_heads, -1, self.head_dim)[:, :n]
        return k, v  # (h_kv, len, dk)

    def free(self, seq_id) -> None:
        """Return a finished sequence's blocks to the pool."""
        if seq_id not in self.block_tables:
            raise ValueError(f"unknown sequence {seq_id!r}: seq_id must be one of the stored {list(self.block_tables)}")
        self.free_blocks.extend(reversed(self.block_tables.pop(seq_id)))
        del self.lengths[seq_id]

    @property
    def blocks_in_use(self) -> int:
        return self.n_blocks - len(self.free_blocks)

    @property
    def tokens_stored(self) -> int:
        return sum(self.lengths.values())

    @property
    def slots_reserved(self) -> int:
        return self.blocks_in_use * self.block_size


def paging_waste(lengths, max_len: int, block_size: int) -> dict:
    """Token slots reserved for a batch of requests: contiguous max-length versus paged.

    A contiguous cache reserves ``max_len`` slots per request (the final length is not
    known in advance); a paged one reserves ceil(length / block_size) blocks.

    Args:
        lengths: final length (prompt + generated) of each request, each <= max_len.

    Returns:
        dict with ``tokens`` (slots actually used), ``contiguous`` and ``paged`` (slots
        reserved), and ``contiguous_waste`` / ``paged_waste`` (share of reserved slots unused).

    Taught in notebook 06, "Paged allocation".
    """
    if isinstance(lengths, str) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"lengths must be a list of ints, got {type(lengths).__name__}")
    lengths = [check_int("each length", n) for n in lengths]
    check_positive_int("max_len", max_len)
    check_positive_int("block_size", block_size)
    if any(n < 0 or n > max_len for n in lengths):
        raise ValueError(f"every length must be in [0, max_len={max_len}], got {lengths}")
    tokens = sum(lengths)
    contiguous = max_len * len(lengths)
    paged = sum(math.ceil(n / block_size) * block_size for n in lengths)
    return dict(tokens=tokens, contiguous=contiguous, paged=paged,
                contiguous_waste=1 - tokens / contiguous if contiguous else 0.0,
                paged_waste=1 - tokens / paged if paged else 0.0)


# --------------------------------------------------------------------------------------
# 8-bit cache quantisation
# --------------------------------------------------------------------------------------
def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric absmax int8 quantisation of each vector along the last dim.

    For a key/value tensor (B, h, T, dk) that is one scale per head and per token:
    scale = max|x| / 127, q = round(x / scale), so x ~ q * scale.

    Returns:
        q: int8, same shape as x; scale: (..., 1) in x's dtype.

    Taught in notebook 06, "An 8-bit cache".
    """
    check_tensor("x", x, floating=True)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x {shape_str(x)} needs a non-empty last dim (the vectors quantised)")
    absmax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)    # (..., 1)
    scale = (absmax / 127.0).clamp_min(1e-12)
    q = torch.round(x.to(torch.float32) / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.to(x.dtype)


def dequantize_int8(q: Tensor, scale: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """q * scale, in ``dtype`` (default: the scale's dtype).

    Taught in notebook 06, "An 8-bit cache".
    """
    check_tensor("q", q)
    check_tensor("scale", scale, floating=True)
    if q.dtype != torch.int8:
        raise ValueError(f"q must be int8 (from quantize_int8), got dtype {q.dtype}")
    if q.dim() != scale.dim() or scale.shape[-1] != 1 or scale.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"scale {shape_str(scale)} must be (..., 1) = {shape_str((*q.shape[:-1], 1))} "
                         f"to fit q {shape_str(q)}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be None or a floating torch.dtype, got {dtype!r}")
    dtype = scale.dtype if dtype is None else dtype
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


class Int8KVCache(KVCache):
    """A ``KVCache`` that stores keys and values as int8 with one scale per head and token.

    Same API as ``KVCache``: ``update`` takes and returns floating tensors (it quantises
    what it stores and dequantises what it returns), so a model can use it unchanged.
    Memory per value: 1 byte, plus one ``dtype`` scale per head_dim values.

    Taught in notebook 06, "An 8-bit cache".
    """

    _buffers = ("k", "v", "k_scale", "v_scale")

    def _allocate(self, shape: tuple[int, int, int, int], device) -> None:
        self.k = torch.zeros(shape, dtype=torch.int8, device=device)                  # (B, h_kv, max_len, dk)
        self.v = torch.zeros(shape, dtype=torch.int8, device=device)
        self.k_scale = torch.ones(shape[:3] + (1,), dtype=self.dtype, device=device)  # (B, h_kv, max_len, 1)
        self.v_scale = torch.ones(shape[:3] + (1,), dtype=self.dtype, device=device)

    @property
    def used_bytes(self) -> int:
        per_token = 2 * self.batch * self.n_kv_heads * (self.head_dim * 1 + self.k_scale.element_size())
        return per_token * self._len

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Quantise and append k, v (B, n_kv_heads, T_new, head_dim); return all, dequantised."""
        start, end = self._reserve(self._check(k, v))
        self.k[:, :, start:end], self.k_scale[:, :, start:end] = quantize_int8(k)
        self.v[:, :, start:end], self.v_scale[:, :, start:end] = quantize_int8(v)
        self._len = end
        k_all = dequantize_int8(self.k[:, :, :end], self.k_scale[:, :, :end])  # (B, h_kv, len, dk)
        v_all = dequantize_int8(self.v[:, :, :end], self.v_scale[:, :, :end])
        return k_all, v_all


# --------------------------------------------------------------------------------------
# Caches of constant size: attention sinks and a rolling window
# --------------------------------------------------------------------------------------
class SinkKVCache(KVCache):
    """Keep the first ``n_sink`` tokens and a rolling window of the last ``window``: constant memory.

    StreamingLLM (Xiao et al., 2024) keeps the first tokens ("attention sinks") and the
    most recent ones; Mistral 7B's rolling buffer is the case ``n_sink = 0``
    (``RollingKVCache``). The buffers have ``n_sink + window`` slots, allocated once:
    token t goes to slot t while t < n_sink, otherwise to slot
    n_sink + (t - n_sink) mod window, overwriting the token ``window`` positions older.

    After ``update`` writes token t, the cache holds exactly the keys that query t may see
    under ``masks.sink_window_mask``: j < n_sink, or t - j < window. Keys are stored as they
    arrive, so with RoPE they keep the rotation of their *original* position (the default
    of ``MultiHeadAttention``, whose positions come from ``len(cache)``, the tokens seen).

    Args:
        batch, n_kv_heads, head_dim: as in ``KVCache``.
        window: recent tokens kept (the newest included), >= 1.
        n_sink: first tokens kept for ever, >= 0.
        dtype, device: of the buffers.

    Attributes:
        k, v: (B, n_kv_heads, n_sink + window, head_dim) buffers, in slot order.
        slot_positions: (n_sink + window,) long, the original position held by each slot
            (-1 = empty).

    Taught in notebook 13, "3. Attention sinks and the rolling window: caches of constant size".
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, *, window: int, n_sink: int = 0,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self.window = check_positive_int("window", window)
        self.n_sink = check_int("n_sink", n_sink, low=0)
        self.capacity = self.n_sink + self.window
        super().__init__(batch, n_kv_heads, self.capacity, head_dim, dtype=dtype, device=device)
        self.slot_positions = torch.full((self.capacity,), -1, dtype=torch.long)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch={self.batch}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"n_sink={self.n_sink}, window={self.window}, len={self._len})")

    @property
    def n_kept(self) -> int:
        """Slots in use: min(tokens seen, n_sink + window). (``len(cache)`` counts every token seen.)"""
        return min(self._len, self.capacity)

    def slot(self, position: int) -> int:
        """The slot that holds the token at ``position``."""
        position = check_int("position", position, low=0)
        if position < self.n_sink:
            return position
        return self.n_sink + (position - self.n_sink) % self.window

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' keys and values; return the kept ones, in slot order.

        Args:
            k, v: (B, n_kv_heads, T_new, head_dim). T_new > 1 only while nothing is evicted
                (a prompt of at most n_sink + window tokens); then one token per call.

        Returns:
            k_kept, v_kept: (B, n_kv_heads, n_kept, head_dim) views of the buffers. Slot
            order is position order until the window wraps; attention does not depend on
            the order of the keys, only on which keys are there.
        """
        t_new = self._check(k, v)
        if t_new > 1 and self._len + t_new > self.capacity:
            raise ValueError(
                f"{t_new} new tokens after {self._len} would evict tokens that the earlier new queries still see: "
                f"feed at most n_sink + window - len = {self.capacity - self._len} tokens at once, then one per step")
        for i in range(t_new):
            position = self._len + i
            s = self.slot(position)
            self.k[:, :, s] = k[:, :, i]
            self.v[:, :, s] = v[:, :, i]
            self.slot_positions[s] = position
        self._len += t_new
        n = self.n_kept
        return self.k[:, :, :n], self.v[:, :, :n]   # (B, h_kv, n_kept, dk)

    def kept_positions(self) -> Tensor:
        """(n_kept,) original positions of the kept tokens, in slot order."""
        return self.slot_positions[:self.n_kept].clone()

    def reset(self) -> None:
        """Forget every token (the buffers stay allocated)."""
        super().reset()
        self.slot_positions.fill_(-1)

    def crop(self, length: int) -> None:
        """Not for a cache that evicts: the tokens a rollback would need may be gone."""
        raise ValueError(f"{type(self).__name__} cannot crop: it evicts old tokens, so a rollback cannot restore them")


class RollingKVCache(SinkKVCache):
    """A ring buffer of the last ``window`` tokens (Mistral 7B's rolling buffer cache).

    Token t is written to slot t mod window; memory stays at ``window`` slots however long
    decoding runs, and query t sees keys t - window + 1 .. t: sliding-window attention.

    Taught in notebook 13, "3. Attention sinks and the rolling window: caches of constant size".
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, *, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, n_kv_heads, head_dim, window=window, n_sink=0, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch={self.batch}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"window={self.window}, len={self._len})")
