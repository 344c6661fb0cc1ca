"""Multi-head latent attention (MLA, DeepSeek-V2): cache one small latent per token, not K and V per head.

Taught in notebook 13, section 1 (the layer, naive and absorbed) and section 2 (the cache in real models).

Per token t with hidden state h_t (width d), following DeepSeek-AI (2024), section 2.1 (plus the RMSNorm on
the latent, ``kv_a_layernorm``, that the released models apply and the paper's equations leave out):

    c_t^KV = RMSNorm(W^DKV h_t)                  latent, kv_lora_rank = d_c values     (cached)
    k_t^R  = RoPE(W^KR h_t)                      one RoPE key for all heads, qk_rope_head_dim  (cached)
    k_t,i^C = W_i^UK c_t^KV,  v_t,i = W_i^UV c_t^KV   per-head key (qk_nope_head_dim) and value (v_head_dim)
    q_t,i = [q_t,i^C ; RoPE(q_t,i^R)]            from W^Q h_t (or W^UQ RMSNorm(W^DQ h_t) with q_lora_rank)
    o_t,i = sum_j softmax_j(q_t,i . [k_j,i^C ; k_j^R] / sqrt(nope + rope)) v_j,i
    y_t   = W^O [o_t,1 ; ... ; o_t,h]

Only c^KV and k^R are cached: (kv_lora_rank + qk_rope_head_dim) values per token and layer,
whatever the number of heads. Served as DeepSeek-V3's ``inference/model.py`` (``attn_impl = "absorb"``)
and vLLM's MLA decode path serve it ("absorbed"): because q^C . (W^UK c) = (W^UK^T q^C) . c, each head's
query is carried into the latent space, attention runs over the cached latents directly (one key
[c ; k^R] and one value c shared by every head, like MQA with wide heads), and each head's latent output
goes through its own W^UV_i, then W^O. Both forms give the same output. The naive form (expand every
cached latent into h keys and values) is what vLLM runs for prefill, where the step is compute-bound
and the narrower heads (qk_nope + qk_rope < kv_lora_rank + qk_rope) cost fewer FLOPs. (DeepSeek-V3's
``attn_impl = "naive"`` is a third way, counted by the cost functions as ``"expanded_cache"``: it caches
the expanded per-head keys and values, an MHA-sized cache, and expands only the new tokens.)

Names follow the Hugging Face DeepSeek-V2/V3 configs: ``kv_lora_rank``, ``q_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; the submodules are named like
theirs (``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``). DeepSeek's
RoPE pairs dimensions (2i, 2i + 1) (``interleaved=True``); YaRN's extra attention scale
(mscale) is not modelled here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_float_dtype,
    check_int,
    check_module_dtype,
    check_positive_int,
    check_real,
    check_same_dtype,
    check_tensor,
    shape_str,
)
from .kv_cache import TokenCache
from .masks import causal_mask
from .positions import RotaryEmbedding

__all__ = ["MLACache", "MultiHeadLatentAttention", "mla_cache_bytes", "mla_decode_bytes", "mla_decode_flops",
           "mla_weight_values"]


def mla_cache_bytes(n_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, n_tokens: int = 1, batch: int = 1,
                    bytes_per_value: float = 2) -> int:
    """MLA cache memory: (kv_lora_rank + qk_rope_head_dim) x layers x tokens x batch x bytes.

    Example: DeepSeek-V2 (60 layers, kv_lora_rank 512, qk_rope_head_dim 64) in bf16:
    576 x 60 x 2 = 69,120 bytes = 67.5 KiB per token.

    Taught in notebook 13, "2. What the cache costs: MLA and cross-layer sharing in real models".
    """
    for name, n in (("n_layers", n_layers), ("kv_lora_rank", kv_lora_rank),
                    ("qk_rope_head_dim", qk_rope_head_dim), ("batch", batch)):
        check_positive_int(name, n)
    n_tokens = check_int("n_tokens", n_tokens, low=0)
    check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
    return int(round((kv_lora_rank + qk_rope_head_dim) * n_layers * n_tokens * batch * bytes_per_value))


FORMS = ("naive", "absorbed", "folded", "expanded_cache")


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def mla_weight_values(*, d_model: int, n_heads: int, kv_lora_rank: int, qk_nope_head_dim: int, v_head_dim: int,
                      form: str = "absorbed") -> dict:
    """The values of the weight matrices one MLA layer reads after attention's latents, per form.

    The query and latent projections (``q_proj``, ``kv_a_proj_with_mqa``) are the same in every form
    and left out. What differs:

    * naive, absorbed and expanded_cache: W^UK (h, nope, d_c) and W^UV (h, v, d_c), i.e. ``kv_b_proj``,
      and W^O (d, h v);
    * folded: W^UK and the product W^O_i W^UV_i, one (d, d_c) matrix per head: d h d_c values, which
      replaces W^UV and W^O (h v d_c + d h v values) and is larger exactly when d d_c > v d_c + d v,
      i.e. d_c > d v / (d - v) (131.3 at DeepSeek-V2's d = 5120, v = 128; d_c is 512).

    Example (DeepSeek-V2: d 5120, h 128, d_c 512, v 128): W^UV 8.4M + W^O 83.9M = 92.3M values,
    the fold 335.5M (3.6 times as many; 640 MiB per layer in bf16).

    Returns:
        {name: values} with names "w_uk", "w_uv", "o_proj" (naive, absorbed) or "w_uk", "w_o_uv" (folded).

    Taught in notebook 13, "1. Multi-head latent attention".
    """
    _check_form(form)
    for name, n in (("d_model", d_model), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                    ("qk_nope_head_dim", qk_nope_head_dim), ("v_head_dim", v_head_dim)):
        check_positive_int(name, n)
    w_uk = n_heads * qk_nope_head_dim * kv_lora_rank
    if form == "folded":
        return {"w_uk": w_uk, "w_o_uv": d_model * n_heads * kv_lora_rank}
    return {"w_uk": w_uk, "w_uv": n_heads * v_head_dim * kv_lora_rank, "o_proj": d_model * n_heads * v_head_dim}


def mla_decode_bytes(n_tokens: int, *, d_model: int, n_heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                     qk_rope_head_dim: int, v_head_dim: int, form: str = "absorbed",
                     bytes_per_value: float = 2) -> dict:
    """Bytes one decode step (one new token) of one MLA layer moves over a cache of ``n_tokens``, one sequence.

    Every form reads the cache, n_tokens x (kv_lora_rank + qk_rope_head_dim) values, and the weights of
    ``mla_weight_values``. What attention then moves as keys and values differs:

    * naive: every cached latent is expanded into h keys (qk_nope + qk_rope wide) and values
      (v_head_dim), n_tokens x h x (qk_nope + qk_rope + v) values, written once and read once, so
      counted twice;
    * absorbed and folded: attention reads the latents themselves: nothing beyond the cache;
    * expanded_cache (DeepSeek-V3's ``attn_impl = "naive"``): the cache itself holds the expanded keys
      and values, n_tokens x h x (qk_nope + qk_rope + v) values read once (the new token's are
      expanded from its latent alone); nothing beyond the cache.

    Returns:
        {"cache": bytes of the cache, "keys_values": bytes of the expanded keys and values, written plus
        read (0 unless naive),
        "weights": bytes of the weights (``mla_weight_values``), "total": their sum}.

    Taught in notebook 13, "1. Multi-head latent attention".
    """
    n_tokens = check_int("n_tokens", n_tokens, low=0)
    for name, n in (("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
                    ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)):
        check_positive_int(name, n)
    check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
    weights = mla_weight_values(d_model=d_model, n_heads=n_heads, kv_lora_rank=kv_lora_rank,
                                qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim, form=form)
    per_token = (n_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) if form == "expanded_cache"
                 else kv_lora_rank + qk_rope_head_dim)
    cache = n_tokens * per_token * bytes_per_value
    expanded = 2 * n_tokens * n_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) * bytes_per_value
    out = {"cache": int(cache), "keys_values": int(expanded) if form == "naive" else 0,
           "weights": int(sum(weights.values()) * bytes_per_value)}
    out["total"] = out["cache"] + out["keys_values"] + out["weights"]
    return out


def mla_decode_flops(n_queries: int, n_tokens: int, *, d_model: int, n_heads: int, kv_lora_rank: int,
                     qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, form: str = "absorbed") -> int:
    """FLOPs (2 per multiply-add) of one MLA layer after its latents, for ``n_queries`` new tokens over
    ``n_tokens`` keys (one sequence; every query scores every key, the mask left out).

    With L = n_queries, S = n_tokens, h heads, d_c = kv_lora_rank, r = qk_rope_head_dim:

    * naive:    expand S latents, 2 S d_c h (nope + v); attention 2 L S h (nope + r + v); W^O 2 L h v d;
    * absorbed: W^UK into L queries, 2 L h nope d_c; attention 2 L S h (2 d_c + r);
      W^UV per head, 2 L h d_c v; W^O 2 L h v d;
    * folded:   as absorbed, with W^UV and W^O replaced by the fold, 2 L h d_c d;
    * expanded_cache: as naive, but only the L new latents are expanded, 2 L d_c h (nope + v).

    The expansion grows with S and not with L: per query it is paid once for every query in the
    block, so it is cheap in prefill (L = S) and the whole cost of decode (L = 1).

    Taught in notebook 13, "1. Multi-head latent attention".
    """
    _check_form(form)
    L = check_int("n_queries", n_queries, low=0)
    S = check_int("n_tokens", n_tokens, low=0)
    for name, n in (("d_model", d_model), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                    ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim),
                    ("v_head_dim", v_head_dim)):
        check_positive_int(name, n)
    h, d_c, nope, r, v, d = n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, d_model
    if form in ("naive", "expanded_cache"):
        expanded = S if form == "naive" else L                                # latents expanded this step
        return 2 * expanded * d_c * h * (nope + v) + 2 * L * S * h * (nope + r + v) + 2 * L * h * v * d
    absorbed = 2 * L * h * nope * d_c + 2 * L * S * h * (2 * d_c + r)
    if form == "folded":
        return absorbed + 2 * L * h * d_c * d
    return absorbed + 2 * L * h * d_c * v + 2 * L * h * v * d


class MLACache(TokenCache):
    """The cache of one MLA layer: the latent c^KV and the RoPE key k^R of every past token.

    The bookkeeping (``len``, ``reset``, ``crop``, ``nbytes``, overflow) is ``kv_cache.TokenCache``'s.

    Args:
        batch: B. max_len: the most tokens it holds.
        kv_lora_rank: d_c, the latent width. qk_rope_head_dim: the RoPE key width.

    Attributes:
        c_kv: (B, max_len, kv_lora_rank). k_rope: (B, max_len, qk_rope_head_dim), already rotated.

    Taught in notebook 13, "1. Multi-head latent attention".
    """

    _buffers = ("c_kv", "k_rope")
    kind = "MLA cache"

    def __init__(self, batch: int, max_len: int, kv_lora_rank: int, qk_rope_head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, max_len)
        self.kv_lora_rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = check_positive_int("qk_rope_head_dim", qk_rope_head_dim)
        check_float_dtype("dtype", dtype)
        self.c_kv = torch.zeros(self.batch, self.max_len, self.kv_lora_rank, dtype=dtype, device=device)
        self.k_rope = torch.zeros(self.batch, self.max_len, self.qk_rope_head_dim, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return (f"MLACache(batch={self.batch}, max_len={self.max_len}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, len={self._len})")

    def update(self, c_kv: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Append T_new tokens: c_kv (B, T_new, kv_lora_rank), k_rope (B, T_new, qk_rope_head_dim).

        Returns:
            All stored: (B, len, kv_lora_rank) and (B, len, qk_rope_head_dim).
        """
        for name, t, width in (("c_kv", c_kv, self.kv_lora_rank), ("k_rope", k_rope, self.qk_rope_head_dim)):
            if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[0] != self.batch or t.shape[2] != width:
                got = shape_str(t) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must be (B={self.batch}, T_new, {width}), got {got}")
        check_same_dtype(c_kv=c_kv, k_rope=k_rope, cache=self.c_kv)
        if c_kv.shape[1] != k_rope.shape[1]:
            raise ValueError(f"c_kv and k_rope must hold the same T_new tokens, got {shape_str(c_kv)} and "
                             f"{shape_str(k_rope)}")
        start, end = self._reserve(c_kv.shape[1])
        self.c_kv[:, start:end] = c_kv
        self.k_rope[:, start:end] = k_rope
        self._len = end
        return self.c_kv[:, :end], self.k_rope[:, :end]


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention with a decoupled RoPE key (DeepSeek-V2).

    Args:
        d_model: d. n_heads: h.
        kv_lora_rank: d_c, width of the cached latent c^KV.
        qk_nope_head_dim: per-head key/query part without position (from the latent).
        qk_rope_head_dim: per-head query part and shared key part that carry RoPE (even).
        v_head_dim: per-head value width.
        q_lora_rank: None (queries from one projection W^Q) or the width of a query latent.
        rope_base: RoPE's base.

    Submodules (Hugging Face names): ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/``q_b_proj``;
    ``kv_a_proj_with_mqa`` (d -> kv_lora_rank + qk_rope_head_dim: W^DKV and W^KR together),
    ``kv_a_layernorm``, ``kv_b_proj`` (kv_lora_rank -> h (qk_nope + v): W^UK and W^UV), ``o_proj``.

    Taught in notebook 13, "1. Multi-head latent attention".
    """

    def __init__(self, d_model: int, n_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None, rope_base: float = 10000.0):
        super().__init__()
        for name, n in (("d_model", d_model), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                        ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim),
                        ("v_head_dim", v_head_dim)):
            check_positive_int(name, n)
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {qk_rope_head_dim}")
        if q_lora_rank is not None:
            check_positive_int("q_lora_rank", q_lora_rank)
        self.d_model, self.n_heads = d_model, n_heads
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.scale = self.qk_head_dim ** -0.5
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=1e-6)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, d_model, bias=False)
        self.rope = RotaryEmbedding(qk_rope_head_dim, base=rope_base, interleaved=True)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, kv_lora_rank={self.kv_lora_rank}, "
                f"q_lora_rank={self.q_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}")

    def new_cache(self, batch: int, max_len: int) -> MLACache:
        """An empty ``MLACache`` for this layer, in its dtype and device."""
        w = self.kv_a_proj_with_mqa.weight
        return MLACache(batch, max_len, self.kv_lora_rank, self.qk_rope_head_dim, dtype=w.dtype, device=w.device)

    # ------------------------------------------------------------------ pieces
    def queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q^C (B, h, L, qk_nope_head_dim) and rotated q^R (B, h, L, qk_rope_head_dim)."""
        self._check_positions(x, positions)
        B, L, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, L, self.n_heads, self.qk_head_dim).transpose(1, 2)             # (B, h, L, nope + rope)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, self.rope(q_rope, positions)

    def latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """What the cache stores: c^KV (B, L, kv_lora_rank) and the rotated k^R (B, L, qk_rope_head_dim)."""
        self._check_positions(x, positions)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c_kv), self.rope(k_rope, positions)

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """W^UK (h, qk_nope_head_dim, kv_lora_rank) and W^UV (h, v_head_dim, kv_lora_rank) from ``kv_b_proj``."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def _check(self, x: Tensor, cache) -> int:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model or not x.is_floating_point():
            got = f"{shape_str(x)} {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a floating (B, L, d_model={self.d_model}) tensor, got {got}")
        w = self.kv_a_proj_with_mqa.weight
        check_module_dtype("x", x, w.dtype)
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"x {shape_str(x)} needs at least one sequence and one token")
        if cache is not None and not isinstance(cache, MLACache):
            raise ValueError(f"cache must be an MLACache (see new_cache), got {type(cache).__name__}")
        if cache is not None:
            if (cache.kv_lora_rank, cache.qk_rope_head_dim) != (self.kv_lora_rank, self.qk_rope_head_dim):
                raise ValueError(f"cache holds kv_lora_rank={cache.kv_lora_rank}, qk_rope_head_dim="
                                 f"{cache.qk_rope_head_dim}; this layer needs {self.kv_lora_rank}, "
                                 f"{self.qk_rope_head_dim} (see new_cache)")
            if cache.batch != x.shape[0]:
                raise ValueError(f"cache holds batch={cache.batch} sequences, x {shape_str(x)} has {x.shape[0]}")
            if cache.c_kv.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
                raise ValueError(f"cache holds dtype {cache.c_kv.dtype} but the module's parameters are {w.dtype}: "
                                 f"make the cache with new_cache, or MLACache(..., dtype={w.dtype})")
        return 0 if cache is None else len(cache)

    def _check_positions(self, x: Tensor, positions) -> None:
        self._check(x, None)
        check_tensor("positions", positions)
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        if positions.shape not in ((x.shape[1],), tuple(x.shape[:2])):
            raise ValueError(f"positions {shape_str(positions)} must be (L,) = ({x.shape[1]},) or (B, L) "
                             f"to fit x {shape_str(x)}")

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor, cache: MLACache | None = None, *, absorbed: bool = False,
                fold: Tensor | None = None) -> Tensor:
        """Causal MLA over x (and whatever ``cache`` holds before it).

        Args:
            x: (B, L, d_model), the new tokens; their positions are len(cache) + 0 .. L-1.
            cache: an ``MLACache`` (updated in place) or None.
            absorbed: False = naive form (expand the latents to per-head keys and values, as vLLM
                prefills); True = absorbed form (W^UK into the query, attention over the latents,
                W^UV per head, then W^O, as DeepSeek-V3 and vLLM decode).
            fold: with ``absorbed``, an optional (d_model, h, kv_lora_rank) W^O W^UV from
                ``fold_output()`` used in place of W^UV and W^O (the contrast of notebook 13).

        Returns:
            (B, L, d_model).
        """
        start = self._check(x, cache)
        check_bool("absorbed", absorbed)
        if fold is not None and (not absorbed or not isinstance(fold, Tensor)
                                 or tuple(fold.shape) != (self.d_model, self.n_heads, self.kv_lora_rank)):
            got = shape_str(fold) if isinstance(fold, Tensor) else type(fold).__name__
            raise ValueError(f"fold must be a (d_model={self.d_model}, h={self.n_heads}, kv_lora_rank="
                             f"{self.kv_lora_rank}) tensor from fold_output(), used with absorbed=True; got {got}, "
                             f"absorbed={absorbed}")
        B, L, _ = x.shape
        positions = torch.arange(start, start + L, device=x.device)
        q_nope, q_rope = self.queries(x, positions)                       # (B, h, L, nope), (B, h, L, rope)
        c_kv, k_rope = self.latents(x, positions)                         # (B, L, d_c), (B, L, rope)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)                     # (B, S, d_c), (B, S, rope)
        S = c_kv.shape[1]
        mask = None if L == 1 else causal_mask(L, S, bottom_right=True, device=x.device)   # (L, S)
        if absorbed:
            return self._absorbed(q_nope, q_rope, c_kv, k_rope, mask, fold)   # (B, L, d)
        return self._naive(q_nope, q_rope, c_kv, k_rope, mask)

    def _naive(self, q_nope, q_rope, c_kv, k_rope, mask) -> Tensor:
        """Expand every cached latent into h keys and values, then ordinary multi-head attention."""
        B, S, _ = c_kv.shape
        kv = self.kv_b_proj(c_kv).view(B, S, self.n_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.transpose(1, 2).split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # (B, h, S, .)
        k_rope = k_rope[:, None].expand(B, self.n_heads, S, self.qk_rope_head_dim)  # one RoPE key for all heads
        q = torch.cat([q_nope, q_rope], dim=-1)                           # (B, h, L, nope + rope)
        k = torch.cat([k_nope, k_rope], dim=-1)                           # (B, h, S, nope + rope)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)   # (B, h, L, v_head_dim)
        return self.o_proj(o.transpose(1, 2).reshape(B, q.shape[2], -1))

    def _absorbed(self, q_nope, q_rope, c_kv, k_rope, mask, fold=None) -> Tensor:
        """W^UK into the query, attention over the latents (one K/V head), W^UV per head, then W^O."""
        w_uk, w_uv = self.up_projections()                                # (h, nope, d_c), (h, v, d_c)
        q_latent = torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)           # (B, h, L, d_c): W^UK_i^T q^C_i
        q = torch.cat([q_latent, q_rope], dim=-1)                         # (B, h, L, d_c + rope)
        k = torch.cat([c_kv, k_rope], dim=-1)[:, None]                    # (B, 1, S, d_c + rope): shared by heads
        v = c_kv[:, None]                                                 # (B, 1, S, d_c)
        # one K/V head for all h query heads: stack the heads as query rows of a single head
        B, h, L, width = q.shape
        rows_mask = None if mask is None else mask.repeat(h, 1)           # (h L, S): row (i, t) is query t
        o_latent = F.scaled_dot_product_attention(q.reshape(B, 1, h * L, width), k, v, attn_mask=rows_mask,
                                                  scale=self.scale)       # (B, 1, h L, d_c)
        o_latent = o_latent.view(B, h, L, self.kv_lora_rank)              # (B, h, L, d_c)
        if fold is not None:                                              # W^O_i W^UV_i at once, one matmul:
            rows = o_latent.transpose(1, 2).reshape(B, L, h * self.kv_lora_rank)   # (B, L, h d_c)
            return rows @ fold.reshape(self.d_model, h * self.kv_lora_rank).T     # (B, L, d)
        o = torch.einsum("bhlc,hvc->blhv", o_latent, w_uv)                # (B, L, h, v): W^UV_i per head
        return self.o_proj(o.reshape(B, L, h * self.v_head_dim))          # (B, L, d)

    def fold_output(self) -> Tensor:
        """W^O_i W^UV_i for every head: (d_model, h, kv_lora_rank), the fold notebook 13 measures and declines.

        One matrix replaces W^UV and W^O, but it holds d h d_c values against h v d_c + d h v for the two
        (``mla_weight_values``): with DeepSeek-V2's shapes 3.6 times as many, read at every decode step.
        """
        w_uv = self.up_projections()[1]                                   # (h, v, d_c)
        w_o = self.o_proj.weight.view(self.d_model, self.n_heads, self.v_head_dim)   # (d, h, v)
        return torch.einsum("dhv,hvc->dhc", w_o, w_uv)                    # (d, h, d_c)
