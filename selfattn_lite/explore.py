"""Real attention heads: every layer's and head's weights for one text, and scores that measure them.

``explore(text)`` runs one sentence through the pretrained encoder all-MiniLM-L6-v2
(``selfattn_lite.encoder``) and returns every layer's and head's weights with the tokens;
``explore_decoder(text)`` does the same for the course's tiny causal decoder
(``selfattn_lite.models``), whose own forward returns them. The ``*_scores`` functions turn
the weights into one number per head, so patterns (previous token, [SEP], "it" -> "cat")
can be measured, not only looked at.

The encoder itself (``load_minilm``, ``tokenize``, ``sentence_embeddings``, ...) is in
``selfattn_lite.encoder``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_int, check_tensor, is_int
from .encoder import BertEncoder, load_minilm, load_tokenizer, tokenize

__all__ = [
    "AttentionMaps",
    "explore",
    "explore_decoder",
    "decoder_attention",
    "token_index",
    "token_scores",
    "previous_token_scores",
    "column_scores",
]


# --------------------------------------------------------------------------- exploring


@dataclass
class AttentionMaps:
    """Every head's attention weights for one text.

    Attributes:
        tokens: the T token strings ([CLS], sub-words as ##piece, [SEP]).
        weights: (n_layers, n_heads, T, T); weights[l, h, i, j] is how much token i
            attends to token j in head h of layer l. Each row sums to 1.
        model: a short name of the model that produced them.

    Taught in notebook 10, "Real heads of a real model".
    """

    tokens: list[str]
    weights: Tensor
    model: str = ""

    def __post_init__(self):
        if not isinstance(self.tokens, list | tuple) or not all(isinstance(t, str) for t in self.tokens):
            raise ValueError(f"tokens must be a list of str, got {self.tokens!r:.60}")
        check_tensor("weights", self.weights, floating=True)
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
        layer = check_int("layer", layer, low=0, high=self.n_layers - 1)
        if head is None:
            return self.weights[layer].mean(0)
        head = check_int("head", head, low=0, high=self.n_heads - 1)
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

    Taught in notebook 10, "Real heads of a real model".
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

    Taught in notebook 10, "Real heads of a real model".
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a TinyDecoder (see models.load_tiny_decoder), got {type(model).__name__}")
    return model(ids, need_weights=True)


def explore_decoder(text: str, model=None) -> AttentionMaps:
    """Run a text through the course's tiny causal decoder; its weights are lower-triangular.

    Args:
        text: characters from the decoder's vocabulary (one token per character).
        model: a ``TinyDecoder`` with a tokenizer (default ``models.load_tiny_decoder()``).

    Returns:
        ``AttentionMaps`` with one token per character and weights (n_layers, n_heads, T, T).

    Taught in notebook 10, "Real heads of a real model".
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
    """Position of ``token`` in ``tokens`` (its ``occurrence``-th appearance); ints pass through.

    Taught in notebook 10, "Real heads of a real model".
    """
    if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"tokens must be a list of str, got {tokens!r:.60}")
    occurrence = check_int("occurrence", occurrence, low=0)
    if not (isinstance(token, str) or is_int(token)):
        raise ValueError(f"token must be a token (str) or its index (int), got {token!r}")
    if is_int(token):
        if not -len(tokens) <= token < len(tokens):
            raise ValueError(f"token index {token} is out of range for {len(tokens)} tokens")
        return token % len(tokens)
    hits = [i for i, t in enumerate(tokens) if t == token]
    if len(hits) <= occurrence:
        raise ValueError(f"token {token!r} (occurrence {occurrence}) is not among the tokens {tokens}")
    return hits[occurrence]


def token_scores(maps: AttentionMaps, query: str | int, key: str | int) -> Tensor:
    """(n_layers, n_heads): the weight from query token to key token in every head.

    Taught in notebook 10, "Real heads of a real model".
    """
    _check_maps(maps)
    i, j = token_index(maps.tokens, query), token_index(maps.tokens, key)
    return maps.weights[:, :, i, j]


def previous_token_scores(weights: Tensor) -> Tensor:
    """(..., T, T) -> (...): mean over queries i >= 1 of the weight on the previous token, w[i, i-1].

    1.0 is a perfect previous-token head; a uniform head over T keys scores about 1/T.

    Taught in notebook 10, "Real heads of a real model".
    """
    check_tensor("weights", weights, floating=True)
    if weights.dim() < 2 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError(f"weights must be (..., T, T) with T >= 2, got {tuple(weights.shape)}")
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def column_scores(maps: AttentionMaps, key: str | int) -> Tensor:
    """(n_layers, n_heads): the mean weight every query puts on one key (e.g. "[SEP]").

    Taught in notebook 10, "Real heads of a real model".
    """
    _check_maps(maps)
    j = token_index(maps.tokens, key)
    return maps.weights[:, :, :, j].mean(-1)


def _check_maps(maps) -> None:
    if not isinstance(maps, AttentionMaps):
        raise ValueError(f"maps must be AttentionMaps (from explore or explore_decoder), got {type(maps).__name__}")
