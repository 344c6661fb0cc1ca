"""Checkers of notebook 11: right answers pass, typical wrong answers get the right diagnosis."""

import pytest
import torch
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite.exercises import nb11


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- softmax_jacobian

def jacobian_right(p):
    return torch.diag(p) - torch.outer(p, p)


RIGHT["softmax_jacobian"] = nb11.check_softmax_jacobian, jacobian_right


FIXED = torch.eye(4, dtype=torch.float64)


@pytest.mark.parametrize("wrong,fragment", [
    (lambda p: torch.outer(p, p) - torch.diag(p), "signs are flipped"),
    (lambda p: torch.diag(p), "only diag(p)"),
    (lambda p: -torch.outer(p, p), "only -p p^T"),
    (lambda p: torch.diag(p * (1 - p)), "off-diagonal"),
    (lambda p: torch.diag(p) - p[:, None] ** 2, "outer product"),
    (lambda p: torch.diag(p) - torch.outer(p, p) + 0.1, "expected diag(p) - p p^T"),
    (lambda p: torch.diag(p)[:2], "shape (4, 4)"),
    (lambda p: FIXED if len(p) == 4 else torch.zeros(3, 3), "expected"),
])
def test_softmax_jacobian_diagnoses(wrong, fragment):
    expect_error(nb11.check_softmax_jacobian, wrong, fragment)


def test_softmax_jacobian_hard_coded_answer():
    p = torch.softmax(torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64), dim=0)
    memorised = jacobian_right(p)
    expect_error(nb11.check_softmax_jacobian, lambda q: memorised if len(q) == 4 else torch.zeros(3, 3),
                 "another")


# ----------------------------------------------------------------------------- grad_v

RIGHT["grad_v"] = nb11.check_grad_v, lambda p, do: p.T @ do


@pytest.mark.parametrize("wrong,fragment", [
    (lambda p, do: p @ do, "wrong way round"),
    (lambda p, do: do.T @ p, "V's shape"),
    (lambda p, do: do.clone(), "dO alone"),
    (lambda p, do: 2 * p.T @ do, "expected dV = P^T dO"),
    (lambda p, do: p.T @ do if p.shape[0] == p.shape[1] else torch.zeros(6, 2), "L = 4 queries"),
])
def test_grad_v_diagnoses(wrong, fragment):
    expect_error(nb11.check_grad_v, wrong, fragment)


# ----------------------------------------------------------------------------- row_term

RIGHT["row_term"] = nb11.check_row_term, lambda out, do: (do * out).sum(-1)
RIGHT["row_term_keepdim"] = nb11.check_row_term, lambda out, do: (do * out).sum(-1, keepdim=True)


@pytest.mark.parametrize("wrong,fragment", [
    (lambda out, do: do @ out.T, "only its diagonal"),
    (lambda out, do: (do * out).sum(0), "summed over the queries"),
    (lambda out, do: (do * out).sum(), "one number for everything"),
    (lambda out, do: out.sum(-1) * do.sum(-1), "multiply elementwise first"),
    (lambda out, do: (do * out).mean(-1), "expected D = rowsum(dO * O)"),
    (lambda out, do: [1.0, 2.0, 3.0, 4.0], "torch.Tensor"),
])
def test_row_term_diagnoses(wrong, fragment):
    expect_error(nb11.check_row_term, wrong, fragment)


# ----------------------------------------------------------------------------- one causal tile of the backward

