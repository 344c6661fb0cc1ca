"""The KV cache: keep every past key and value so a decoding step only computes the new token's.

During generation each new token attends to the keys and values of every earlier token,
in every layer. Without a cache they are recomputed from the whole context at each step;
with one they are computed once, stored, and read back. Its size is

    bytes = 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes_per_value

This module holds the per-layer ``KVCache``, the size formula ``kv_cache_bytes`` with the
published configurations of real models (``PRESETS``, including multi-head latent attention
and cross-layer sharing), and what serving systems add: a paged block allocator
(``PagedKVCache``), an 8-bit cache (``Int8KVCache``), and two caches of constant size,
``SinkKVCache`` (StreamingLLM's first tokens + a rolling window) and ``RollingKVCache``
(a ring buffer of the last ``window`` tokens, as in Mistral 7B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_int, check_positive_int, check_tensor, shape_str

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

    Subclasses allocate their buffers (``_buffers`` lists them, time on ``_time_dim``) and
    write into them; this class does the bookkeeping: ``len``, ``reset``, ``crop``, ``nbytes``
    and the overflow check. ``len(cache)`` is the number of tokens stored, which is also the
    position of the next token (what RoPE needs).
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
    """

    _buffers = ("k", "v")

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, max_len)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.dtype = dtype
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
# How big is it? The formula, and real models
# --------------------------------------------------------------------------------------
def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, n_tokens: int = 1, batch: int = 1,
                   bytes_per_value: float = 2) -> int:
    """Memory of a KV cache: 2 x layers x kv_heads x head_dim x tokens x batch x bytes.

    The 2 counts keys and values. ``bytes_per_value`` is 2 for fp16/bf16, 4 for fp32,
    1 for int8 (scales not counted).

    Example: Llama-2-7B (32 layers, 32 KV heads of 128 dims), fp16:
    ``kv_cache_bytes(32, 32, 128)`` = 524,288 bytes = 512 KiB per token.
    """
    for name, n in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("batch", batch)):
        check_positive_int(name, n)
    n_tokens = check_int("n_tokens", n_tokens, low=0)
    if not bytes_per_value > 0:
        raise ValueError(f"bytes_per_value must be > 0, got {bytes_per_value!r}")
    total = 2 * n_layers * n_kv_heads * head_dim * n_tokens * batch * bytes_per_value
    return int(round(total))


