"""The input checks every module shares: one wording for every error message.

A bad argument gets a ``ValueError`` that names it and shows what came in, e.g.
``n_heads must be a positive int, got 0`` or ``key (2, 4, 8) must have 4 dims (B, H, S, E)``.
Integers may be Python or NumPy integers (``numbers.Integral``), never bools.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

__all__ = ["shape_str", "is_int", "is_real", "check_int", "check_positive_int", "check_tensor", "check_mask"]


def shape_str(t) -> str:
    """'(2, 4, 8)' for a tensor, a torch.Size or a tuple of ints (as Python prints a tuple: '(5,)')."""
    shape = t.shape if isinstance(t, Tensor) else t
    return str(tuple(int(s) for s in shape))


def is_int(n) -> bool:
    """A Python or NumPy integer, but not a bool."""
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def is_real(x) -> bool:
    """A Python or NumPy int or float (numbers.Real), but not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_int(name: str, n, *, low: int = 0, high: int | None = None) -> int:
    """n as a Python int, if it is an integer with low <= n (<= high); else ValueError."""
    if is_int(n) and n >= low and (high is None or n <= high):
        return int(n)
    if high is not None:
        what = f"an int in [{low}, {high}]"
    else:
        what = {0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
    raise ValueError(f"{name} must be {what}, got {n!r}")


def check_positive_int(name: str, n) -> int:
    """n as a Python int, if it is an integer >= 1; else ValueError."""
    return check_int(name, n, low=1)


def check_tensor(name: str, t, *, dim: int | None = None, layout: str = "", floating: bool = False) -> Tensor:
    """t, if it is a tensor (with ``dim`` dims, floating-point when asked); else ValueError.

    ``layout`` names the dims in the message, e.g. ``"(B, H, S, E)"``.
    """
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} {shape_str(t)} must have {dim} dims {layout}".rstrip())
    if floating and not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def check_mask(name: str, mask, scores_shape) -> Tensor:
    """mask, if it is bool (True = may attend) or floating (added) and broadcasts to ``scores_shape``."""
    check_tensor(name, mask)
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"{name} must be bool (True = may attend) or floating (added to the scores), "
                         f"got dtype {mask.dtype}")
    scores_shape = torch.Size(scores_shape)
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {shape_str(mask)} does not broadcast to the scores (..., L, S) "
                         f"of shape {shape_str(scores_shape)}")
    return mask
