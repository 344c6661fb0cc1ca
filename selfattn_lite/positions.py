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
import numbers
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ._checks import check_positive_int

__all__ = [
    "sinusoidal_encoding",
    "rope_inv_freq",
    "scaled_inv_freq",
    "validate_scaling",
    "linear_inv_freq",
    "ntk_base",
    "yarn_keep",
    "yarn_inv_freq",
    "yarn_attention_scaling",
    "llama3_inv_freq",
    "apply_rotary",
    "RotaryEmbedding",
    "interleaved_to_half_permutation",
    "half_to_interleaved_permutation",
    "permute_qk_rows",
    "apply_rotary_2d",
    "alibi_slopes",
    "alibi_bias",
    "SCALING_KINDS",
]

SCALING_KINDS = ("linear", "ntk", "yarn", "llama3")

# Keys each scaling kind accepts: required ones, and optional ones with their defaults.
_REQUIRED = {"linear": ("factor",), "ntk": ("factor",), "yarn": ("factor", "original_max_len"),
             "llama3": ("factor", "original_max_len")}
_DEFAULTS = {"linear": {}, "ntk": {}, "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
             "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}


def _is_int(n) -> bool:
    """A Python or NumPy integer (numbers.Integral), but not a bool."""
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _is_real(x) -> bool:
    """A Python or NumPy int or float (numbers.Real), but not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_head_dim(head_dim) -> int:
    if not _is_int(head_dim) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (dimensions are rotated in pairs), got {head_dim!r}")
    return int(head_dim)


def _check_base(base) -> float:
    if not _is_real(base) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


def _check_bool(name: str, flag) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be True or False, got {flag!r}")
    return flag


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
    """
    check_positive_int("n_positions", n_positions)
    if not _is_int(d_model) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even int (sin and cos come in pairs), got {d_model!r}")
    base = _check_base(base)
    m = torch.arange(n_positions, dtype=torch.float64)[:, None]      # (n, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)[None, :]     # (1, d/2)
    angles = m / base ** (2 * i / d_model)                           # (n, d/2)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1)           # (n, d/2, 2)
    return pe.flatten(-2).to(torch.float32)                          # (n, d): sin, cos, sin, cos...


# --------------------------------------------------------------------------------------
# RoPE frequencies and their context-extension variants
# --------------------------------------------------------------------------------------

def rope_inv_freq(head_dim: int, base: float = 10000.0) -> Tensor:
    """The rotation frequencies of RoPE (RoFormer, eq. 15): theta_i = base^(-2i/d).

    Args:
        head_dim: d, even.
        base: 10000 in RoFormer and Llama 2, 500000 in Llama 3.

    Returns:
        (d/2,) float32: theta_0 = 1 (a full turn every 2 pi tokens) down to about 1 / base.
    """
    _check_head_dim(head_dim)
    base = _check_base(base)
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (base ** (-2 * i / head_dim)).to(torch.float32)


def validate_scaling(scaling: dict, head_dim: int | None = None) -> dict:
    """Check a ``scaling`` dict and return a copy with the defaults filled in.

    ``{"kind": "linear" | "ntk" | "yarn" | "llama3", "factor": s}`` plus ``original_max_len``
    (yarn, llama3), ``beta_fast``/``beta_slow`` (yarn, default 32/1) and
    ``low_freq_factor``/``high_freq_factor`` (llama3, default 1/4). Numbers may be Python
    or NumPy scalars; the copy holds ``original_max_len`` as an int, the rest as floats.

    Raises:
        ValueError: naming the kind, key or value at fault.
    """
    if not isinstance(scaling, dict):
        raise ValueError(f"scaling must be a dict like {{'kind': 'linear', 'factor': 2.0}}, got {scaling!r}")
    kind = scaling.get("kind")
    if kind not in SCALING_KINDS:
        raise ValueError(f"unknown scaling kind {kind!r}; expected one of {list(SCALING_KINDS)}")
    allowed = {"kind", *_REQUIRED[kind], *_DEFAULTS[kind]}
    unknown = sorted(set(scaling) - allowed)
    if unknown:
        raise ValueError(f"scaling kind {kind!r} does not take {unknown}; its keys are {sorted(allowed)}")
    missing = [key for key in _REQUIRED[kind] if key not in scaling]
    if missing:
        raise ValueError(f"scaling kind {kind!r} needs {missing} (got keys {sorted(scaling)})")
    out = {"kind": kind, **_DEFAULTS[kind], **scaling}
    for key, value in out.items():
        if key == "kind":
            continue
        if not _is_real(value) or not 0 < value < math.inf:
            raise ValueError(f"scaling {key!r} must be a positive number, got {value!r} (kind {kind!r})")
        out[key] = float(value)                  # NumPy scalars become plain floats
    if kind in ("yarn", "llama3"):
        out["original_max_len"] = check_positive_int("scaling 'original_max_len'", scaling["original_max_len"])
    if kind == "yarn" and not out["beta_fast"] > out["beta_slow"]:
        raise ValueError(f"yarn needs beta_fast > beta_slow, got beta_fast={out['beta_fast']}, "
                         f"beta_slow={out['beta_slow']}")
    if kind == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise ValueError(f"llama3 needs high_freq_factor > low_freq_factor, got high_freq_factor="
                         f"{out['high_freq_factor']}, low_freq_factor={out['low_freq_factor']}")
    if kind == "ntk" and head_dim is not None and head_dim < 4:
        raise ValueError(f"ntk scaling needs head_dim >= 4 (its exponent is d / (d - 2)), got head_dim={head_dim}")
    return out


def linear_inv_freq(inv_freq: Tensor, factor: float) -> Tensor:
    """Position interpolation (Chen et al., 2023): position m is read as m / s.

    Rotating by (m / s) * theta_i is rotating by m * (theta_i / s), so every frequency is
    divided by the factor s: a sequence s times longer covers the trained angles.
    """
    return inv_freq / factor


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """NTK-aware base change: b' = b * s^(d / (d - 2)).

    Chosen so the lowest frequency is divided by exactly s (like interpolation) while
    the highest one, theta_0 = 1, is left alone (like extrapolation); the ones between
    are divided by s^(2i / (d - 2)).
    """
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_keep(head_dim: int, base: float, original_max_len: int,
              beta_fast: float = 32.0, beta_slow: float = 1.0) -> Tensor:
    """YaRN's ramp gamma_i: 1 = keep theta_i (extrapolate), 0 = divide it by s (interpolate).

    Pair i turns r_i = L / lambda_i times over the original context L. Pairs with
    r_i > beta_fast are kept, pairs with r_i < beta_slow are interpolated. The paper
    ramps linearly in r between the two; the released code (and Hugging Face, vLLM...)
    ramps linearly in the pair index i between the pairs where r = beta_fast and
    r = beta_slow, rounded outwards. This follows the code, so checkpoints load
    unchanged; both agree wherever the ramp is 0 or 1.

    Returns:
        (d/2,) float32 in [0, 1].
    """
    def pair_with_turns(turns: float) -> float:  # the i where r_i = turns
        return head_dim * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_with_turns(beta_fast)), 0)
    high = min(math.ceil(pair_with_turns(beta_slow)), head_dim - 1)
    if high == low:
        high += 0.001  # avoid dividing by zero
    i = torch.arange(head_dim // 2, dtype=torch.float32)
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)   # 0 at fast pairs, 1 at slow pairs
    return 1.0 - ramp


