"""Checkers for notebook 04: each head's share of the output, and knocking out one head."""

from __future__ import annotations

import math

import torch

from ..multihead import MultiHeadAttention
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_head_contributions", "check_ablate_head"]

B, T, D, H = 2, 5, 12, 3          # the checkers' module: d = 12, h = 3 heads of width 4


def _module() -> MultiHeadAttention:
    with torch.random.fork_rng():
        torch.manual_seed(4)
        mha = MultiHeadAttention(D, H).eval()
        with torch.no_grad():
            mha.out_proj.bias.normal_()             # a bias large enough that misplacing it shows
    return mha


def _input() -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(5))


def _heads(mha: MultiHeadAttention, x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Every head's attention output (B, h, T, dk), before W_O."""
    h, dk = mha.n_heads, mha.head_dim
    q, k, v = (p(x).view(*x.shape[:2], h, dk).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    scale = 1 / math.sqrt(dk) if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v          # (B, h, T, dk)


def _contributions(mha: MultiHeadAttention, heads: torch.Tensor, *, strided: bool = False,
                   rows: bool = False) -> torch.Tensor:
    """Head i's output times its block of W_O: (B, h, T, dk) -> (B, h, T, d)."""
    W = mha.out_proj.weight                                                    # (d_out, d_in)
    h, dk = mha.n_heads, mha.head_dim
    if rows:
        blocks = W.view(h, dk, -1)                                             # wrong: rows are output features
        return torch.einsum("bhtk,hke->bhte", heads, blocks)
    blocks = W.view(-1, dk, h).permute(2, 0, 1) if strided else W.view(-1, h, dk).transpose(0, 1)   # (h, d, dk)
    return torch.einsum("bhtk,hek->bhte", heads, blocks)


def _unchanged(mha: MultiHeadAttention, before: dict, name: str) -> None:
    for key, value in mha.state_dict().items():
        if not torch.equal(value, before[key]):
            raise ExerciseError(f"{name} changed mha.{key}: leave the module as it was (work on a copy, "
                                "copy.deepcopy(mha), or compute the answer without touching its weights)")


def check_head_contributions(fn) -> None:
    """``fn(mha, x)`` -> (B, h, T, d): head i's output times its block of W_O; their sum + the bias = mha(x)."""
    mha, x = _module(), _input()
    before = {k: v.clone() for k, v in mha.state_dict().items()}
    try:
        got = attempt(fn, mha, x)
    except NotAttempted:
        return not_attempted("head_contributions")
    _unchanged(mha, before, "head_contributions")
    got = require_tensor("head_contributions(mha, x)", got)
    h, dk, bias = mha.n_heads, mha.head_dim, mha.out_proj.bias.detach()
    if tuple(got.shape) == (B, h, T, dk):
        raise ExerciseError(f"shape {(B, h, T, dk)} is each head's output before W_O: multiply head i by its block "
                            "of W_O to get what it adds to the d output features")
    if tuple(got.shape) == (B, T, h, D):
        raise ExerciseError(f"shape {(B, T, h, D)}: put the head dim second, (B, h, T, d)")
    got = require_tensor("head_contributions(mha, x)", got, (B, h, T, D)).detach()
    with torch.no_grad():
        heads = _heads(mha, x)
        expected = _contributions(mha, heads)
        if close(got, expected + bias):
            raise ExerciseError("every head carries out_proj.bias: the bias is added once, to the sum, so it belongs "
                                "to no head (sum over heads + bias should be mha(x))")
        if close(got, _contributions(mha, heads, rows=True)):
            raise ExerciseError("you used rows of out_proj.weight: nn.Linear stores W_O transposed, (d_out, d_in), "
                                "so head i's block is the columns out_proj.weight[:, i*dk:(i+1)*dk]")
        if close(got, _contributions(mha, heads, strided=True)):
            raise ExerciseError("head i's features are the contiguous features i*dk .. (i+1)*dk - 1, not every h-th")
        if close(got, _contributions(mha, _heads(mha, x, scale=1 / math.sqrt(D)))):
            raise ExerciseError("you scaled by 1/sqrt(d): each head's dot products have d/h terms, "
                                "scale by 1/sqrt(d/h)")
        if not close(got, expected):
            total = close(got.sum(1) + bias, mha(x)[0])
            raise ExerciseError("the heads' contributions do not match" + (
                " (their sum + bias is mha(x), but the split between heads is wrong: head i is the softmax of "
                "q_i k_i^T / sqrt(dk) times v_i, then times its own d/h rows of W_O, the columns "
                "out_proj.weight[:, i*dk:(i+1)*dk])" if total else
                ": head i = softmax(q_i k_i^T / sqrt(dk)) v_i, with q, k, v from mha.q_proj, k_proj, v_proj"))
    return passed("Concat(head_1..head_h) W_O = sum of head_i times its d/h rows of W_O (columns of "
                  "out_proj.weight), + the bias once")


def check_ablate_head(fn) -> None:
    """``fn(mha, x, head)`` -> (B, T, d): mha's output without what head ``head`` writes; mha unchanged."""
    mha, x = _module(), _input()
    before = {k: v.clone() for k, v in mha.state_dict().items()}
    with torch.no_grad():
        y = mha(x)[0]                                                           # (B, T, d)
        parts = _contributions(mha, _heads(mha, x))                             # (B, h, T, d)
        bias = mha.out_proj.bias
    for head in (1, 2):
        try:
            got = attempt(fn, mha, x, head)
        except NotAttempted:
            return not_attempted("ablate_head")
        _unchanged(mha, before, "ablate_head")
        got = require_tensor(f"ablate_head(mha, x, {head})", got, (B, T, D)).detach()
        expected = y - parts[:, head]
        if close(got, expected):
            continue
        others = [j for j in range(H) if j != head and close(got, y - parts[:, j])]
        if others:
            raise ExerciseError(f"ablate_head(mha, x, {head}) removed head {others[0]}: head i owns the columns "
                                "i*dk .. (i+1)*dk - 1 of out_proj.weight")
        if close(got, expected - bias):
            raise ExerciseError("the bias went too: it is added once after the heads are summed, "
                                "and belongs to no head")
        if close(got, y):
            raise ExerciseError("the output is unchanged: nothing was removed")
        dk = mha.head_dim
        rows = y.clone()
        rows[..., head * dk:(head + 1) * dk] = bias[head * dk:(head + 1) * dk]
        if close(got, rows):
            raise ExerciseError("you zeroed rows of out_proj.weight, i.e. output features: nn.Linear stores W_O as "
                                "(d_out, d_in), so the head's block is the columns [:, i*dk:(i+1)*dk]")
        with torch.no_grad():
            h_heads = _heads(mha, x)
            q_off = h_heads.clone()
            v = mha.v_proj(x).view(B, T, H, dk).transpose(1, 2)                  # (B, h, T, dk)
            q_off[:, head] = v[:, head].mean(1, keepdim=True)                   # zero query: uniform weights
            uniform = _contributions(mha, q_off).sum(1) + bias
        if close(got, uniform, atol=1e-4):
            raise ExerciseError("a head with zero queries (or keys) still writes: it attends uniformly and adds the "
                                "average value. Remove what it writes instead, its share through W_O")
        raise ExerciseError(f"ablate_head(mha, x, {head}) should be mha(x) minus head {head}'s output times its "
                            "d/h rows of W_O, the columns of out_proj.weight (the other heads and the bias stay)")
    return passed("one head knocked out: its share through W_O removed, the other heads and the bias kept")
