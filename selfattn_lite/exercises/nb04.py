"""Checkers for notebook 04: splitting and merging heads, and multi-head attention from scratch."""

from __future__ import annotations

import math

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_split_heads", "check_merge_heads", "check_multi_head_attention"]


def _split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, T, d = x.shape
    return x.view(B, T, h, d // h).transpose(1, 2)          # (B, h, T, d/h)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, T, dk = x.shape
    return x.transpose(1, 2).reshape(B, T, h * dk)           # (B, T, h * dk)


def _attention(q, k, v, scale):
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def check_split_heads(fn) -> None:
    """``fn(x, h)``: (B, T, d) -> (B, h, T, d/h); head i holds feature columns i*d/h .. (i+1)*d/h - 1."""
    B, T, d, h = 2, 5, 12, 3
    x = torch.arange(B * T * d, dtype=torch.float32).reshape(B, T, d)
    try:
        got = attempt(fn, x.clone(), h)
    except NotAttempted:
        return not_attempted("split_heads")
    got = require_tensor("split_heads(x, h)", got)
    if tuple(got.shape) == (B, T, h, d // h):
        raise ExerciseError(f"shape {(B, T, h, d // h)} is (B, T, h, d/h): the split is right, now move the head "
                            "dim in front of the tokens with .transpose(1, 2)")
    require_tensor("split_heads(x, h)", got, (B, h, T, d // h))
    if torch.equal(got, x.reshape(B, h, T, d // h)):
        raise ExerciseError("the shape is right but heads hold the wrong numbers: reshaping (B, T, d) straight to "
                            "(B, h, T, d/h) cuts the sequence into pieces. View as (B, T, h, d/h) first, then "
                            "transpose(1, 2)")
    if torch.equal(got, x.view(B, T, d // h, h).permute(0, 3, 1, 2)):
        raise ExerciseError("heads take every h-th column: head i must hold the *contiguous* columns "
                            "i*d/h .. (i+1)*d/h - 1, i.e. view(B, T, h, d/h)")
    if not torch.equal(got, _split(x, h)):
        raise ExerciseError("head i, token t should be x[:, t, i*d/h:(i+1)*d/h]")
    return passed("(B, T, d) -> (B, h, T, d/h), each head a contiguous block of d/h features")


def check_merge_heads(fn) -> None:
    """``fn(x)``: (B, h, T, dk) -> (B, T, h * dk), the inverse of split_heads."""
    B, h, T, dk = 2, 3, 5, 4
    x = torch.arange(B * h * T * dk, dtype=torch.float32).reshape(B, h, T, dk)
    try:
        got = attempt(fn, x.clone())
    except NotAttempted:
        return not_attempted("merge_heads")
    got = require_tensor("merge_heads(x)", got)
    if tuple(got.shape) == (B, T, h, dk):
        raise ExerciseError(f"shape {(B, T, h, dk)}: after the transpose, also flatten the last two dims into "
                            "h * dk with .reshape(B, T, h * dk)")
    require_tensor("merge_heads(x)", got, (B, T, h * dk))
    if torch.equal(got, x.reshape(B, T, h * dk)):
        raise ExerciseError("reshaping (B, h, T, dk) straight to (B, T, h*dk) mixes tokens of different heads: "
                            "transpose(1, 2) first (then .reshape, since the transpose is not contiguous)")
    if not torch.equal(got, _merge(x)):
        raise ExerciseError("token t should be the concatenation of head 0's, head 1's, ... rows t")
    if not torch.equal(_split(got, h), x):
        raise ExerciseError("merge_heads should undo split_heads")
    return passed("(B, h, T, dk) -> (B, T, h*dk): the heads concatenated feature-wise")


def check_multi_head_attention(fn) -> None:
    """``fn(x, W_q, W_k, W_v, W_o, h)`` -> (B, T, d): h heads of d/h, concatenated, times W_o."""
    gen = torch.Generator().manual_seed(4)
    B, T, d, h = 2, 5, 12, 3
    x = torch.randn(B, T, d, generator=gen)
    W_q, W_k, W_v, W_o = (torch.randn(d, d, generator=gen) / math.sqrt(d) for _ in range(4))
    try:
        got = attempt(fn, x, W_q, W_k, W_v, W_o, h)
    except NotAttempted:
        return not_attempted("multi_head_attention")
    got = require_tensor("multi_head_attention(...)", got, (B, T, d))
    q, k, v = (_split(x @ W, h) for W in (W_q, W_k, W_v))           # (B, h, T, dk)
    dk = d // h
    heads = _attention(q, k, v, 1 / math.sqrt(dk))                   # (B, h, T, dk)
    expected = _merge(heads) @ W_o
    if close(got, _merge(heads)):
        raise ExerciseError("the heads are right but W_o is missing: mix the concatenated heads with @ W_o")
    if close(got, _merge(_attention(q, k, v, 1 / math.sqrt(d))) @ W_o):
        raise ExerciseError("you scaled by 1/sqrt(d): each head's dot products have d/h terms, so scale by "
                            "1/sqrt(d/h)")
    if close(got, _attention(x @ W_q, x @ W_k, x @ W_v, 1 / math.sqrt(d)) @ W_o):
        raise ExerciseError("this is one wide head: split q, k and v into h heads before the softmax")
    if close(got, _merge(_attention(q, k, v, 1.0)) @ W_o):
        raise ExerciseError("the scores are not scaled: multiply by 1/sqrt(d/h)")
    if not close(got, expected):
        raise ExerciseError("not equal to Concat(head_1..head_h) W_o with head_i = softmax(q_i k_i^T / sqrt(d/h)) v_i;"
                            " check the softmax dim (-1) and the order split -> attend -> merge -> W_o")
    return passed("h heads of width d/h, concatenated and mixed by W_o")
