"""A tiny decoder-only transformer built from the package's parts, and the one we trained.

    x_0 = Embed(ids)
    x_l = x_{l-1} + MHA(Norm(x_{l-1}))      causal, RoPE, n_kv_heads K/V heads
    x_l = x_l + MLP(Norm(x_l))
    logits = Norm(x_L) E^T                   (the embedding matrix E reused as the output layer)

``model(ids, need_weights=True)`` also returns every layer's attention weights (what the
explorer shows, ``explore.explore_decoder``). RoPE's cos and sin are computed once per
forward (``rope.angles(positions)``) and passed to every layer explicitly.

``TinyDecoder.generate`` decodes greedily, with a KV cache (one ``KVCache`` per layer:
prefill the prompt once, then one token per step) or without one (re-run the whole
context at every step). Both give the same tokens; the cache only saves work.

``load_tiny_decoder()`` loads the character-level model shipped in ``selfattn_lite/data``
(trained by ``python -m selfattn_lite.course.train_tiny`` on Shakespeare), with its tokenizer.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_ids, check_int, check_positive_int, check_real, check_tensor, shape_str
from .kv_cache import KVCache
from .masks import to_additive
from .multihead import MultiHeadAttention
from .positions import RotaryEmbedding, alibi_bias
from .rope_scaling import validate_scaling

__all__ = [
    "DecoderConfig",
    "CharTokenizer",
    "DecoderBlock",
    "TinyDecoder",
    "to_gqa",
    "load_tiny_decoder",
    "load_text",
    "split_text",
    "evaluate",
    "DATA_DIR",
    "WEIGHTS_FILE",
    "CONFIG_FILE",
    "TEXT_FILE",
]

DATA_DIR = Path(__file__).parent / "data"
WEIGHTS_FILE = DATA_DIR / "tiny_decoder.safetensors"
CONFIG_FILE = DATA_DIR / "tiny_decoder.json"
TEXT_FILE = DATA_DIR / "shakespeare.txt"


# --------------------------------------------------------------------------------------
# Configuration and tokenizer
# --------------------------------------------------------------------------------------
@dataclass
class DecoderConfig:
    """Shape of a ``TinyDecoder``.

    Args:
        vocab_size: number of token ids.
        d_model: width d.
        n_layers: number of blocks.
        n_heads: query heads h (head_dim = d / h).
        n_kv_heads: key/value heads (default h: MHA; 1: MQA; between: GQA).
        d_ff: hidden width of the MLP (default 4 d).
        max_len: longest sequence (prompt + generated) the model handles.
        rope_base: RoPE's base b.
        norm: "rmsnorm" or "layernorm".
        tie_embeddings: reuse the embedding matrix as the output layer.
        dropout: dropout on each block's two residual branches (training only).
        is_causal: the causal mask; default True, a decoder (False only for notebook 11's experiment:
            a model that sees the future).
        position: "rope" (rotate q and k) or "alibi" (add -m_h (i - j) to the scores).
        rope_scaling: None or a context-extension dict for RoPE, as ``RotaryEmbedding``'s
            ``scaling`` (e.g. {"kind": "linear", "factor": 4.0}).

    Taught in notebook 06, "A tiny decoder that really generates".
    """

    vocab_size: int
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None
    d_ff: int | None = None
    max_len: int = 512
    rope_base: float = 10000.0
    norm: str = "rmsnorm"
    tie_embeddings: bool = True
    dropout: float = 0.0
    is_causal: bool = True
    position: str = "rope"
    rope_scaling: dict | None = None

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            check_int(name, value, low=1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"RoPE needs an even head_dim, got d_model / n_heads = {self.d_model // self.n_heads}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.position not in ("rope", "alibi"):
            raise ValueError(f"position must be 'rope' or 'alibi', got {self.position!r}")
        if self.rope_scaling is not None:
            if self.position != "rope":
                raise ValueError(f"rope_scaling applies to position='rope' only, got position={self.position!r}")
            self.rope_scaling = validate_scaling(self.rope_scaling, self.head_dim)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, d: dict) -> DecoderConfig:
        """A config from a checkpoint's JSON; keys it does not know are left out. Checkpoints written
        before the rename to ``is_causal`` store ``causal``: it is read as ``is_causal``."""
        d = {("is_causal" if k == "causal" else k): v for k, v in d.items()}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class CharTokenizer:
    """One token per character; ids are positions in the sorted vocabulary string.

    Taught in notebook 06, "A tiny decoder that really generates".
    """

    def __init__(self, chars: str):
        if not isinstance(chars, str):
            raise ValueError(f"chars must be a str (the vocabulary), got {type(chars).__name__}")
        if len(set(chars)) != len(chars):
            raise ValueError(f"chars (the vocabulary) has repeated characters: {chars!r:.60}")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """str -> (T,) long ids."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"text has characters not in the vocabulary: {unknown!r}")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        """(T,) ids -> str."""
        ids = check_ids("ids", ids, len(self.chars), dim=(0, 1), layout="(T,)").reshape(-1).tolist()
        return "".join(self.chars[i] for i in ids)


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------
def _norm(config: DecoderConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-5)
    return nn.LayerNorm(config.d_model, bias=False)


class MLP(nn.Module):
    """Position-wise feed-forward: GELU(x W_1) W_2, d -> d_ff -> d.

    Taught in notebook 06, "Inside the model: the Transformer block".
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=False)
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class DecoderBlock(nn.Module):
    """Pre-norm block: x + MHA(Norm(x)), then x + MLP(Norm(x)).

    Taught in notebook 06, "Inside the model: the Transformer block".
    """

    def __init__(self, config: DecoderConfig, rope: RotaryEmbedding | None):
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads, is_causal=config.is_causal,
                                       bias=False, rope=rope)
        self.norm2 = _norm(config)
        self.mlp = MLP(config.d_model, config.d_ff)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None, bias: Tensor | None = None, *,
                positions: Tensor | None = None, rope_angles: tuple[Tensor, Tensor] | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (B, T, d); with a cache, T new tokens after len(cache) old ones.

        Args:
            cache: this layer's cache (None: attend among x only).
            bias: optional (B, h, T, S) float added to the scores (ALiBi), next to the causal mask.
            positions: (T,) positions of the new tokens, for RoPE (default: after the cache).
            rope_angles: (cos, sin) of ``positions``, computed once per model forward (``rope.angles``).
            need_weights: also return the attention weights.

        Returns:
            x (B, T, d), and the weights (B, h, T, S) when ``need_weights`` (else None).
        """
        check_tensor("x", x, dim=3, layout="(B, T, d)", floating=True)
        self.attn._check_features("x", x, f"(B, T, d_model={self.attn.d_model})", self.attn.d_model)
        y, weights = self.attn(self.norm1(x), cache=cache, attn_mask=bias, positions=positions,
                               rope_angles=rope_angles, need_weights=need_weights)
        x = x + self.drop(y)
        return x + self.drop(self.mlp(self.norm2(x))), weights


class TinyDecoder(nn.Module):
    """Decoder-only transformer: embeddings, ``n_layers`` pre-norm blocks, a final norm, logits.

    Args:
        config: a ``DecoderConfig``.

    Attributes:
        tokenizer: set by ``load_tiny_decoder`` (a ``CharTokenizer``), else None.

    Taught in notebook 06, "A tiny decoder that really generates".
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.rope = RotaryEmbedding(config.head_dim, base=config.rope_base, scaling=config.rope_scaling) \
            if config.position == "rope" else None
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(config, self.rope) for _ in range(config.n_layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.tokenizer: CharTokenizer | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02), residual outputs scaled by 1 / sqrt(2 n_layers)."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.config.n_layers) if name.endswith(("out_proj.weight", "fc2.weight")) \
                    else 0.02
                nn.init.normal_(p, std=std)

    def n_params(self) -> int:
        """Parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ caches
    def new_caches(self, batch: int, max_len: int | None = None, *, cache_cls=KVCache) -> list[KVCache]:
        """One empty cache per layer, (batch, n_kv_heads, max_len, head_dim), in the model's dtype."""
        c, p = self.config, self.embed.weight
        max_len = c.max_len if max_len is None else max_len
        return [cache_cls(batch, c.n_kv_heads, max_len, c.head_dim, dtype=p.dtype, device=p.device)
                for _ in range(c.n_layers)]

    # ------------------------------------------------------------------ forward
    def _check_ids(self, ids, *, check_range: bool | None = None) -> Tensor:
        """ids as a (B, T) integer tensor on the model's device, checked.

        A tensor on another device raises ValueError (it is never moved silently: a model
        that is not where you think it is should fail loudly); a list or range is created on
        the model's device. The token range is checked when ``check_range`` is True; None
        means "on the CPU only", where it costs no device synchronisation (on a GPU, min and
        max would force a host sync per call: ``generate`` checks the prompt once instead).
        """
        device = self.embed.weight.device
        if isinstance(ids, str):
            raise ValueError("ids must be (B, T) or (T,) integer token ids, got a str: encode the text first, "
                             "e.g. model.tokenizer.encode(text)")
        if not isinstance(ids, Tensor):
            try:
                ids = torch.as_tensor(ids, device=device)
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(f"ids must be (B, T) or (T,) integer token ids, got {type(ids).__name__}") from None
        if ids.dim() == 1:
            ids = ids[None]                                   # (T,) -> (1, T)
        if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"ids must be (B, T) or (T,) integer token ids, got {shape_str(ids)} of dtype {ids.dtype}")
        if ids.device != device:
            raise ValueError(f"ids are on {ids.device} but the model is on {device}: "
                             f"move them first, ids.to({str(device)!r})")
        if check_range is None:
            check_range = ids.device.type == "cpu"
        if check_range and ids.numel():
            low, high = torch.stack(torch.aminmax(ids)).tolist()   # one host sync for both
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(f"token ids must be in [0, vocab_size={self.config.vocab_size}), "
                                 f"got min {low}, max {high}")
        return ids

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, *, attn_mask: Tensor | None = None,
                need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every position (and, when asked, every layer's attention weights).

        RoPE's cos and sin are computed once here for the T positions (``rope.angles``) and
        passed to every layer, which rotates its q and k with them.

        Args:
            ids: (B, T) token ids on the model's device (their range is checked on the CPU;
                see ``_check_ids``). With ``caches``, the T new tokens that follow the
                len(caches[0]) tokens already stored (positions continue from there).
            caches: None (attend among ``ids`` only) or one ``KVCache`` per layer.
            attn_mask: optional (T, S) bool mask, True = may attend, ANDed with the causal mask in
                every layer (S = len(cache) + T), e.g. ``masks.sink_window_mask`` (notebook 13).
            need_weights: also return the attention weights of every layer, computed by
                each layer's explicit attention (``MultiHeadAttention(need_weights=True)``).

        Returns:
            (B, T, vocab_size) logits; with ``need_weights``, the pair (logits, weights),
            weights a list of n_layers tensors (B, h, T, S), S = len(cache) + T (T without a cache).
        """
        ids = self._check_ids(ids)
        check_bool("need_weights", need_weights)
        if caches is not None and not isinstance(caches, list | tuple):
            raise ValueError(f"caches must be None or a list of one cache per layer, got {type(caches).__name__}")
        if caches is not None and len(caches) != self.config.n_layers:
            raise ValueError(f"expected one cache per layer ({self.config.n_layers}), got {len(caches)}")
        B, T = ids.shape
        past = len(caches[0]) if caches is not None else 0
        if past + T > self.config.max_len:
            raise ValueError(f"{past} cached + {T} new tokens exceed max_len={self.config.max_len}")
        x = self.embed(ids)                                   # (B, T, d)
        positions = torch.arange(past, past + T, device=x.device)             # (T,)
        bias = None
        if self.config.position == "alibi":                   # (h, T, past + T): -m_h (i - j) where j <= i
            bias = alibi_bias(self.config.n_heads, T, past + T, device=x.device).to(x.dtype)
            bias = bias.expand(B, *bias.shape)                # (B, h, T, S): torch's fast CPU path wants 4-D
        if attn_mask is not None:
            if not isinstance(attn_mask, Tensor) or attn_mask.dtype != torch.bool or attn_mask.shape != (T, past + T):
                got = f"{shape_str(attn_mask)} {attn_mask.dtype}" if isinstance(attn_mask, Tensor) else attn_mask
                raise ValueError(f"attn_mask must be a ({T}, {past + T}) bool mask, got {got}")
            bias = attn_mask if bias is None else bias + to_additive(attn_mask, bias.dtype)
        angles = None                                         # cos, sin of the T positions: once, for all layers
        if self.rope is not None:
            angles = self.rope.angles(positions, torch.float64 if x.dtype == torch.float64 else torch.float32)
        all_weights = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, cache=None if caches is None else caches[i], bias=bias, positions=positions,
                               rope_angles=angles, need_weights=need_weights)
            all_weights.append(weights)
        logits = self.lm_head(self.norm(x))                   # (B, T, V)
        return (logits, all_weights) if need_weights else logits

    def loss(self, ids: Tensor) -> Tensor:
        """Mean cross-entropy of predicting ids[:, 1:] from ids[:, :-1], in nats per token."""
        ids = self._check_ids(ids, check_range=True)
        if ids.shape[1] < 2:
            raise ValueError(f"loss needs at least 2 tokens per row (one read, one predicted), "
                             f"got ids {shape_str(ids)}")
        logits = self(ids[:, :-1])                            # (B, T-1, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, ids, max_new_tokens: int, use_cache: bool = True, *, cache_cls=KVCache) -> Tensor:
        """Greedy decoding: append the most likely next token ``max_new_tokens`` times.

        Without the cache every step re-runs the whole sequence so far (T, T+1, T+2 ...
        tokens); with it the prompt is run once (prefill) into one ``KVCache`` per layer
        and each step runs only the newest token (decode), attending to the stored keys
        and values. Both return the same tokens.

        Args:
            ids: (B, T) or (T,) prompt token ids.
            max_new_tokens: how many tokens to append (T + max_new_tokens <= max_len).
            use_cache: decode with a KV cache.
            cache_cls: the cache class (e.g. ``Int8KVCache``).

        Returns:
            (B, T + max_new_tokens) ids: the prompt followed by the generated tokens.
        """
        ids = self._check_ids(ids, check_range=True)      # once, here: decode steps make their own ids
        B, T = ids.shape
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=0)
        check_bool("use_cache", use_cache)
        if T < 1 or B < 1:
            raise ValueError(f"the prompt needs at least one row and one token, got ids of shape {shape_str(ids)}")
        if T + max_new_tokens > self.config.max_len:
            raise ValueError(f"prompt of {T} tokens + {max_new_tokens} new tokens = {T + max_new_tokens} "
                             f"exceeds max_len={self.config.max_len}")
        if max_new_tokens == 0:
            return ids
        if not use_cache:
            for _ in range(max_new_tokens):
                logits = self(ids)                                        # (B, T_so_far, V): all again
                next_id = logits[:, -1].argmax(dim=-1, keepdim=True)      # (B, 1)
                ids = torch.cat([ids, next_id], dim=1)
            return ids
        caches = self.new_caches(B, T + max_new_tokens, cache_cls=cache_cls)
        logits = self(ids, caches=caches)                                 # prefill: (B, T, V)
        for step in range(max_new_tokens):
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)          # (B, 1)
            ids = torch.cat([ids, next_id], dim=1)
            if step < max_new_tokens - 1:
                logits = self(next_id, caches=caches)                     # decode: (B, 1, V)
        return ids

    def complete(self, prompt: str, max_new_tokens: int, use_cache: bool = True) -> str:
        """Text in, text out (needs ``self.tokenizer``): the prompt's greedy continuation."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer; load it with load_tiny_decoder()")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        prompt_ids = self.tokenizer.encode(prompt).to(self.embed.weight.device)     # (T,) on the model's device
        ids = self.generate(prompt_ids, max_new_tokens, use_cache=use_cache)
        return self.tokenizer.decode(ids[0, len(prompt):])


