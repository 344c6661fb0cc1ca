"""Positional information: sinusoidal encodings, rotary embeddings (RoPE), ALiBi.

Attention alone is permutation-equivariant: shuffle the tokens and the outputs shuffle
the same way. Order has to be injected, and there are three places to do it:

* add a position vector to each token embedding x_m (sinusoidal or learned);
* rotate q and k by an angle proportional to the position (RoPE), so that q_m . k_n
  depends on m - n only;
* add a distance penalty to the scores q_m . k_n (ALiBi).

Conventions: ``head_dim`` is written d in formulas, positions m (query) and n (key),
theta_i = base^(-2i/d) for i = 0 .. d/2 - 1 is the angular frequency of pair i, and
lambda_i = 2 pi / theta_i its wavelength in tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import check_float_dtype, check_positive_int, check_tensor, is_int, is_real, shape_str
from .attention import upcast_dtype
from .rope_scaling import (
    linear_inv_freq,
    llama3_inv_freq,
    ntk_base,
    validate_scaling,
    yarn_attention_scaling,
    yarn_inv_freq,
    yarn_keep,
)

__all__ = [
    "sinusoidal_encoding",
    "rope_inv_freq",
    "scaled_inv_freq",
    "apply_rotary",
    "RotaryEmbedding",
    "interleaved_to_half_permutation",
    "half_to_interleaved_permutation",
    "permute_qk_rows",
    "apply_rotary_2d",
    "alibi_slopes",
    "alibi_bias",
]

# --------------------------------------------------------------------------------------
# Sinusoidal encoding (Vaswani et al., 2017)
# --------------------------------------------------------------------------------------

def sinusoidal_encoding(n_positions: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The fixed sinusoidal position encodings of the original Transformer.

        PE[m, 2i]     = sin(m / base^(2i / d_model))
        PE[m, 2i + 1] = cos(m / base^(2i / d_model))

    Args:
        n_positions: number of positions m = 0 .. n_positions - 1.
        d_model: embedding width (even).
        base: 10000 in the paper.

    Returns:
        (n_positions, d_model) float32 tensor, added to the token embeddings.

    Taught in notebook 05, "Sinusoidal encodings".
    """
    check_positive_int("n_positions", n_positions)
    if not is_int(d_model) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even int (sin and cos come in pairs), got {d_model!r}")
    base = _check_base(base)
    m = torch.arange(n_positions, dtype=torch.float64)[:, None]      # (n, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)[None, :]     # (1, d/2)
    angles = m / base ** (2 * i / d_model)                           # (n, d/2)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1)           # (n, d/2, 2)
    return pe.flatten(-2).to(torch.float32)                          # (n, d): sin, cos, sin, cos...


# --------------------------------------------------------------------------------------
# RoPE frequencies (the context-extension scalings themselves live in rope_scaling)
# --------------------------------------------------------------------------------------

def rope_inv_freq(head_dim: int, base: float = 10000.0) -> Tensor:
    """The rotation frequencies of RoPE (RoFormer, eq. 15): theta_i = base^(-2i/d).

    Args:
        head_dim: d, even.
        base: 10000 in RoFormer and Llama 2, 500000 in Llama 3.

    Returns:
        (d/2,) float32: theta_0 = 1 (a full turn every 2 pi tokens) down to about 1 / base.

    Taught in notebook 05, "A whole head: d/2 pairs, d/2 frequencies".
    """
    _check_head_dim(head_dim)
    base = _check_base(base)
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (base ** (-2 * i / head_dim)).to(torch.float32)


