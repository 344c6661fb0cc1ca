"""The checkers of notebooks 03 and 04: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.attention import safe_softmax
from selfattn_lite.exercises import ExerciseError, nb03, nb04


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ---------------------------------------------------------------- notebook 03


def left_padded_right(lengths, T):
    causal = torch.ones(T, T, dtype=torch.bool).tril()                          # (T, T)
    real = torch.arange(T)[None, :] >= T - torch.as_tensor(lengths)[:, None]     # (B, T)
    return causal[None] & real[:, None, :]


def _left(lengths, T, shift=0):
    return torch.arange(T)[None, :] >= T - torch.as_tensor(lengths)[:, None] + shift


def _tril(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


RIGHT["left_padded_mask"] = nb03.check_left_padded_mask, left_padded_right


LEFT_PADDED_WRONG = {
    "polarity is flipped": lambda lengths, T: ~left_padded_right(lengths, T),
    "right-padded mask": lambda lengths, T: _tril(T)[None]
    & (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None])[:, None, :],
    "padded \\*queries\\*": lambda lengths, T: _tril(T)[None] & _left(lengths, T)[:, :, None],
    "upper one": lambda lengths, T: torch.ones(T, T, dtype=torch.bool).triu()[None] & _left(lengths, T)[:, None, :],
    "padding is missing": lambda lengths, T: torch.ones(len(lengths), T, T, dtype=torch.bool).tril(),
    "causal part is missing": lambda lengths, T: _left(lengths, T)[:, None, :].expand(len(lengths), T, T).clone(),
    "drops the first real token": lambda lengths, T: _tril(T)[None] & _left(lengths, T, 1)[:, None, :],
    "lets in the last padding token": lambda lengths, T: _tril(T)[None] & _left(lengths, T, -1)[:, None, :],
    "bool tensor": lambda lengths, T: left_padded_right(lengths, T).float(),
    r"shape \(3, 5, 5\)": lambda lengths, T: left_padded_right(lengths, T)[0],
}


@pytest.mark.parametrize("diagnosis", list(LEFT_PADDED_WRONG))
def test_left_padded_mask_wrong_answers(diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb03.check_left_padded_mask(LEFT_PADDED_WRONG[diagnosis])


def test_left_padded_mask_other_mistake_names_an_entry():
    def one_cell_wrong(lengths, T):
        mask = left_padded_right(lengths, T)
        mask[1, 4, 0] = False
        return mask

    with pytest.raises(ExerciseError, match=r"entry \(b, i, j\) = \(1, 4, 0\)"):
        nb03.check_left_padded_mask(one_cell_wrong)


def positions_right(q_pos, k_pos):
    return k_pos[None, :] <= q_pos[:, None]                                       # (L, S)


RIGHT["mask_from_positions"] = nb03.check_mask_from_positions, positions_right


POSITIONS_WRONG = {
    "polarity is flipped": lambda q, k: ~positions_right(q, k),
    "off by one": lambda q, k: k[None, :] < q[:, None],
    "comparison is reversed": lambda q, k: k[None, :] >= q[:, None],
    "ignores the positions": lambda q, k: torch.ones(len(q), len(k), dtype=torch.bool).tril(),
    r"rows are queries, columns are keys": lambda q, k: positions_right(q, k).T,
    "bool tensor": lambda q, k: positions_right(q, k).int(),
    "entry \\(i, j\\)": lambda q, k: positions_right(q, k) if len(q) == 3 else positions_right(q, k) & False,
}


@pytest.mark.parametrize("diagnosis", list(POSITIONS_WRONG))
def test_mask_from_positions_wrong_answers(diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis):
        nb03.check_mask_from_positions(POSITIONS_WRONG[diagnosis])


def safe_softmax_right(scores):
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)     # (..., 1)
    weights = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1)
    return weights.masked_fill(fully_masked, 0.0)


RIGHT["safe_softmax"] = nb03.check_safe_softmax, safe_softmax_right


def _fully(scores):
    return torch.isneginf(scores).all(dim=-1, keepdim=True)


SAFE_SOFTMAX_WRONG = {
    "fully masked row is NaN": lambda s: torch.softmax(s, dim=-1),
    "gradient is NaN": lambda s: torch.nan_to_num(torch.softmax(s, dim=-1)),
    "gradient is NaN ": lambda s: torch.where(_fully(s), 0.0, torch.softmax(s, dim=-1)),
    "attends to padding": lambda s: torch.softmax(s.masked_fill(torch.isneginf(s), -1e9), dim=-1),
    "does not sum to 1": lambda s: torch.softmax(s.masked_fill(_fully(s), 0.0), dim=0).masked_fill(_fully(s), 0.0),
    "only rows whose": lambda s: torch.softmax(s.masked_fill(torch.isneginf(s), 0.0), dim=-1)
    .masked_fill(_fully(s), 0.0),
    "carry no gradient": lambda s: safe_softmax_right(s.detach()),
    "differs from softmax's": lambda s: safe_softmax_right(s.detach()) + 0 * s.masked_fill(torch.isneginf(s), 0.0),
    "calls safe_softmax": lambda s: safe_softmax(s),
    r"shape \(2, 4, 5\)": lambda s: safe_softmax_right(s)[0],
}


@pytest.mark.parametrize("diagnosis", list(SAFE_SOFTMAX_WRONG))
def test_safe_softmax_wrong_answers(diagnosis):
    with pytest.raises(ExerciseError, match=diagnosis.strip()):
        nb03.check_safe_softmax(SAFE_SOFTMAX_WRONG[diagnosis])


def test_safe_softmax_reference_is_the_packages():
    """The checker's reference and the package's guard agree, forwards and backwards."""
    scores = nb03._scores()
    a, b = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    torch.testing.assert_close(nb03._reference_safe_softmax(a), safe_softmax(b))
    g = torch.randn(scores.shape)
    (nb03._reference_safe_softmax(a) * g).sum().backward()
    (safe_softmax(b) * g).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


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
