"""The checkers of notebooks 03 and 04: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError, nb03, nb04


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ---------------------------------------------------------------- notebook 03


def causal_padding_right(lengths, T):
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    real = torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]
    return causal[None] & real[:, None, :]


def _real(lengths, T):
    return torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]


RIGHT["causal_padding_mask"] = nb03.check_causal_padding_mask, causal_padding_right


CAUSAL_PADDING_WRONG = {
    "polarity is flipped": lambda lengths, T: ~causal_padding_right(lengths, T),
    "padded \\*queries\\*": lambda lengths, T: torch.ones(T, T, dtype=torch.bool).tril()[None] & _real(lengths, T)[:, :, None],
    "upper one": lambda lengths, T: torch.ones(T, T, dtype=torch.bool).triu()[None] & _real(lengths, T)[:, None, :],
    "padding is missing": lambda lengths, T: torch.ones(len(lengths), T, T, dtype=torch.bool).tril(),
    "causal part is missing": lambda lengths, T: _real(lengths, T)[:, None, :].expand(len(lengths), T, T).clone(),
    "off by one": lambda lengths, T: torch.ones(T, T, dtype=torch.bool).tril()[None]
    & (torch.arange(T)[None, :] <= torch.as_tensor(lengths)[:, None])[:, None, :],
    "bool tensor": lambda lengths, T: causal_padding_right(lengths, T).float(),
    r"shape \(3, 5, 5\)": lambda lengths, T: causal_padding_right(lengths, T)[0],
}


@pytest.mark.parametrize("diagnosis", list(CAUSAL_PADDING_WRONG))
def test_causal_padding_mask_wrong_answers(diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb03.check_causal_padding_mask(CAUSAL_PADDING_WRONG[diagnosis])


def test_causal_padding_mask_other_mistake_names_an_entry():
    def one_cell_wrong(lengths, T):
        mask = causal_padding_right(lengths, T)
        mask[2, 4, 0] = False
        return mask

    with pytest.raises(ExerciseError, match=r"entry \(b, i, j\) = \(2, 4, 0\)"):
        nb03.check_causal_padding_mask(one_cell_wrong)


def decode_right(n_new, n_cached):
    return torch.ones(n_new, n_cached + n_new, dtype=torch.bool).tril(diagonal=n_cached)


RIGHT["decode_mask"] = nb03.check_decode_mask, decode_right


DECODE_WRONG = {
    "top-left alignment": lambda n, c: torch.ones(n, n + c, dtype=torch.bool).tril(),
    "polarity is flipped": lambda n, c: ~decode_right(n, c),
    "off by one": lambda n, c: torch.ones(n, n + c, dtype=torch.bool).tril(diagonal=c - 1),
    "every key is allowed": lambda n, c: torch.ones(n, n + c, dtype=torch.bool),
    r"shape \(3, 7\)": lambda n, c: decode_right(n, c)[:, :-1],
    "one new token": lambda n, c: decode_right(n, c) if (n, c) == (3, 4) else torch.zeros(n, n + c, dtype=torch.bool),
}


@pytest.mark.parametrize("diagnosis", list(DECODE_WRONG))
def test_decode_mask_wrong_answers(diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb03.check_decode_mask(DECODE_WRONG[diagnosis])


def cross_right(y, x, W_q, W_k, W_v):
    q, k, v = y @ W_q, x @ W_k, x @ W_v
    w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, w


RIGHT["cross_attention"] = nb03.check_cross_attention, cross_right


def cross_swapped(y, x, W_q, W_k, W_v):
    return cross_right(x, y, W_q, W_k, W_v)


def cross_keys_from_y(y, x, W_q, W_k, W_v):
    return cross_right(y, y, W_q, W_k, W_v)


def cross_unscaled(y, x, W_q, W_k, W_v):
    q, k, v = y @ W_q, x @ W_k, x @ W_v
    w = torch.softmax(q @ k.T, dim=-1)
    return w @ v, w


def cross_wrong_dim(y, x, W_q, W_k, W_v):
    q, k, v = y @ W_q, x @ W_k, x @ W_v
    w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=0)
    return w @ v, w


def cross_bad_output(y, x, W_q, W_k, W_v):
    out, w = cross_right(y, x, W_q, W_k, W_v)
    return out * 2, w


@pytest.mark.parametrize("fn, diagnosis", [
    (cross_swapped, "queries and keys are swapped"),
    (cross_keys_from_y, "your keys come from y"),
    (cross_unscaled, "without scaling"),
    (cross_wrong_dim, "over the queries"),
    (cross_bad_output, "output is not weights @"),
    (lambda *args: cross_right(*args)[0], r"return a pair"),
])
def test_cross_attention_wrong_answers(fn, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb03.check_cross_attention(fn)


# ---------------------------------------------------------------- notebook 04


def split_right(x, h):
    B, T, d = x.shape
    return x.view(B, T, h, d // h).transpose(1, 2)


def merge_right(x):
    B, h, T, dk = x.shape
    return x.transpose(1, 2).reshape(B, T, h * dk)


RIGHT["split_heads"] = nb04.check_split_heads, split_right


@pytest.mark.parametrize("fn, diagnosis", [
    (lambda x, h: x.view(*x.shape[:2], h, -1), "transpose"),
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "cuts the sequence"),
    (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2), "every h-th column"),
    (lambda x, h: split_right(x, h) + 1, "head i, token t"),
    (lambda x, h: x, r"shape \(2, 3, 5, 4\)"),
])
def test_split_heads_wrong_answers(fn, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb04.check_split_heads(fn)


RIGHT["merge_heads"] = nb04.check_merge_heads, merge_right


@pytest.mark.parametrize("fn, diagnosis", [
    (lambda x: x.transpose(1, 2), "flatten the last two dims"),
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "mixes tokens"),
    (lambda x: merge_right(x) * 0, "concatenation"),
])
def test_merge_heads_wrong_answers(fn, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb04.check_merge_heads(fn)


def mha_right(x, W_q, W_k, W_v, W_o, h, *, scale=None, use_w_o=True, one_head=False, softmax_dim=-1):
    if one_head:
        h = 1
    q, k, v = split_right(x @ W_q, h), split_right(x @ W_k, h), split_right(x @ W_v, h)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=softmax_dim)
    y = merge_right(w @ v)
    return y @ W_o if use_w_o else y


RIGHT["multi_head_attention"] = nb04.check_multi_head_attention, mha_right


@pytest.mark.parametrize("kwargs, diagnosis", [
    (dict(use_w_o=False), "W_o is missing"),
    (dict(scale=1 / math.sqrt(12)), r"1/sqrt\(d\)"),
    (dict(one_head=True), "one wide head"),
    (dict(scale=1.0), "not scaled"),
    (dict(softmax_dim=-2), "softmax dim"),
])
def test_multi_head_attention_wrong_answers(kwargs, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb04.check_multi_head_attention(lambda *args: mha_right(*args, **kwargs))


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
