"""Context extension: the scalings of RoPE's frequencies that stretch a model past its trained length.

RoPE rotates pair i of a query or key at position m by m * theta_i (``positions.rope_inv_freq``).
A model trained on L tokens has never seen angles beyond L * theta_i; each scaling changes the
frequencies so that a context s = ``factor`` times longer stays (mostly) inside the trained angles:

* linear (position interpolation):  theta_i' = theta_i / s
* ntk (NTK-aware):                  b' = b * s^(d / (d - 2)), so theta_i' = b'^(-2i/d)
* yarn ("NTK-by-parts"):            theta_i' = (1 - gamma_i) theta_i / s + gamma_i theta_i,
                                    and cos, sin times sqrt(1/t) = 0.1 ln(s) + 1
* llama3 (Llama 3.1):               the same blend, ramped in turns over the original context

``positions.RotaryEmbedding(head_dim, scaling={"kind": ..., "factor": s, ...})`` applies them;
``positions.scaled_inv_freq`` picks one by its dict. Taught in notebook 12, "Four ways to slow the
rotations down" (introduced in notebook 05, "Longer contexts").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_int, check_positive_int, check_real, check_tensor, is_real, shape_str

__all__ = [
    "SCALING_KINDS",
    "linear_inv_freq",
    "ntk_base",
    "yarn_keep",
    "yarn_inv_freq",
    "yarn_attention_scaling",
    "llama3_inv_freq",
    "validate_scaling",
]

def linear_inv_freq(inv_freq: Tensor, factor: float) -> Tensor:
    """Position interpolation (Chen et al., 2023): position m is read as m / s.

    Rotating by (m / s) * theta_i is rotating by m * (theta_i / s), so every frequency is
    divided by the factor s: a sequence s times longer covers the trained angles.

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    _check_inv_freq(inv_freq)
    factor = _check_factor(factor)
    return inv_freq / factor


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """NTK-aware base change: b' = b * s^(d / (d - 2)).

    Chosen so the lowest frequency is divided by exactly s (like interpolation) while
    the highest one, theta_0 = 1, is left alone (like extrapolation); the ones between
    are divided by s^(2i / (d - 2)).

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    base, factor = _check_base(base), _check_factor(factor)
    head_dim = _check_head_dim(head_dim, low=4)
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

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    head_dim, base = _check_head_dim(head_dim), _check_base(base)
    original_max_len = check_positive_int("original_max_len", original_max_len)
    beta_fast = check_real("beta_fast", beta_fast, low=0, low_open=True)
    beta_slow = check_real("beta_slow", beta_slow, low=0, low_open=True)

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
    """YaRN's "NTK-by-parts" frequencies: h(theta_i) = (1 - gamma_i) theta_i / s + gamma_i theta_i.

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    _check_inv_freq(inv_freq)
    factor = _check_factor(factor)
    check_tensor("keep", keep, dim=1, layout="(d/2,)", floating=True)
    if keep.shape != inv_freq.shape:
        raise ValueError(f"keep {shape_str(keep)} must have the shape of inv_freq {shape_str(inv_freq)}")
    return (1 - keep) * inv_freq / factor + keep * inv_freq


def yarn_attention_scaling(factor: float) -> float:
    """YaRN's temperature: sqrt(1/t) = 0.1 ln(s) + 1, multiplying both cos and sin.

    Since q and k are both rotated, the scores q.k are multiplied by 1/t: slightly
    sharper attention, which makes up for the flatter scores of a longer context.

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    factor = _check_factor(factor)
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def llama3_inv_freq(inv_freq: Tensor, factor: float, original_max_len: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> Tensor:
    """Llama 3.1's frequency scaling: keep short wavelengths, interpolate long ones.

    With r_i = L / lambda_i (turns over the original context L):
    r_i > high_freq_factor keeps theta_i, r_i < low_freq_factor uses theta_i / s, and in
    between blends linearly in r with smooth = (r_i - low) / (high - low):
    (1 - smooth) theta_i / s + smooth theta_i. (This is the YaRN paper's ramp with
    alpha = low_freq_factor, beta = high_freq_factor, and no temperature.)

    Taught in notebook 12, "Four ways to slow the rotations down".
    """
    _check_inv_freq(inv_freq)
    factor = _check_factor(factor)
    original_max_len = check_positive_int("original_max_len", original_max_len)
    low_freq_factor = check_real("low_freq_factor", low_freq_factor, low=0, low_open=True)
    high_freq_factor = check_real("high_freq_factor", high_freq_factor, low=0, low_open=True)
    if not high_freq_factor > low_freq_factor:
        raise ValueError(f"high_freq_factor={high_freq_factor} must be > low_freq_factor={low_freq_factor}")
    wavelength = 2 * math.pi / inv_freq                                   # lambda_i, tokens per turn
    turns = original_max_len / wavelength                                 # r_i
    smooth = ((turns - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _check_inv_freq(inv_freq) -> Tensor:
    check_tensor("inv_freq", inv_freq, dim=1, layout="(d/2,)", floating=True)
    if not (inv_freq > 0).all():
        raise ValueError("inv_freq must hold positive frequencies (see positions.rope_inv_freq)")
    return inv_freq


def _check_factor(factor) -> float:
    return check_real("factor", factor, low=0, low_open=True, high=math.inf, high_open=True)


def _check_base(base) -> float:
    return check_real("base", base, low=1, low_open=True, high=math.inf, high_open=True)


def _check_head_dim(head_dim, low: int = 2) -> int:
    head_dim = check_int("head_dim", head_dim, low=low)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {head_dim}")
    return head_dim


# --------------------------------------------------------------------------------------
# The scaling dict, checked
# --------------------------------------------------------------------------------------

SCALING_KINDS = ("linear", "ntk", "yarn", "llama3")

# Keys each scaling kind accepts: required ones, and optional ones with their defaults.
_REQUIRED = {"linear": ("factor",), "ntk": ("factor",), "yarn": ("factor", "original_max_len"),
             "llama3": ("factor", "original_max_len")}
_DEFAULTS = {"linear": {}, "ntk": {}, "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
             "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}


def validate_scaling(scaling: dict, head_dim: int | None = None) -> dict:
    """Check a ``scaling`` dict and return a copy with the defaults filled in.

    ``{"kind": "linear" | "ntk" | "yarn" | "llama3", "factor": s}`` plus ``original_max_len``
    (yarn, llama3), ``beta_fast``/``beta_slow`` (yarn, default 32/1) and
    ``low_freq_factor``/``high_freq_factor`` (llama3, default 1/4). Numbers may be Python
    or NumPy scalars; the copy holds ``original_max_len`` as an int, the rest as floats.

    Raises:
        ValueError: naming the kind, key or value at fault.

    Taught in notebook 12, "Four ways to slow the rotations down".
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
        if not is_real(value) or not 0 < value < math.inf:
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
    if head_dim is not None:
        check_positive_int("head_dim", head_dim)
    if kind == "ntk" and head_dim is not None and head_dim < 4:
        raise ValueError(f"ntk scaling needs head_dim >= 4 (its exponent is d / (d - 2)), got head_dim={head_dim}")
    return out
