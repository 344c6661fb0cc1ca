"""The input checks every module shares: one wording for every error message.

A bad argument gets a ``ValueError`` that names it and shows what came in, e.g.
``n_heads must be a positive int, got 0`` or ``key (2, 4, 8) must have 4 dims (B, H, S, E)``.
Integers may be Python or NumPy integers (``numbers.Integral``), never bools.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["shape_str", "is_int", "is_real", "check_int", "check_positive_int", "check_real", "check_bool",
           "check_choice", "check_tensor", "check_shape", "check_same_dtype", "check_ids", "check_keep_mask",
           "check_mask", "check_qkv", "check_module_dtype", "check_float_dtype",
           "check_scale"]


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


def check_int(name: str, n, *, low: int | None = 0, high: int | None = None) -> int:
    """n as a Python int, if it is an integer with low <= n (<= high); else ValueError. ``low=None``: any int."""
    if is_int(n) and (low is None or n >= low) and (high is None or n <= high):
        return int(n)
    if high is not None:
        what = f"an int in [{low}, {high}]" if low is not None else f"an int <= {high}"
    elif low is None:
        what = "an int"
    else:
        what = {0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
    raise ValueError(f"{name} must be {what}, got {n!r}")


def check_positive_int(name: str, n) -> int:
    """n as a Python int, if it is an integer >= 1; else ValueError."""
    return check_int(name, n, low=1)


def check_real(name: str, x, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
    """x as a float, if it is a real number (not a bool) in the given range; else ValueError.

    ``low_open`` / ``high_open`` exclude the bound itself, e.g. ``low=0, low_open=True``: x > 0.
    """
    ok = is_real(x) and x == x                                         # x == x: not NaN
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if ok:
        return float(x)
    if low is not None and high is not None:
        what = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        what = f"a number {'>' if low_open else '>='} {low}"
    elif high is not None:
        what = f"a number {'<' if high_open else '<='} {high}"
    else:
        what = "a real number"
    raise ValueError(f"{name} must be {what}, got {x!r}")


def check_bool(name: str, x) -> bool:
    """x, if it is a bool (Python or NumPy); else ValueError."""
    if isinstance(x, bool) or type(x).__name__ == "bool_":
        return bool(x)
    raise ValueError(f"{name} must be True or False, got {x!r}")


def check_choice(name: str, x, choices) -> object:
    """x, if it is one of ``choices``; else ValueError listing them."""
    if isinstance(x, str | int | float | bool | None | tuple) and x in tuple(choices):
        return x
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {x!r}")


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


def check_shape(name: str, t: Tensor, shape, *, layout: str = "", against: str = "") -> Tensor:
    """t, if its shape is ``shape`` (None = any size there); else ValueError naming both shapes.

    ``against`` says where the expected shape comes from, e.g. ``"q (2, 4, 8, 16)"``.
    """
    shape = tuple(shape)
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = ", ".join("*" if s is None else str(int(s)) for s in shape) + ("," if len(shape) == 1 else "")
        want = f"({want})"
        where = f" to fit {against}" if against else ""
        what = f"be {layout} = {want}" if layout else f"have shape {want}"
        raise ValueError(f"{name} {shape_str(t)} must {what}{where}")
    return t


def check_same_dtype(**tensors) -> torch.dtype:
    """The one dtype of the named tensors (None entries skipped); else ValueError naming each dtype."""
    named = {n: t for n, t in tensors.items() if t is not None}
    dtypes = {t.dtype for t in named.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n} {t.dtype}" for n, t in named.items())
        raise ValueError(f"{', '.join(named)} must have one dtype, got {listed}: "
                         "convert them first, e.g. .to(torch.float32)")
    return next(iter(dtypes))


def check_ids(name: str, ids, vocab_size: int | None = None, *, dim: int | tuple | None = None,
              layout: str = "", what: str = "integer token ids") -> Tensor:
    """ids as an integer tensor (a tensor, or a list of ints), every id in [0, vocab_size); else ValueError.

    ``dim`` is the number of dims required (an int, or a tuple of those allowed).
    """
    if isinstance(ids, str):
        hint = ": encode the text into ids first" if "token" in what else ""
        raise ValueError(f"{name} must be {what}, got a str{hint}")
    if not isinstance(ids, Tensor):
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name} must be {what} (a tensor or a list of ints), "
                             f"got {type(ids).__name__}") from None
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be {what}, got dtype {ids.dtype}")
    dims = (dim,) if isinstance(dim, int) else dim
    if dims is not None and ids.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name} {shape_str(ids)} must have {want} dims {layout}".rstrip())
    if vocab_size is not None and ids.numel() and ids.device.type != "meta":   # meta tensors hold no values
        low, high = torch.stack(torch.aminmax(ids)).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must be in [0, vocab_size={vocab_size}), got min {low}, max {high}")
    return ids


def check_keep_mask(name: str, mask, shape=None, *, meaning: str = "True = real token") -> Tensor:
    """mask as a bool tensor: bool, or integer 0/1 (1 = True, as Hugging Face's attention_mask); else ValueError.

    With ``shape``, the mask must have it exactly (None = any size there).
    """
    check_tensor(name, mask)
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.is_complex():
            raise ValueError(f"{name} {shape_str(mask)} must be bool ({meaning}) or integer 0/1, "
                             f"got dtype {mask.dtype}")
        if mask.numel() and mask.device.type != "meta" and not ((mask == 0) | (mask == 1)).all():
            raise ValueError(f"{name} must be bool ({meaning}) or integer 0/1, got values "
                             f"{sorted(set(mask.unique().tolist()))[:6]}")
        mask = mask.bool()
    if shape is not None:
        check_shape(name, mask, shape)
    return mask


def check_qkv(query, key, value, *, enable_gqa: bool | None = False, names=("query", "key", "value")) -> None:
    """``validate_qkv`` with the caller's argument names; ``enable_gqa=None``: the caller has no such option."""
    qn, kn, vn = names
    for name, t in ((qn, query), (kn, key), (vn, value)):
        check_tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., seq, dim), got shape {shape_str(t)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"{qn}, {kn} and {vn} must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.shape[-1] == 0:
        raise ValueError(f"{qn} and {kn} need a non-empty last dim E, got {qn} {shape_str(query)}")
    if not (query.dim() == key.dim() == value.dim()):
        raise ValueError(
            f"{qn}, {kn} and {vn} must have the same number of dims, got "
            f"{qn} {shape_str(query)}, {kn} {shape_str(key)}, {vn} {shape_str(value)}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"{qn} and {kn} must share the last dim E: {qn} {shape_str(query)} has E={query.shape[-1]}, "
            f"{kn} {shape_str(key)} has E={key.shape[-1]}"
        )
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"{kn} (..., S, E) and {vn} (..., S, Ev) must agree except in the last dim: "
            f"{kn} {shape_str(key)}, {vn} {shape_str(value)}"
        )
    q_lead, k_lead = list(query.shape[:-2]), list(key.shape[:-2])
    heads_differ = query.dim() >= 3 and q_lead[-1] != k_lead[-1] and 1 not in (q_lead[-1], k_lead[-1])
    if enable_gqa:
        if query.dim() < 3:
            raise ValueError(f"enable_gqa needs a head dim: {qn} (..., Hq, L, E), got {shape_str(query)}")
        hq, hkv = query.shape[-3], key.shape[-3]
        if hkv == 0 or hq % hkv != 0:
            raise ValueError(
                f"enable_gqa: {qn} heads Hq={hq} must be a multiple of {kn}/{vn} heads H={hkv} "
                f"({qn} {shape_str(query)}, {kn} {shape_str(key)})"
            )
        q_lead[-1] = k_lead[-1] = 1  # heads are matched by grouping, not broadcasting
    try:
        torch.broadcast_shapes(tuple(q_lead), tuple(k_lead))
    except RuntimeError:
        batch_ok = True
        try:
            torch.broadcast_shapes(tuple(q_lead[:-1]), tuple(k_lead[:-1]))
        except RuntimeError:
            batch_ok = False
        hint = ""
        if heads_differ and batch_ok:
            hint = (f" (head counts {q_lead[-1]} and {k_lead[-1]} differ: pass enable_gqa=True)" if enable_gqa is False
                    else f" (head counts {q_lead[-1]} and {k_lead[-1]} differ)")
        raise ValueError(
            f"the batch/head dims of {qn} {shape_str(query)} and {kn} {shape_str(key)} do not broadcast" + hint
        ) from None


def check_module_dtype(name: str, t: Tensor, dtype: torch.dtype) -> Tensor:
    """t, if its dtype is the module's parameters' ``dtype`` (any dtype under autocast); else ValueError."""
    if t.dtype != dtype and not torch.is_autocast_enabled(t.device.type):
        raise ValueError(f"{name} {shape_str(t)} has dtype {t.dtype} but the module's parameters are {dtype}: "
                         f"convert one of them (.to({dtype}) on the input or .to({t.dtype}) on the module)")
    return t


def check_float_dtype(name: str, dtype) -> torch.dtype:
    """dtype, if it is a floating-point torch.dtype; else ValueError."""
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"{name} must be a floating-point torch.dtype (e.g. torch.float32), got {dtype!r}")


def check_scale(scale) -> float | None:
    """scale as a float (None stays None): a finite number or a one-element tensor, as torch takes; else ValueError."""
    if isinstance(scale, Tensor) and scale.numel() == 1 and not scale.is_complex() and scale.dtype != torch.bool:
        scale = scale.item()
    if scale is None:
        return None
    return check_real("scale", scale, low=-math.inf, high=math.inf, low_open=True, high_open=True)