# --------------------------------------------------------------------------------------
# MHA -> GQA / MQA
# --------------------------------------------------------------------------------------
def pool_kv_heads(weight: Tensor, n_heads: int, n_kv_heads: int) -> Tensor:
    """Mean-pool the rows of a K or V projection over groups of consecutive heads.

    Head j of the result is the mean of heads j*g .. (j+1)*g - 1 (g = n_heads / n_kv_heads),
    the query heads that will share it (``repeat_interleave`` order).

    Args:
        weight: (n_heads * head_dim, d_in) weight, or (n_heads * head_dim,) bias.

    Returns:
        (n_kv_heads * head_dim, d_in), or (n_kv_heads * head_dim,).
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    if weight.shape[0] % n_heads:
        raise ValueError(f"weight of shape {shape_str(weight)} does not split into n_heads={n_heads} heads")
    g, head_dim = n_heads // n_kv_heads, weight.shape[0] // n_heads
    heads = weight.reshape(n_kv_heads, g, head_dim, *weight.shape[1:])   # (h_kv, g, dk, d_in)
    return heads.mean(dim=1).reshape(n_kv_heads * head_dim, *weight.shape[1:])


@torch.no_grad()
def to_gqa(model: TinyDecoder, n_kv_heads: int) -> TinyDecoder:
    """A copy of ``model`` with ``n_kv_heads`` K/V heads, each the mean of its group's heads.

    The recipe of Ainslie et al. (2023) for turning an MHA checkpoint into GQA (n_kv_heads
    between 1 and h) or MQA (1); the paper then trains it a little more ("uptraining").
    Query, output and MLP weights are copied unchanged. The copy has the model's device and dtype.

    Taught in notebook 07, "Turning an MHA checkpoint into GQA".
    """
    c = model.config
    if c.n_kv_heads != c.n_heads:
        raise ValueError(f"to_gqa converts an MHA model (n_kv_heads = n_heads), this one has "
                         f"n_kv_heads={c.n_kv_heads}, n_heads={c.n_heads}")
    config = DecoderConfig.from_dict({**asdict(c), "n_kv_heads": n_kv_heads})
    p = model.embed.weight
    new = TinyDecoder(config).to(device=p.device, dtype=p.dtype)
    state = dict(model.state_dict())
    for i in range(c.n_layers):
        for proj in ("k_proj", "v_proj"):
            key = f"blocks.{i}.attn.{proj}.weight"
            state[key] = pool_kv_heads(state[key], c.n_heads, n_kv_heads)
    new.load_state_dict(state)
    new.tokenizer = model.tokenizer
    return new.eval()


# --------------------------------------------------------------------------------------
# The shipped model
# --------------------------------------------------------------------------------------
VAL_FRACTION = 0.1
VAL_WINDOWS = 16    # held-out windows every evaluation uses (training's record, notebooks 06, 07, 11)


def load_text() -> str:
    """The training text shipped with the package (Shakespeare, public domain).

    Taught in notebook 11, "GQA's quality, trained from scratch".
    """
    return TEXT_FILE.read_text(encoding="utf-8")


def split_text(text: str, val_fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """(train, held-out): the last ``val_fraction`` of the text is never trained on.

    Taught in notebook 11, "GQA's quality, trained from scratch".
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    check_real("val_fraction", val_fraction, low=0, high=1, high_open=True)
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