def causal_tile(q, k, v, out, do, lse, q_start, k_start, scale, *, mistake=None):
    """One causal tile, written independently of the checker: right, or with one planted mistake."""
    bq, bk = len(q), len(k)
    if mistake == "skip_first_query":
        if k_start > q_start:
            return None
    elif mistake != "never_skip" and k_start >= q_start + bq:               # the first key after the last query
        return None
    query_pos = torch.arange(q_start, q_start + bq)
    key_pos = torch.arange(k_start, k_start + bk)
    future = key_pos[None, :] > query_pos[:, None]                          # (Bq, Bk) may not attend
    if mistake == "mask_diagonal":
        future = key_pos[None, :] >= query_pos[:, None]
    scores = q @ k.T * (1.0 if mistake == "unscaled_p" else scale)
    if mistake != "no_mask":
        scores = torch.where(future, -torch.inf, scores)
    p = torch.exp(scores if mistake == "no_lse" else scores - lse[:, None])
    dp = do @ v.T
    if mistake == "no_D":
        row = torch.zeros(bq, 1, dtype=q.dtype)
    elif mistake == "tile_rowsum":
        row = (dp * p).sum(1, keepdim=True)
    else:
        row = (do * out).sum(1, keepdim=True)
    ds = p * (dp - row)
    c = 1.0 if mistake == "no_scale" else scale
    return c * ds @ k, c * ds.T @ q, p.T @ do


RIGHT["causal_tile_backward"] = nb11.check_causal_tile_backward, causal_tile


@pytest.mark.parametrize("mistake,fragment", [
    ("no_D", "D is missing"),
    ("tile_rowsum", "this tile's own rowsum"),
    ("no_mask", "the mask is not applied"),
    ("mask_diagonal", "also hides the diagonal"),
    ("skip_first_query", "the skip is wrong"),
    ("never_skip", "the causal skip is missing"),
    ("no_scale", "scale is missing after dS"),
    ("unscaled_p", "scale is missing inside exp"),
    ("no_lse", "subtract the saved lse"),
])
def test_causal_tile_backward_diagnoses(mistake, fragment):
    expect_error(nb11.check_causal_tile_backward, lambda *args: causal_tile(*args, mistake=mistake), fragment)


def test_causal_tile_backward_other_wrong_answers():
    def square_only(q, k, *rest):
        if q.shape[0] != k.shape[0]:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return causal_tile(q, k, *rest)

    expect_error(nb11.check_causal_tile_backward, square_only, "a tile need not be square")

    def transposed_dv(*args):
        dq, dk, dv = causal_tile(*args) or (None,) * 3
        if dq is None:
            return None
        p = torch.ones(len(args[0]), len(args[1]), dtype=torch.float64)
        return dq, dk, p @ args[4]                                      # P dO: (Bq, dv), not (Bk, dv)

    expect_error(nb11.check_causal_tile_backward, transposed_dv, "shape")
    expect_error(nb11.check_causal_tile_backward, lambda *args: (causal_tile(*args) or (None,) * 3)[:2]
                 if causal_tile(*args) is not None else None, "three tensors")

    def skips_everything_but_first(q, k, v, out, do, lse, q_start, k_start, scale):
        return causal_tile(q, k, v, out, do, lse, q_start, k_start, scale) if q_start == k_start == 0 else None

    expect_error(nb11.check_causal_tile_backward, skips_everything_but_first, "do not skip it")
    expect_error(nb11.check_causal_tile_backward,
                 lambda *args: None if causal_tile(*args) is None else tuple(2 * t for t in causal_tile(*args)),
                 "differ from the tile's contributions")
    calls = []

    def doubled_after_diagnosis(*args):                                 # right per tile at first, then wrong
        calls.append(1)
        parts = causal_tile(*args)
        if parts is None or len(calls) <= 40:
            return parts
        return 2 * parts[0], parts[1], parts[2]

    expect_error(nb11.check_causal_tile_backward, doubled_after_diagnosis, "differs from autograd's")


def test_causal_tile_model_answer_matches_the_tests_own():
    prob = nb11._causal_problem(7, 4, 2, seed=5)
    for r, c in nb11._tiles(7, 3, 2):
        args = nb11._tile_args(prob, r, c)
        want, got = causal_tile(*args), nb11.causal_tile(*args)
        assert (want is None) == (got is None)
        if want is not None:
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
