"""The checkers of notebooks 03 and 04: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import copy
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


def contributions_right(mha, x, *, scale=None, rows=False, strided=False, with_bias=False, transpose_out=False):
    """Head i's output times its columns of W_O, (B, h, T, d); the keywords plant a learner's mistakes."""
    B, T, d = x.shape
    h, dk = mha.n_heads, d // mha.n_heads
    q, k, v = (p(x).view(B, T, h, dk).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    scale = 1 / math.sqrt(dk) if scale is None else scale
    heads = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v               # (B, h, T, dk)
    W = mha.out_proj.weight                                                          # (d_out, d_in)
    if rows:
        out = torch.stack([heads[:, i] @ W[i * dk:(i + 1) * dk, :] for i in range(h)], dim=1)
    elif strided:
        out = torch.stack([heads[:, i] @ W[:, i::h].T for i in range(h)], dim=1)
    else:
        out = torch.stack([heads[:, i] @ W[:, i * dk:(i + 1) * dk].T for i in range(h)], dim=1)
    if with_bias:
        out = out + mha.out_proj.bias
    return out.transpose(1, 2) if transpose_out else out


RIGHT["head_contributions"] = nb04.check_head_contributions, contributions_right


def test_head_contributions_sum_to_the_module():
    mha, x = nb04._module(), nb04._input()
    with torch.no_grad():
        torch.testing.assert_close(contributions_right(mha, x).sum(1) + mha.out_proj.bias, mha(x)[0])


@pytest.mark.parametrize("kwargs, diagnosis", [
    (dict(with_bias=True), "every head carries out_proj.bias"),
    (dict(rows=True), "rows of out_proj.weight"),
    (dict(strided=True), "contiguous columns"),
    (dict(scale=1 / math.sqrt(12)), r"1/sqrt\(d\)"),
    (dict(transpose_out=True), "head dim second"),
])
def test_head_contributions_wrong_answers(kwargs, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb04.check_head_contributions(lambda mha, x: contributions_right(mha, x, **kwargs))


def test_head_contributions_that_change_the_module_are_caught():
    def in_place(mha, x):
        with torch.no_grad():
            mha.out_proj.bias.zero_()
        return contributions_right(mha, x)

    with pytest.raises(ExerciseError, match="changed mha.out_proj.bias"):
        nb04.check_head_contributions(in_place)


def test_head_contributions_before_w_o_are_named():
    def before_w_o(mha, x):
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, mha.n_heads, -1).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v

    with pytest.raises(ExerciseError, match="before W_O"):
        nb04.check_head_contributions(before_w_o)


def ablate_right(mha, x, head):
    return mha(x)[0] - contributions_right(mha, x)[:, head]


def ablate_copy(mha, x, head):
    """The other right answer: a copy of the module with the head's columns of W_O zeroed."""
    dk = mha.head_dim
    copy_ = copy.deepcopy(mha)
    with torch.no_grad():
        copy_.out_proj.weight[:, head * dk:(head + 1) * dk] = 0
    return copy_(x)[0]


RIGHT["ablate_head"] = nb04.check_ablate_head, ablate_right
RIGHT["ablate_head_by_copy"] = nb04.check_ablate_head, ablate_copy


def ablate_in_place(mha, x, head):
    dk = mha.head_dim
    with torch.no_grad():
        mha.out_proj.weight[:, head * dk:(head + 1) * dk] = 0
    return mha(x)[0]


def ablate_rows(mha, x, head):
    dk = mha.head_dim
    copy_ = copy.deepcopy(mha)
    with torch.no_grad():
        copy_.out_proj.weight[head * dk:(head + 1) * dk, :] = 0
    return copy_(x)[0]


def ablate_zero_queries(mha, x, head):
    dk = mha.head_dim
    copy_ = copy.deepcopy(mha)
    with torch.no_grad():
        copy_.q_proj.weight[head * dk:(head + 1) * dk, :] = 0
        copy_.q_proj.bias[head * dk:(head + 1) * dk] = 0
    return copy_(x)[0]


@pytest.mark.parametrize("fn, diagnosis", [
    (ablate_in_place, "changed mha.out_proj.weight"),
    (lambda mha, x, head: ablate_right(mha, x, head - 1), "removed head"),
    (lambda mha, x, head: ablate_right(mha, x, head) - mha.out_proj.bias, "the bias went too"),
    (lambda mha, x, head: mha(x)[0], "unchanged"),
    (ablate_rows, "zeroed rows"),
    (ablate_zero_queries, "zero queries"),
    (lambda mha, x, head: ablate_right(mha, x, head) * 2, "minus head"),
])
def test_ablate_head_wrong_answers(fn, diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb04.check_ablate_head(fn)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