@torch.no_grad()
def evaluate(model: TinyDecoder, ids: Tensor, seq_len: int | None = None, n_windows: int = VAL_WINDOWS) -> dict:
    """Next-token loss (nats per token) and accuracy on ``n_windows`` evenly spaced windows.

    Args:
        ids: (N,) token ids of a held-out text.
        seq_len: tokens predicted per window (default: the model's max_len - 1).
        n_windows: how many windows (default ``VAL_WINDOWS``, the count the shipped record used).

    Returns:
        {"loss": mean cross-entropy, "accuracy": share of tokens whose argmax is right}.
        The windows are moved to the model's device (ids may live on the CPU).

    Taught in notebook 11, "GQA's quality, trained from scratch".
    """
    if not isinstance(model, TinyDecoder):
        raise ValueError(f"model must be a TinyDecoder, got {type(model).__name__}")
    seq_len = model.config.max_len - 1 if seq_len is None else check_positive_int("seq_len", seq_len)
    n_windows = check_positive_int("n_windows", n_windows)
    ids = check_ids("ids", ids, model.config.vocab_size, dim=1, layout="(N,)")
    if len(ids) < seq_len + 1:
        raise ValueError(f"ids must be (N,) with N > seq_len={seq_len}, got {shape_str(ids)}")
    starts = torch.linspace(0, len(ids) - seq_len - 1, n_windows).long()
    windows = torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()])   # (n, seq_len + 1)
    windows = windows.to(model.embed.weight.device)
    logits = model(windows[:, :-1]).float()                                    # (n, seq_len, V)
    targets = windows[:, 1:].to(logits.device)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    accuracy = (logits.argmax(-1) == targets).float().mean()
    return {"loss": loss.item(), "accuracy": accuracy.item()}


