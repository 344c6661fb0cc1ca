"""How big is a KV cache? The formula, and the published shapes of real models.

    bytes = 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes_per_value

``kv_cache_bytes`` is the formula; ``PRESETS`` (looked up with ``get_preset``) holds real
models' configurations as ``ModelPreset``s, whose ``kv_bytes`` also covers multi-head latent
attention (DeepSeek-V2/V3) and cross-layer sharing (Gemma 3n), and ``weight_bytes`` the
weights; ``format_bytes`` prints sizes in binary units. Notebook 06 introduces them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import check_choice, check_int, check_positive_int, check_real

__all__ = ["kv_cache_bytes", "ModelPreset", "PRESETS", "get_preset", "format_bytes"]


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, n_tokens: int = 1, batch: int = 1,
                   bytes_per_value: float = 2) -> int:
    """Memory of a KV cache: 2 x layers x kv_heads x head_dim x tokens x batch x bytes.

    The 2 counts keys and values. ``bytes_per_value`` is 2 for fp16/bf16, 4 for fp32,
    1 for int8 (scales not counted).

    Example: Llama-2-7B (32 layers, 32 KV heads of 128 dims), fp16:
    ``kv_cache_bytes(32, 32, 128)`` = 524,288 bytes = 512 KiB per token.

    Taught in notebook 06, "How big is the cache?".
    """
    for name, n in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("batch", batch)):
        check_positive_int(name, n)
    n_tokens = check_int("n_tokens", n_tokens, low=0)
    check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
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

    Taught in notebook 06, "How big is the cache?".
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
    v_head_dim: int | None = None    # value head width when it differs from head_dim (MLA: 128 vs 192)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a str, got {type(self.name).__name__}")
        for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
                      "max_position", "n_params"):
            check_positive_int(field, getattr(self, field))
        check_choice("attention", self.attention, ("MHA", "GQA", "MQA", "MLA"))
        check_int("kv_lora_rank", self.kv_lora_rank)
        check_int("qk_rope_head_dim", self.qk_rope_head_dim)
        if self.kv_layers is not None:
            check_int("kv_layers", self.kv_layers, low=1, high=self.n_layers)
        check_int("sliding_kv_layers", self.sliding_kv_layers, high=self.cache_layers)
        if self.sliding_kv_layers and self.sliding_window is None:
            raise ValueError(f"sliding_kv_layers={self.sliding_kv_layers} needs a sliding_window")
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if self.v_head_dim is not None:
            check_positive_int("v_head_dim", self.v_head_dim)

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
        n_tokens = check_int("n_tokens", n_tokens, low=0)
        check_positive_int("batch", batch)
        check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
        per = self.values_per_token_layer(n_kv_heads)
        if self.attention != "MLA" and self.kv_layers is None and not self.sliding_kv_layers:
            heads = self.n_kv_heads if n_kv_heads is None else n_kv_heads
            return kv_cache_bytes(self.n_layers, heads, self.head_dim, n_tokens, batch, bytes_per_value)
        n_tokens = check_int("n_tokens", n_tokens, low=0)
        check_positive_int("batch", batch)
        check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
        full = self.cache_layers - self.sliding_kv_layers
        windowed = min(n_tokens, self.sliding_window) if self.sliding_kv_layers else 0
        token_layers = full * n_tokens + self.sliding_kv_layers * windowed
        return int(round(per * token_layers * batch * bytes_per_value))

    def weight_bytes(self, bytes_per_value: float = 2) -> int:
        """Memory of the weights: n_params x bytes per value."""
        check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
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
                kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    ModelPreset("DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280, 163840, 671_026_404_352, "MLA",
                kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    # Cross-layer KV sharing: the text decoder of Gemma 3n E4B (the defaults of transformers'
    # Gemma3nTextConfig, whose docstring says they yield a configuration "similar" to google/gemma-3n-E4B's):
    # 35 layers, every 5th global and the others a 512-token sliding window, 2 K/V heads of 256. The last
    # num_kv_shared_layers = 15 layers reuse the cache of the last earlier layer of their type, so 20 layers
    # (16 sliding, 4 global) hold a cache. n_params: the text decoder (Gemma3nForCausalLM, per-layer
    # embeddings included) instantiated from that config.
    ModelPreset("Gemma-3n-E4B", 35, 2048, 8, 2, 256, 16384, 262400, 32768, 6_835_235_568, "GQA",
                kv_layers=20, sliding_kv_layers=16, sliding_window=512),
]}


def get_preset(name: str) -> ModelPreset:
    """Look up a preset by name (case-insensitive), e.g. ``get_preset("llama-2-7b")``.

    Taught in notebook 06, "How big is the cache?".
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a preset's name (a str), got {type(name).__name__}; "
                         f"known: {', '.join(PRESETS)}")
    for key, preset in PRESETS.items():
        if key.lower() == name.lower():
            return preset
    raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")


def format_bytes(n: float) -> str:
    """Binary units, as memory is sold: 524288 -> '512.0 KiB', 2**31 -> '2.00 GiB'.

    Taught in notebook 06, "How big is the cache?".
    """
    check_real("n", n, low=0)
    if n < 1024:
        return f"{n:.0f} B"
    for unit, power in (("KiB", 1), ("MiB", 2), ("GiB", 3), ("TiB", 4)):
        value = n / 1024 ** power
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit in ("KiB", "MiB") else f"{value:.2f} {unit}"
    raise AssertionError("unreachable")