def yarn_inv_freq(inv_freq: Tensor, factor: float, keep: Tensor) -> Tensor:
    """YaRN's "NTK-by-parts" frequencies: h(theta_i) = (1 - gamma_i) theta_i / s + gamma_i theta_i."""
    return (1 - keep) * inv_freq / factor + keep * inv_freq


def yarn_attention_scaling(factor: float) -> float:
    """YaRN's temperature: sqrt(1/t) = 0.1 ln(s) + 1, multiplying both cos and sin.

    Since q and k are both rotated, the scores q.k are multiplied by 1/t: slightly
    sharper attention, which makes up for the flatter scores of a longer context.
    """
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def llama3_inv_freq(inv_freq: Tensor, factor: float, original_max_len: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> Tensor:
    """Llama 3.1's frequency scaling: keep short wavelengths, interpolate long ones.

    With r_i = L / lambda_i (turns over the original context L):
    r_i > high_freq_factor keeps theta_i, r_i < low_freq_factor uses theta_i / s, and in
    between blends linearly in r with smooth = (r_i - low) / (high - low):
    (1 - smooth) theta_i / s + smooth theta_i. (This is the YaRN paper's ramp with
    alpha = low_freq_factor, beta = high_freq_factor, and no temperature.)
    """
    wavelength = 2 * math.pi / inv_freq                                   # lambda_i, tokens per turn
    turns = original_max_len / wavelength                                 # r_i
    smooth = ((turns - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def scaled_inv_freq(head_dim: int, base: float = 10000.0, scaling: dict | None = None) -> tuple[Tensor, float]:
    """RoPE frequencies after an optional context-extension ``scaling``.

    Args:
        head_dim: d, even.
        base: the RoPE base b.
        scaling: None, or a dict as in ``validate_scaling``.

    Returns:
        inv_freq (d/2,) float32, and attention_scaling (the factor on cos and sin; not 1
        only for yarn).
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
    """
    _check_rotary_args(x, cos, sin, interleaved)
    dtype = x.dtype
    x = x.float() if dtype in (torch.float16, torch.bfloat16) else x
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

    A model whose layers share one ``RotaryEmbedding`` computes cos and sin once per forward
    with ``shared_angles`` (as transformers' Llama hands ``position_embeddings`` to every layer).
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
        self._shared = None                     # (positions, cos, sin) inside ``shared_angles``

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

    def cos_sin(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles m * theta_i, times attention_scaling.

        Args:
            positions: (T,) or (B, T) integer positions m.
            dtype: float32 (as Hugging Face and Meta compute them) or float64.

        Returns:
            cos, sin: (T, d/2) or (B, T, d/2).
        """
        angles = positions[..., None].to(dtype) * self.inv_freq.to(dtype)   # (..., T, d/2)
        if self.attention_scaling == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling

    @contextmanager
    def shared_angles(self, positions: Tensor, dtype: torch.dtype = torch.float32):
        """Compute cos and sin of ``positions`` once, for every ``rope(x, positions)`` inside the ``with``.

        A decoder's layers all call the same module twice (q, then k) with the same positions;
        inside the block, a call with this very ``positions`` tensor reuses the angles
        computed here instead of computing its own. Any other positions, or x of another
        precision, get their own cos and sin, exactly as outside the block::

            positions = torch.arange(past, past + T)               # (T,)
            with rope.shared_angles(positions):                    # cos, sin: computed here, once
                for block in blocks:
                    x = block(x, positions=positions)              # rope(q, positions), rope(k, positions)

        Args:
            positions: (T,) or (B, T) integer positions, the tensor the layers will pass.
            dtype: the precision of the angles, float32 (float64 for float64 x).

        Yields:
            (cos, sin), each (T, d/2) or (B, T, d/2).
        """
        if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
            got = f"dtype {positions.dtype}" if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(f"positions must be an integer tensor (e.g. torch.long), got {got}")
        cos, sin = self.cos_sin(positions, dtype)
        outer, self._shared = self._shared, (positions, cos, sin)
        try:
            yield cos, sin
        finally:
            self._shared = outer

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

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate x by its positions.

        Args:
            x: (..., T, d) queries or keys, e.g. (B, h, T, d).
            positions: (T,) or (B, T) absolute integer positions; default 0 .. T-1. With a
                KV cache, pass the true positions of the new tokens (e.g. T_cached + 0 ..).

        Returns:
            (..., T, d) rotated, same dtype as x.
        """
        if positions is None and isinstance(x, Tensor) and x.dim() >= 2:
            positions = torch.arange(x.shape[-2], device=x.device)
        self._check(x, positions)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        shared = self._shared
        if shared is not None and positions is shared[0] and shared[1].dtype == dtype:
            cos, sin = shared[1:]                                         # from ``shared_angles``
        else:
            cos, sin = self.cos_sin(positions.to(x.device), dtype)        # (T, d/2) or (B, T, d/2)
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
    """
    _check_head_dim(head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def half_to_interleaved_permutation(head_dim: int) -> Tensor:
    """Index p with x_interleaved = x_half[..., p]: the inverse of ``interleaved_to_half_permutation``."""
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
    """
    if to not in ("half", "interleaved"):
        raise ValueError(f"to must be 'half' or 'interleaved', got {to!r}")
    check_positive_int("n_heads", n_heads)
    if not isinstance(weight, Tensor) or weight.dim() not in (1, 2) or weight.shape[0] % n_heads:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be (n_heads * head_dim, d_in) or (n_heads * head_dim,) with "
                         f"n_heads={n_heads} dividing its first dim, got {shape}")
    head_dim = weight.shape[0] // n_heads
    _check_head_dim(head_dim)
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