@dataclass(frozen=True)
class ModelPreset:
    """The published shape of a real model (its config.json), enough for memory arithmetic.

    ``n_params`` is the model's total parameter count (embeddings included, tied ones
    counted once), so ``n_params x bytes`` is the memory of its weights.

    Three kinds of cache are covered:

    * MHA / GQA / MQA: each layer stores a key and a value per K/V head,
      2 x n_kv_heads x head_dim values per token and layer.
    * MLA (multi-head latent attention, DeepSeek-V2/V3): each layer stores one latent
      c_KV of ``kv_lora_rank`` values and one RoPE key of ``qk_rope_head_dim`` values,
      shared by every head: (kv_lora_rank + qk_rope_head_dim) values per token and layer.
    * Cross-layer sharing: only ``kv_layers`` of the ``n_layers`` layers compute and store
      keys and values; the others read those of an earlier layer. Of those, the
      ``sliding_kv_layers`` that use a sliding window keep at most ``sliding_window`` tokens.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    max_position: int
    n_params: int
    attention: str  # "MHA", "GQA", "MQA" or "MLA"
    kv_lora_rank: int = 0            # MLA: width of the cached latent c_KV
    qk_rope_head_dim: int = 0        # MLA: width of the cached, decoupled RoPE key
    kv_layers: int | None = None     # layers that hold their own cache (default: all)
    sliding_kv_layers: int = 0       # of those, layers whose cache keeps only the last sliding_window tokens
    sliding_window: int | None = None

    @property
    def cache_layers(self) -> int:
        """Layers that store their own keys and values (n_layers unless layers share them)."""
        return self.n_layers if self.kv_layers is None else self.kv_layers

    def values_per_token_layer(self, n_kv_heads: int | None = None) -> int:
        """Cached values per token and caching layer: 2 x kv_heads x head_dim, or MLA's
        kv_lora_rank + qk_rope_head_dim."""
        if self.attention == "MLA":
            if n_kv_heads is not None and n_kv_heads != self.n_kv_heads:
                raise ValueError(f"{self.name} uses multi-head latent attention: its cache holds one latent per "
                                 f"token and layer, not per K/V head, so n_kv_heads={n_kv_heads} does not apply")
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = self.n_kv_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        return 2 * heads * self.head_dim

    def kv_bytes(self, n_tokens: int = 1, batch: int = 1, bytes_per_value: float = 2,
                 n_kv_heads: int | None = None) -> int:
        """KV cache bytes for this model (optionally with another number of KV heads).

        MHA/GQA/MQA: 2 x layers x kv_heads x head_dim x tokens x batch x bytes
        (``kv_cache_bytes``). MLA: (kv_lora_rank + qk_rope_head_dim) x layers x tokens x
        batch x bytes. With cross-layer sharing only ``cache_layers`` layers count, and a
        sliding-window layer holds min(tokens, sliding_window) tokens.
        """
        per = self.values_per_token_layer(n_kv_heads)
        if self.attention != "MLA" and self.kv_layers is None and not self.sliding_kv_layers:
            heads = self.n_kv_heads if n_kv_heads is None else n_kv_heads
            return kv_cache_bytes(self.n_layers, heads, self.head_dim, n_tokens, batch, bytes_per_value)
        n_tokens = check_int("n_tokens", n_tokens, low=0)
        check_positive_int("batch", batch)
        if not bytes_per_value > 0:
            raise ValueError(f"bytes_per_value must be > 0, got {bytes_per_value!r}")
        full = self.cache_layers - self.sliding_kv_layers
        windowed = min(n_tokens, self.sliding_window) if self.sliding_kv_layers else 0
        token_layers = full * n_tokens + self.sliding_kv_layers * windowed
        return int(round(per * token_layers * batch * bytes_per_value))

    def weight_bytes(self, bytes_per_value: float = 2) -> int:
        """Memory of the weights: n_params x bytes per value."""
        return int(round(self.n_params * bytes_per_value))


def _preset(name, n_layers, d_model, n_heads, n_kv_heads, ffn_dim, vocab_size, max_position, n_params):
    kind = "MHA" if n_kv_heads == n_heads else ("MQA" if n_kv_heads == 1 else "GQA")
    return ModelPreset(name, n_layers, d_model, n_heads, n_kv_heads, d_model // n_heads, ffn_dim,
                       vocab_size, max_position, n_params, kind)


# Values from each model's published config.json; n_params from the model card / checkpoint.
PRESETS: dict[str, ModelPreset] = {p.name: p for p in [
    #        name           layers d_model heads kv  ffn    vocab   max_pos n_params
    _preset("GPT-2 (124M)",    12,   768,   12, 12,  3072,  50257,   1024,     124_439_808),
    _preset("Llama-2-7B",      32,  4096,   32, 32, 11008,  32000,   4096,   6_738_415_616),
    _preset("Llama-2-13B",     40,  5120,   40, 40, 13824,  32000,   4096,  13_015_864_320),
    _preset("Llama-2-70B",     80,  8192,   64,  8, 28672,  32000,   4096,  68_976_648_192),
    _preset("Mistral-7B",      32,  4096,   32,  8, 14336,  32000,  32768,   7_241_732_096),
    _preset("Llama-3-8B",      32,  4096,   32,  8, 14336, 128256,   8192,   8_030_261_248),
    _preset("Llama-3-70B",     80,  8192,   64,  8, 28672, 128256,   8192,  70_553_706_496),
    _preset("Qwen2.5-7B",      28,  3584,   28,  4, 18944, 152064, 131072,   7_615_616_512),
    # Multi-head latent attention (DeepSeek-AI, 2024): config.json of deepseek-ai/DeepSeek-V2 and
    # deepseek-ai/DeepSeek-V3 (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
    # q_lora_rank 1536, 128 heads). head_dim is the query/key head width, qk_nope + qk_rope = 192;
    # ffn_dim the dense layers' intermediate_size. n_params: the architecture instantiated from the config
    # (transformers' DeepseekV2/V3ForCausalLM on the meta device; V3 without its multi-token-prediction
    # module), the papers' "236B" and "671B" total parameters.
    ModelPreset("DeepSeek-V2", 60, 5120, 128, 128, 192, 12288, 102400, 163840, 235_741_434_880, "MLA",
                kv_lora_rank=512, qk_rope_head_dim=64),
    ModelPreset("DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280, 163840, 671_026_404_352, "MLA",
                kv_lora_rank=512, qk_rope_head_dim=64),
    # Cross-layer KV sharing: the text decoder of Gemma 3n E4B (transformers' Gemma3nTextConfig, whose
    # defaults are the E4B configuration): 35 layers, every 5th global and the others a 512-token sliding
    # window, 2 K/V heads of 256. The last num_kv_shared_layers = 15 layers reuse the cache of the last
    # earlier layer of their type, so 20 layers (16 sliding, 4 global) hold a cache. n_params: the text
    # decoder (Gemma3nForCausalLM, per-layer embeddings included) instantiated from that config.
    ModelPreset("Gemma-3n-E4B", 35, 2048, 8, 2, 256, 16384, 262400, 32768, 6_835_235_568, "GQA",
                kv_layers=20, sliding_kv_layers=16, sliding_window=512),
]}


def get_preset(name: str) -> ModelPreset:
    """Look up a preset by name (case-insensitive), e.g. ``get_preset("llama-2-7b")``."""
    for key, preset in PRESETS.items():
        if key.lower() == name.lower():
            return preset
    raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")


def format_bytes(n: float) -> str:
    """Binary units, as memory is sold: 524288 -> '512.0 KiB', 2**31 -> '2.00 GiB'."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit, power in (("KiB", 1), ("MiB", 2), ("GiB", 3), ("TiB", 4)):
        value = n / 1024 ** power
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit in ("KiB", "MiB") else f"{value:.2f} {unit}"
    raise AssertionError("unreachable")


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
    """

    def __init__(self, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self.n_blocks = check_positive_int("n_blocks", n_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        shape = (n_blocks, n_kv_heads, block_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.free_blocks = list(range(n_blocks - 1, -1, -1))  # a stack: pop() gives 0, 1, 2, ...
        self.block_tables: dict = {}
        self.lengths: dict = {}

    def blocks_needed(self, seq_id, n_new: int) -> int:
        """How many new blocks appending ``n_new`` tokens to a sequence takes."""
        length = self.lengths.get(seq_id, 0)
        have = len(self.block_tables.get(seq_id, []))
        return math.ceil((length + n_new) / self.block_size) - have

    def append(self, seq_id, k: Tensor, v: Tensor) -> None:
        """Store T_new tokens of one sequence: k, v (n_kv_heads, T_new, head_dim)."""
        expected = (self.n_kv_heads, k.shape[1] if k.dim() == 3 else -1, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or tuple(t.shape) != expected or t.dtype != self.k_pool.dtype:
                raise ValueError(f"{name} must be (n_kv_heads={self.n_kv_heads}, T_new, head_dim={self.head_dim}) "
                                 f"of dtype {self.k_pool.dtype}, got {shape_str(t)} of dtype {t.dtype}")
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
            raise ValueError(f"unknown sequence {seq_id!r}; stored: {list(self.block_tables)}")
        table = torch.tensor(self.block_tables[seq_id], device=self.k_pool.device)
        n = self.lengths[seq_id]
        k = self.k_pool[table].transpose(0, 1).reshape(self.n_kv_heads, -1, self.head_dim)[:, :n]
        v = self.v_pool[table].transpose(0, 1).reshape(self.n_kv_heads, -1, self.head_dim)[:, :n]
        return k, v  # (h_kv, len, dk)

    def free(self, seq_id) -> None:
        """Return a finished sequence's blocks to the pool."""
        if seq_id not in self.block_tables:
            raise ValueError(f"unknown sequence {seq_id!r}; stored: {list(self.block_tables)}")
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
    """
    lengths = [int(n) for n in lengths]
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
    """
    if not x.is_floating_point():
        raise ValueError(f"quantize_int8 expects a floating tensor, got dtype {x.dtype}")
    absmax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)    # (..., 1)
    scale = (absmax / 127.0).clamp_min(1e-12)
    q = torch.round(x.to(torch.float32) / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.to(x.dtype)


def dequantize_int8(q: Tensor, scale: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """q * scale, in ``dtype`` (default: the scale's dtype)."""
    dtype = scale.dtype if dtype is None else dtype
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


class Int8KVCache(KVCache):
    """A ``KVCache`` that stores keys and values as int8 with one scale per head and token.

    Same API as ``KVCache``: ``update`` takes and returns floating tensors (it quantises
    what it stores and dequantises what it returns), so a model can use it unchanged.
    Memory per value: 1 byte, plus one ``dtype`` scale per head_dim values.
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
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, *, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, n_kv_heads, head_dim, window=window, n_sink=0, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch={self.batch}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"window={self.window}, len={self._len})")