def load_tiny_decoder(weights: str | Path | None = None, config: str | Path | None = None,
                      dtype: torch.dtype = torch.float32, device=None, *, rope_scaling: dict | None = None,
                      max_len: int | None = None) -> TinyDecoder:
    """Load the shipped character-level model, in eval mode, with ``.tokenizer`` and ``.info``.

    The weights are a safetensors file (plain tensors, no pickled code); the config JSON
    holds the shape, the vocabulary and the training record (``.info``).

    Args:
        rope_scaling: None (the scaling the model was saved with, usually none) or a
            context-extension dict as ``RotaryEmbedding`` takes, e.g.
            {"kind": "yarn", "factor": 4.0, "original_max_len": 512}.
        max_len: the longest sequence to accept (default: the trained one). Past the trained
            length RoPE meets angles it never saw unless ``rope_scaling`` slows the rotations.

    Taught in notebook 06, "A tiny decoder that really generates".
    """
    from safetensors.torch import load_file

    weights = Path(weights) if weights is not None else WEIGHTS_FILE
    config = Path(config) if config is not None else CONFIG_FILE
    for path in (weights, config):
        if not path.exists():
            raise FileNotFoundError(f"{path.name} not found; train it with `python -m selfattn_lite.course.train_tiny`")
    info = json.loads(config.read_text(encoding="utf-8"))
    shape = dict(info["model"])
    if rope_scaling is not None:
        shape["rope_scaling"] = rope_scaling
    if max_len is not None:
        shape["max_len"] = max_len
    model = TinyDecoder(DecoderConfig.from_dict(shape))
    state = load_file(str(weights))
    if model.config.tie_embeddings:
        state["lm_head.weight"] = state["embed.weight"]
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    model.tokenizer = CharTokenizer(info["vocab"])
    model.info = info
    return model.to(dtype=dtype, device=device).eval()