def scaled_inv_freq(head_dim: int, base: float = 10000.0, scaling: dict | None = None) -> tuple[Tensor, float]:
    """RoPE frequencies after an optional context-extension ``scaling``.

    Args:
        head_dim: d, even.
        base: the RoPE base b.
        scaling: None, or a dict as in ``validate_scaling``.

    Returns:
        inv_freq (d/2,) float32, and attention_scaling (the factor on cos and sin; not 1
        only for yarn).

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    _check_head_dim(head_dim)
    base = _check_base(base)
    if scaling is None:
        return rope_inv_freq(head_dim, base), 1.0
    s = validate_scaling(scaling, head_dim)
    kind, factor = s["kind"], s["factor"]
    if kind == "ntk":
        return rope_inv_freq(head_dim, ntk_base(base, factor, head_dim)), 1.0
    inv_freq = rope_inv_freq(head_dim, base)
    if kind == "linear":
        return linear_inv_freq(inv_freq, factor), 1.0
    if kind == "yarn":
        keep = yarn_keep(head_dim, base, s["original_max_len"], s["beta_fast"], s["beta_slow"])
        return yarn_inv_freq(inv_freq, factor, keep), yarn_attention_scaling(factor)
    return llama3_inv_freq(inv_freq, factor, s["original_max_len"], s["low_freq_factor"],
                           s["high_freq_factor"]), 1.0


# --------------------------------------------------------------------------------------
# Applying the rotation
# --------------------------------------------------------------------------------------

def _check_rotary_args(x, cos, sin, interleaved) -> None:
    _check_bool("interleaved", interleaved)
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or t.dim() < 1 or not t.is_floating_point():
            got = f"shape {tuple(t.shape)} and dtype {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating tensor with at least one dim, got {got}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x's last dim must be even (dimensions are rotated in pairs), got x of shape "
                         f"{tuple(x.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    try:
        fits = cos.shape[-1] == d // 2 and torch.broadcast_shapes(cos.shape[:-1], x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"cos and sin must have shape (..., {d // 2}), broadcastable to x's shape without its "
                         f"last dim {tuple(x.shape[:-1])} (x has shape {tuple(x.shape)}), got {tuple(cos.shape)}")


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate each pair (a, b) of x's last dim by its angle: (a cos - b sin, a sin + b cos).

    Half-split pairing (GPT-NeoX, Hugging Face Llama): pair i is (x[i], x[i + d/2]).
    Interleaved pairing (RoFormer, Meta's Llama code): pair i is (x[2i], x[2i + 1]).

    Args:
        x: (..., T, d), floating, d even.
        cos, sin: (..., T, d/2), the same shape, broadcastable to x without its last dim.
        interleaved: True for (x[2i], x[2i + 1]) pairs, False for (x[i], x[i + d/2]).

    Returns:
        (..., T, d), same dtype as x (computed in float32 for half-precision x).

    Raises:
        ValueError: naming the shapes, if d is odd or cos and sin do not fit x.

    Taught in notebook 05, "RoPE: rotate queries and keys".
    """
    _check_rotary_args(x, cos, sin, interleaved)
    dtype = x.dtype
    x = x.to(upcast_dtype(dtype))
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]                                 # (..., T, d/2) each
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = x.chunk(2, dim=-1)                                         # (..., T, d/2) each
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al., 2021), applied as ``rope(x, positions)``.

    Pair i of a query or key at position m is rotated by the angle m * theta_i. Because
    rotations compose, R(m)^T R(n) = R(n - m), and so q_m . k_n depends on the offset only.

    Args:
        head_dim: d, the per-head width (even).
        base: b in theta_i = b^(-2i/d).
        interleaved: pair (2i, 2i+1) as in RoFormer / Meta's checkpoints, instead of
            (i, i + d/2) as in GPT-NeoX / Hugging Face Llama.
        scaling: None or a context-extension dict (see ``validate_scaling``):
            {"kind": "linear" | "ntk" | "yarn" | "llama3", "factor": s, ...}.

    Attributes:
        inv_freq: (d/2,) float32 buffer, the (scaled) frequencies theta_i.
        attention_scaling: the factor multiplying cos and sin (YaRN's sqrt(1/t), else 1.0).

    A model whose layers share one ``RotaryEmbedding`` computes cos and sin once per forward,
    ``angles = rope.angles(positions)``, and hands them to every layer, which rotates with
    ``rope(x, positions, angles=angles)`` (as transformers' Llama passes ``position_embeddings``).

    Taught in notebook 05, "Plugging RoPE into multi-head attention, and decoding with a cache".
    """

    def __init__(self, head_dim: int, base: float = 10000.0, *, interleaved: bool = False,
                 scaling: dict | None = None):
        super().__init__()
        inv_freq, attention_scaling = scaled_inv_freq(head_dim, base, scaling)
        self.head_dim, self.base = _check_head_dim(head_dim), _check_base(base)
        self.interleaved = _check_bool("interleaved", interleaved)
        self.scaling = None if scaling is None else validate_scaling(scaling, head_dim)
        self.attention_scaling = attention_scaling
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """``.to(device, dtype)``, ``.cuda()``, ``.bfloat16()``: move ``inv_freq``, never round it.

        The angles m * theta_i reach hundreds of radians; with theta_i in bf16 (8 significant
        bits) cos(m * theta_i) is off by up to 0.09 at m = 500. So the buffer keeps its float32
        values on the new device, and ``forward`` casts cos and sin, not the frequencies.
        """
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(device=self.inv_freq.device)      # float32 values, new device
        return self

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, base={self.base:g}, interleaved={self.interleaved}, "
                f"scaling={self.scaling}")

    def angles(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles m * theta_i, times attention_scaling.

        Args:
            positions: (T,) or (B, T) integer positions m.
            dtype: float32 (as Hugging Face and Meta compute them) or float64.

        Returns:
            cos, sin: (T, d/2) or (B, T, d/2).
        """
        check_tensor("positions", positions)
        if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
            raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        check_float_dtype("dtype", dtype)
        angles = positions[..., None].to(dtype) * self.inv_freq.to(dtype)   # (..., T, d/2)
        if self.attention_scaling == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling

    def _check_angles(self, angles, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        want = (*positions.shape, self.head_dim // 2)
        if not (isinstance(angles, (tuple, list)) and len(angles) == 2
                and all(isinstance(t, Tensor) and tuple(t.shape) == want and t.dtype == dtype for t in angles)):
            got = [f"{shape_str(t)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__ for t in angles] \
                if isinstance(angles, (tuple, list)) else type(angles).__name__
            raise ValueError(f"angles must be (cos, sin), each of shape {want} and dtype {dtype} "
                             f"(rope.angles(positions, {dtype}) for positions {shape_str(positions)}), got {got}")
        return angles[0], angles[1]

    def _check(self, x: Tensor, positions: Tensor) -> None:
        if not isinstance(x, Tensor) or x.dim() < 2 or not x.is_floating_point():
            got = f"shape {tuple(x.shape)} and dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a floating (..., T, head_dim) tensor, got {got}")
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has last dim {x.shape[-1]} but this RotaryEmbedding has head_dim={self.head_dim} "
                             f"(x shape {tuple(x.shape)})")
        if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.dtype == torch.bool \
                or positions.is_complex():
            got = f"dtype {positions.dtype}" if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(f"positions must be an integer tensor (e.g. torch.long), got {got}")
        T = x.shape[-2]
        ok = positions.dim() == 1 and positions.shape[0] == T
        ok = ok or (positions.dim() == 2 and x.dim() >= 3 and positions.shape[1] == T
                    and positions.shape[0] in (1, x.shape[0]))
        if not ok:
            raise ValueError(f"positions must have shape (T,) = ({T},) or (B, T) = ({x.shape[0]}, {T}) for x of "
                             f"shape {tuple(x.shape)} (B = first dim, T = second to last), "
                             f"got {tuple(positions.shape)}")

    def forward(self, x: Tensor, positions: Tensor | None = None, *,
                angles: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Rotate x by its positions.

        Args:
            x: (..., T, d) queries or keys, e.g. (B, h, T, d).
            positions: (T,) or (B, T) absolute integer positions; default 0 .. T-1. With a
                KV cache, pass the true positions of the new tokens (e.g. T_cached + 0 ..).
            angles: optional (cos, sin) = ``self.angles(positions, dtype)``, computed once by the
                caller for every layer (float64 for float64 x, else float32); None computes them here.

        Returns:
            (..., T, d) rotated, same dtype as x.
        """
        if positions is None and isinstance(x, Tensor) and x.dim() >= 2:
            positions = torch.arange(x.shape[-2], device=x.device)
        self._check(x, positions)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        if angles is None:
            cos, sin = self.angles(positions.to(x.device), dtype)         # (T, d/2) or (B, T, d/2)
        else:
            cos, sin = self._check_angles(angles, positions, dtype)
        if positions.dim() == 2:                                          # (B, T, d/2) -> (B, 1, .., T, d/2)
            cos = cos.reshape(cos.shape[0], *[1] * (x.dim() - 3), *cos.shape[1:])
            sin = sin.reshape(cos.shape)
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)


# --------------------------------------------------------------------------------------
# Converting checkpoints between the two pairings
# --------------------------------------------------------------------------------------

def interleaved_to_half_permutation(head_dim: int) -> Tensor:
    """Index p with x_half = x_interleaved[..., p]: (0, 2, 4, .., d-2, 1, 3, .., d-1).

    Interleaved pair i sits at (2i, 2i+1); half-split pair i sits at (i, i + d/2).

    Taught in notebook 05, "Two pairing conventions, one model".
    """
    _check_head_dim(head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def half_to_interleaved_permutation(head_dim: int) -> Tensor:
    """Index p with x_interleaved = x_half[..., p]: the inverse of ``interleaved_to_half_permutation``.

    Taught in notebook 05, "Two pairing conventions, one model".
    """
    return torch.argsort(interleaved_to_half_permutation(head_dim))


def permute_qk_rows(weight: Tensor, n_heads: int, *, to: str = "half") -> Tensor:
    """Reorder the rows of a q or k projection so a checkpoint works with the other pairing.

    Row h * d + j of W_q produces coordinate j of head h. Permuting those coordinates
    inside every head, the same way for q and k, leaves every q . k unchanged, and makes
    the half-split rotation of the new model equal the interleaved rotation of the old one.

    Args:
        weight: (n_heads * d, d_in) weight or (n_heads * d,) bias of q_proj / k_proj.
        n_heads: number of heads sharing this projection (n_kv_heads for k_proj under GQA).
        to: "half" (interleaved -> half-split, e.g. Meta -> Hugging Face) or "interleaved".

    Returns:
        The weight with its rows permuted, same shape.

    Taught in notebook 05, "Two pairing conventions, one model".
    """
    if to not in ("half", "interleaved"):
        raise ValueError(f"to must be 'half' or 'interleaved', got {to!r}")
    check_positive_int("n_heads", n_heads)
    if not isinstance(weight, Tensor) or weight.dim() not in (1, 2) or weight.shape[0] % n_heads:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be (n_heads * head_dim, d_in) or (n_heads * head_dim,) with "
                         f"n_heads={n_heads} dividing its first dim, got {shape}")
    head_dim = weight.shape[0] // n_heads
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (dimensions are rotated in pairs), got {head_dim}: "
                         f"weight {shape_str(weight)} has {weight.shape[0]} rows for n_heads={n_heads}")
    perm = interleaved_to_half_permutation(head_dim) if to == "half" else half_to_interleaved_permutation(head_dim)
    heads = weight.reshape(n_heads, head_dim, *weight.shape[1:])          # (h, d, d_in)
    return heads[:, perm.to(weight.device)].reshape(weight.shape)


def apply_rotary_2d(x: Tensor, rows: Tensor, cols: Tensor, base: float = 10000.0) -> Tensor:
    """Axial 2D RoPE for image patches: half of the pairs turn with the row, half with the column.

    The first d/2 features of x get 1D RoPE (half-split pairs) at position ``rows``, the last d/2 at
    position ``cols``, each half with the frequencies of a d/2-wide head, theta_i = base^(-4i/d).
    Rotations of different pairs commute, so for a query at patch (r, c) and a key at (r', c')

        rot(q; r, c) . rot(k; r', c') = g(q, k, r - r', c - c'),

    the score depends on the patches' 2D offset only (RoPE-Axial in Heo et al. 2024).
    Taught in notebook 05, section "Images: positions in two dimensions".

    Args:
        x: (..., T, d), floating, d divisible by 4; one row per patch.
        rows, cols: (T,) the patch coordinates (integers or floats).
        base: the frequencies' base, as in ``rope_inv_freq``.

    Returns:
        (..., T, d), the same dtype as x.

    Raises:
        ValueError: naming the shapes, if d is not a multiple of 4 or rows / cols are not (T,).

    Taught in notebook 05, "Images: positions in two dimensions".
    """
    if not isinstance(x, Tensor) or x.dim() < 2 or not x.is_floating_point():
        got = f"shape {tuple(x.shape)} and dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating tensor (..., T, d), got {got}")
    T, d = x.shape[-2], x.shape[-1]
    if d % 4:
        raise ValueError(f"x's last dim must be a multiple of 4 (two halves of pairs), got x of shape {tuple(x.shape)}")
    for name, p in (("rows", rows), ("cols", cols)):
        if not isinstance(p, Tensor) or p.shape != (T,):
            got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{name} must be a ({T},) tensor, one coordinate per patch of x "
                             f"{tuple(x.shape)}, got {got}")
    inv_freq = rope_inv_freq(d // 2, base).to(x.device)                       # (d/4,)
    halves = []
    for half, pos in zip(x.chunk(2, dim=-1), (rows, cols)):                   # (..., T, d/2) each
        angles = pos.to(device=x.device, dtype=torch.float32)[:, None] * inv_freq    # (T, d/4)
        halves.append(apply_rotary(half, angles.cos(), angles.sin()))
    return torch.cat(halves, dim=-1)


# --------------------------------------------------------------------------------------
# ALiBi (Press et al., 2021)
# --------------------------------------------------------------------------------------

def alibi_slopes(n_heads: int) -> Tensor:
    """The head-specific slopes m_h of ALiBi.

    For n a power of two: a geometric sequence starting at 2^(-8/n) with that same
    ratio, m_h = 2^(-8h/n), h = 1 .. n (n = 8: 1/2, 1/4, ..., 1/256). Otherwise the
    slopes of the closest smaller power of two c, followed by every other slope of 2c
    (the odd-numbered ones), until there are n, as in the paper's reference code.

    Returns:
        (n_heads,) float32. Decreasing for a power of two; otherwise two decreasing runs,
        e.g. 6 heads: 1/4, 1/16, 1/64, 1/256 (the slopes of 4), then 1/2, 1/8 (from those of 8).

    Taught in notebook 05, "ALiBi: a distance penalty instead of a rotation".
    """
    check_positive_int("n_heads", n_heads)

    def power_of_two_slopes(n: int) -> list[float]:
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    c = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(c) + power_of_two_slopes(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, L: int, S: int | None = None, *, device=None) -> Tensor:
    """ALiBi's additive bias: -m_h * |distance| between query and key positions.

    The L queries are the last L of the S positions (bottom-right, as when new tokens
    follow a KV cache): query i sits at position i + S - L. For a causal model, the only
    use in the paper, the bias at visible keys is -m_h (i + S - L - j); the absolute value
    makes the same penalty symmetric when no causal mask is used.

    Args:
        n_heads: number of heads. L: queries. S: keys (default L, must be >= L).

    Returns:
        (n_heads, L, S) float32, added to the (B, n_heads, L, S) scores before softmax.

    Taught in notebook 05, "ALiBi: a distance penalty instead of a rotation".
    """
    check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    if S < L:
        raise ValueError(f"alibi_bias aligns the L queries to the last L of S keys, so it needs S >= L; "
                         f"got L={L}, S={S}")
    slopes = alibi_slopes(n_heads).to(device)                             # (h,)
    query_pos = torch.arange(S - L, S, device=device)[:, None]            # (L, 1)
    key_pos = torch.arange(S, device=device)[None, :]                     # (1, S)
    distance = (query_pos - key_pos).abs().to(torch.float32)              # (L, S)
    return 0.0 - slopes[:, None, None] * distance                         # (h, L, S); 0.0 - : no -0.0


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------

def _check_head_dim(head_dim) -> int:
    if not is_int(head_dim) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (dimensions are rotated in pairs), got {head_dim!r}")
    return int(head_dim)


def _check_base(base) -> float:
    if not is_real(base) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


def _check_bool(name: str, flag) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be True or False, got {flag!r}")
    return flag
