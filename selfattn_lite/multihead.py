"""Multi-head attention: h heads of width d/h, concatenated and mixed by W_O.

    head_i = Attention(X W_q^i, C W_k^i, C W_v^i)        C = X (self) or a context (cross)
    MultiHead(X) = Concat(head_1, ..., head_h) W_O

A transparent twin of ``torch.nn.MultiheadAttention`` (same ``key_padding_mask``
polarity, importable with ``from_torch``), batch-first, with the extras a decoder
needs: a causal flag, grouped-query heads (``n_kv_heads``), rotary positions and a
KV cache. ``need_weights=True`` runs the explicit ``selfattn_lite`` attention and
returns every head's weights; ``need_weights=False`` calls torch's fused
``scaled_dot_product_attention``.

Mask polarity, once more, because the two torch APIs differ:

* ``key_padding_mask`` (B, S): True = padding, ignore that key (as ``nn.MultiheadAttention``).
* ``attn_mask`` bool: True = may attend (as ``F.scaled_dot_product_attention``; the
  *opposite* of ``nn.MultiheadAttention``'s bool ``attn_mask``). Float: added to the scores.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_positive_int, check_real, check_tensor, shape_str
from .attention import scaled_dot_product_attention, validate_mask
from .masks import causal_mask, combine_masks, to_additive

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head (and grouped-query) attention, batch-first.

    Args:
        d_model: model width d; each head has width head_dim = d / n_heads.
        n_heads: number of query heads h.
        n_kv_heads: number of key/value heads (default h). h = MHA, 1 = MQA, between = GQA;
            key/value head j serves query heads j*g .. (j+1)*g - 1, g = h / n_kv_heads.
        is_causal: query i sees keys 0..i (with a cache: every cached key too). Default False,
            as in torch's ``scaled_dot_product_attention``.
        bias: add biases to the four projections.
        rope: optional rotary embedding, called as ``rope(x, positions)`` on q and k
            (B, heads, T, head_dim) after the head split (self-attention only); as
            ``rope(x, positions, angles=rope_angles)`` when the caller passes ``rope_angles``.
        dropout: dropout on the attention weights, in training mode only.
        kdim, vdim: input widths of keys and values for cross-attention (default d_model),
            as in ``nn.MultiheadAttention``.
        batch_first: True (default): x is (B, T, d). False: x is (T, B, d) and so is the
            output, like ``nn.MultiheadAttention(batch_first=False)``; ``from_torch`` copies it.

    Submodules: ``q_proj`` (d -> d), ``k_proj`` and ``v_proj`` (d -> n_kv_heads * head_dim),
    ``out_proj`` (d -> d), all ``nn.Linear``.

    Attribute ``attn_fn``: None (torch's fused SDPA) or a function used in its place when
    ``need_weights`` is False, called as ``attn_fn(q, k, v, is_causal=..., enable_gqa=...)``
    (plus ``attn_mask=`` when there is a mask), e.g. ``efficient.flash_attention`` (notebook 11).

    Taught in notebook 04, "The package: `MultiHeadAttention`".
    """

    attn_fn = None

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, is_causal: bool = False,
                 bias: bool = True, rope=None, dropout: float = 0.0, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = True, device=None, dtype=None):
        super().__init__()
        d_model, n_heads = check_positive_int("d_model", d_model), check_positive_int("n_heads", n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        for name, flag in (("is_causal", is_causal), ("bias", bias), ("batch_first", batch_first)):
            check_bool(name, flag)
        check_real("dropout", dropout, low=0, high=1, high_open=True)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.is_causal, self.rope, self.dropout, self.batch_first = is_causal, rope, dropout, batch_first
        self.kdim = d_model if kdim is None else check_positive_int("kdim", kdim)
        self.vdim = d_model if vdim is None else check_positive_int("vdim", vdim)
        kv_width = n_kv_heads * self.head_dim
        factory = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(d_model, d_model, **factory)
        self.k_proj = nn.Linear(self.kdim, kv_width, **factory)
        self.v_proj = nn.Linear(self.vdim, kv_width, **factory)
        self.out_proj = nn.Linear(d_model, d_model, **factory)

    def extra_repr(self) -> str:
        kv = "" if self.n_kv_heads == self.n_heads else f", n_kv_heads={self.n_kv_heads}"
        return (f"d_model={self.d_model}, n_heads={self.n_heads}{kv}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}, dropout={self.dropout}, batch_first={self.batch_first}")

    def forward(self, x: Tensor, context=None, *, key_padding_mask: Tensor | None = None,
                attn_mask: Tensor | None = None, cache=None, positions: Tensor | None = None,
                rope_angles: tuple[Tensor, Tensor] | None = None, need_weights: bool = False,
                kv_cache=None) -> tuple[Tensor, Tensor | None]:
        """y = Concat(head_1..head_h) W_O with head_i = softmax(q_i k_i^T / sqrt(head_dim) + M) v_i.

        Args:
            x: (B, L, d_model) queries (and keys/values for self-attention);
                (L, B, d_model) when ``batch_first`` is False.
            context: (B, S, kdim) keys/values for cross-attention, or a pair
                (keys (B, S, kdim), values (B, S, vdim)); None = self-attention.
            key_padding_mask: (B, S) bool, True = padding (ignored key); or float, added.
                With a cache, S counts the cached keys too.
            attn_mask: broadcastable to (B, h, L, S), or (B*h, L, S) as in ``nn.MultiheadAttention``;
                bool True = may attend, or float added.
            cache: this layer's cache, an object with ``len(cache)`` and ``update(k, v) -> (k_all, v_all)``;
                the new k, v (B, n_kv_heads, L, head_dim) are appended and attention runs
                over everything stored. The causal mask is then aligned bottom-right.
            positions: (L,) or (B, L) absolute positions for ``rope``
                (default: ``len(cache)`` + arange(L), or arange(L)).
            rope_angles: optional (cos, sin) of ``positions``, ``rope.angles(positions)``: a model
                computes them once per forward and passes them to every layer.
            need_weights: also return the weights (explicit attention); else torch's fused SDPA.
            kv_cache: the old name of ``cache``; deprecated (DeprecationWarning), still accepted.

        The masks combine: a key is visible only when ``is_causal``, ``attn_mask`` and
        ``key_padding_mask`` all allow it (float masks are added to the scores instead).
        A query that sees no key at all gets zero weights and a zero attention output.

        Returns:
            y (B, L, d_model) (or (L, B, d_model) when not batch_first), and the per-head
            weights (B, h, L, S) when ``need_weights`` else None.
        """
        check_bool("need_weights", need_weights)
        cache = _renamed_cache(cache, kv_cache)
        x, key_in, value_in = self._batch_first_inputs(x, context, cache, positions)
        B, L, _ = x.shape
        q = self._split_heads(self.q_proj(x), self.n_heads)              # (B, h, L, head_dim)
        k = self._split_heads(self.k_proj(key_in), self.n_kv_heads)      # (B, h_kv, S, head_dim)
        v = self._split_heads(self.v_proj(value_in), self.n_kv_heads)    # (B, h_kv, S, head_dim)

        start = len(cache) if cache is not None else 0                  # tokens stored before these
        if positions is not None or self.rope is not None:
            positions = self._positions(positions, B, L, start, x.device)
        if self.rope is not None:
            given = {} if rope_angles is None else {"angles": rope_angles}      # rope(x, positions) without
            q, k = self.rope(q, positions, **given), self.rope(k, positions, **given)
        if cache is not None:
            k, v = cache.update(k, v)                                    # (B, h_kv, start + L, head_dim)

        mask = self._mask(B, L, k.shape[-2], key_padding_mask, attn_mask, cache is not None, q)
        out, weights = self._attend(q, k, v, mask, need_weights)         # (B, h, L, head_dim)
        y = self.out_proj(out.transpose(1, 2).reshape(B, L, self.d_model))   # concat heads, mix: (B, L, d)
        return (y if self.batch_first else y.transpose(0, 1)), weights

    def _split_heads(self, t: Tensor, n_heads: int) -> Tensor:
        """(B, T, n_heads * head_dim) -> (B, n_heads, T, head_dim)."""
        B, T, _ = t.shape
        return t.view(B, T, n_heads, self.head_dim).transpose(1, 2)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask, need_weights: bool):
        """Explicit attention with its weights, or torch's fused SDPA (or ``attn_fn``) without."""
        is_causal = isinstance(mask, str)             # "causal": a lone causal mask on square scores
        mask = None if is_causal else mask
        dropout_p = self.dropout if self.training else 0.0
        gqa = self.n_kv_heads != self.n_heads
        if need_weights:
            return scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                is_causal=is_causal, enable_gqa=gqa)
        if self.attn_fn is not None:
            if dropout_p > 0:
                raise ValueError(f"attn_fn does not take attention dropout, but dropout_p={dropout_p}")
            masks = {} if mask is None else {"attn_mask": mask}
            return self.attn_fn(q, k, v, is_causal=is_causal, enable_gqa=gqa, **masks), None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal, enable_gqa=gqa), None

    # ------------------------------------------------------------------ inputs and masks

    def _batch_first_inputs(self, x: Tensor, context, cache, positions) -> tuple[Tensor, Tensor, Tensor]:
        """Check x and context as the caller passed them; return (x, key input, value input), batch-first.

        Messages show the caller's layout: (B, T, ...) when ``batch_first``, else (T, B, ...).
        """
        b = 0 if self.batch_first else 1                                # the batch dim in the caller's layout
        x_layout, c_layout = ("B, T", "B, S") if self.batch_first else ("T, B", "S, B")
        self._check_features("x", x, f"({x_layout}, d_model) with d_model={self.d_model}", self.d_model)
        if context is None:
            if self.kdim != self.d_model or self.vdim != self.d_model:
                raise ValueError(f"self-attention (context=None) projects x {shape_str(x)} to keys and values, "
                                 f"which needs kdim == vdim == d_model={self.d_model}, but this module has "
                                 f"kdim={self.kdim}, vdim={self.vdim}: pass context=(keys, values)")
            key_in = value_in = x
        else:
            if cache is not None or self.rope is not None:
                raise ValueError("cache and rope apply to self-attention only: pass context=None with them")
            if isinstance(context, (tuple, list)) and len(context) != 2:
                raise ValueError(f"context must be one tensor (keys = values) or a pair (keys, values), "
                                 f"got a {type(context).__name__} of {len(context)} items")
            key_in, value_in = context if isinstance(context, (tuple, list)) else (context, context)
            for name, t, width in (("context (keys)", key_in, self.kdim), ("context (values)", value_in, self.vdim)):
                self._check_features(name, t, f"({c_layout}, {width})", width)
                if t.shape[b] != x.shape[b]:
                    raise ValueError(f"{name} {shape_str(t)} has batch size {t.shape[b]} but x {shape_str(x)} "
                                     f"has {x.shape[b]}")
            if key_in.shape[1 - b] != value_in.shape[1 - b]:
                raise ValueError(f"keys {shape_str(key_in)} and values {shape_str(value_in)} need the same length S")
        if not self.batch_first:                                        # (T, B, d) -> (B, T, d)
            x, key_in, value_in = x.transpose(0, 1), key_in.transpose(0, 1), value_in.transpose(0, 1)
        return x, key_in, value_in

    def _check_features(self, name: str, t, expected: str, width: int) -> None:
        """t: a 3-d floating tensor (..., width) in the parameters' dtype (any dtype under autocast)."""
        if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[-1] != width:
            raise ValueError(f"{name} must be {expected}, got "
                             f"{shape_str(t) if isinstance(t, Tensor) else type(t).__name__}")
        check_tensor(name, t, floating=True)
        dtype = self.q_proj.weight.dtype
        if t.dtype != dtype and not torch.is_autocast_enabled(t.device.type):
            raise ValueError(f"{name} {shape_str(t)} has dtype {t.dtype} but the module's parameters are {dtype}: "
                             f"convert one of them (.to({dtype}) on the input or .to({t.dtype}) on the module)")

    @staticmethod
    def _positions(positions, B: int, L: int, start: int, device) -> Tensor:
        """Absolute positions (L,) or (B, L) of the new tokens; default start + arange(L)."""
        if positions is None:
            return torch.arange(start, start + L, device=device)
        positions = torch.as_tensor(positions, device=device)
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        if positions.shape not in ((L,), (B, L)):
            raise ValueError(f"positions must have shape ({L},) or ({B}, {L}), got {shape_str(positions)}")
        return positions

    def _mask(self, B: int, L: int, S: int, key_padding_mask, attn_mask, cached: bool, q: Tensor):
        """One mask for the (B, h, L, S) scores from is_causal, attn_mask and key_padding_mask.

        Returns None, "causal" (a lone causal mask on square scores: SDPA's ``is_causal``),
        a bool mask (True = may attend) when every part is bool, else an additive float mask.
        """
        if attn_mask is not None:
            if isinstance(attn_mask, Tensor) and attn_mask.shape == (B * self.n_heads, L, S):
                attn_mask = attn_mask.view(B, self.n_heads, L, S)        # nn.MultiheadAttention's (B*h, L, S)
            validate_mask(attn_mask, torch.Size((B, self.n_heads, L, S)))
        if key_padding_mask is not None:
            check_tensor("key_padding_mask", key_padding_mask)
            if key_padding_mask.shape != (B, S):
                raise ValueError(f"key_padding_mask must be (B, S) = ({B}, {S}), got {shape_str(key_padding_mask)}")
            if key_padding_mask.dtype == torch.bool:
                key_padding_mask = ~key_padding_mask                    # True = padding -> True = may attend
            elif not key_padding_mask.is_floating_point():
                raise ValueError(f"key_padding_mask must be bool (True = padding) or floating (added to the "
                                 f"scores), got dtype {key_padding_mask.dtype}")
            key_padding_mask = key_padding_mask[:, None, None, :]        # (B, 1, 1, S)
        if self.is_causal and attn_mask is None and key_padding_mask is None and L == S:
            return "causal"
        causal = causal_mask(L, S, bottom_right=cached, device=q.device) if self.is_causal else None   # (L, S)
        parts = [m for m in (attn_mask, key_padding_mask, causal) if m is not None]
        if all(m.dtype == torch.bool for m in parts):
            return combine_masks(*parts)                                 # may attend only if all allow
        return sum(to_additive(m, q.dtype) if m.dtype == torch.bool else m.to(q.dtype) for m in parts)

    # ------------------------------------------------------------------ import from torch

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of an ``nn.MultiheadAttention`` (weights, biases, dropout, batch_first, mode).

        The packed ``in_proj_weight`` (3d, d) is split into W_q, W_k, W_v (or the separate
        ``q/k/v_proj_weight`` are taken when kdim/vdim differ from d). The copy keeps the
        module's ``batch_first``, so ``ours(x)`` matches ``theirs(x, x, x)`` and
        ``ours(x, (key, value))`` matches ``theirs(x, key, value)`` in either layout.
        Two differences remain by design: our bool ``attn_mask`` means True = may attend
        (pass ``~their_mask``), and we return per-head weights (their default is the mean
        over heads: ``ours_weights.mean(1)``).

        Raises:
            ValueError: for ``add_bias_kv`` or ``add_zero_attn``, which have no counterpart here.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise ValueError(f"from_torch expects an nn.MultiheadAttention, got {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv=True or add_zero_attn=True")
        d = module.embed_dim
        weight = module.out_proj.weight
        ours = cls(d, module.num_heads, bias=module.in_proj_bias is not None, dropout=module.dropout,
                   kdim=module.kdim, vdim=module.vdim, batch_first=module.batch_first,
                   device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            if module.in_proj_weight is not None:                    # one packed (3d, d) matrix
                w_q, w_k, w_v = module.in_proj_weight.chunk(3)       # each (d, d)
            else:
                w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
            for proj, w in ((ours.q_proj, w_q), (ours.k_proj, w_k), (ours.v_proj, w_v)):
                proj.weight.copy_(w)
            if module.in_proj_bias is not None:
                for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj), module.in_proj_bias.chunk(3), strict=True):
                    proj.bias.copy_(b)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if module.out_proj.bias is not None:
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)


def _renamed_cache(cache, kv_cache):
    """``cache``, or the deprecated ``kv_cache=`` keyword it replaced (with a DeprecationWarning)."""
    if kv_cache is None:
        return cache
    if cache is not None:
        raise ValueError("pass the layer's cache once, as cache= (kv_cache= is its deprecated old name)")
    warnings.warn("MultiHeadAttention(..., kv_cache=) is deprecated; pass cache= instead",
                  DeprecationWarning, stacklevel=3)
    return kv_cache
