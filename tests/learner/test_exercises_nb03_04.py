"""The checkers of notebooks 03 and 04: right answers pass, typical wrong answers get the right diagnosis."""

from __future__ import annotations

import copy
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


def test_mask_from_positions_shows_what_positions_leave_out(capsys):
    """On a right answer the checker counts the pairs a packed row's positions let across documents."""
    nb03.check_mask_from_positions(positions_right)
    out = capsys.readouterr().out
    assert "lets 12 query-key pairs cross documents, 6 of them to keys later in the row" in out
    assert "masks.document_mask" in out


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
    "calls _safe_softmax": lambda s: torch._safe_softmax(s, -1),          # torch's private guard: a bypass
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


def contributions_right(mha, x, *, scale=None, rows=False, strided=False, with_bias=False, transpose_out=False):
    """Head i's output times its d/h rows of W_O (columns of out_proj.weight), (B, h, T, d); the keywords plant a learner's mistakes."""
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
    (dict(strided=True), "contiguous features"),
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
