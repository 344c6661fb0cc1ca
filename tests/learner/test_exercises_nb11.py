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


# ----------------------------------------------------------------------------- one tile of the backward

def tile(q, k, v, do, lse, D, scale, *, mistake=None):
    """One tile's (dq, dk, dv), right or with one planted mistake."""
    p = torch.exp(scale * q @ k.T - lse[:, None])                      # (Bq, Bk)
    if mistake == "tile_softmax":
        p = torch.softmax(scale * q @ k.T, dim=-1)
    if mistake == "no_lse":
        p = torch.exp(scale * q @ k.T)
    if mistake == "unscaled_p":
        p = torch.exp(q @ k.T - lse[:, None])
    dp = do @ v.T
    row = (dp * p).sum(-1, keepdim=True) if mistake == "tile_rowsum" else D[:, None]
    ds = p * dp if mistake == "no_D" else p * (dp - row)
    c = 1.0 if mistake == "no_scale" else scale
    dv = p @ do if mistake == "transposed_p" else p.T @ do
    dk = c * ds @ q if mistake == "transposed_ds" else c * ds.T @ q
    return c * ds @ k, dk, dv


RIGHT["tile_backward"] = nb11.check_tile_backward, tile


@pytest.mark.parametrize("mistake,fragment", [
    ("no_scale", "forgot the scale"),
    ("no_D", "without subtracting D"),
    ("tile_rowsum", "this tile's own rowsum"),
    ("transposed_p", "transpose P"),
    ("transposed_ds", "transpose dS"),
    ("tile_softmax", "softmax over this tile"),
    ("unscaled_p", "scores inside exp need the scale"),
    ("no_lse", "subtract the saved lse"),
])
def test_tile_backward_diagnoses(mistake, fragment):
    expect_error(nb11.check_tile_backward, lambda *args: tile(*args, mistake=mistake), fragment)


def test_tile_backward_square_only_and_accumulating_answers():
    def square_only(q, k, v, do, lse, D, scale):
        if q.shape[0] != k.shape[0]:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return tile(q, k, v, do, lse, D, scale)

    expect_error(nb11.check_tile_backward, square_only, "a tile need not be square")
    calls = []

    def doubled_after_first(*args):                                  # right once, then wrong: the loop catches it
        calls.append(1)
        dq, dk, dv = tile(*args)
        return (dq, dk, dv) if len(calls) == 1 else (2 * dq, dk, dv)

    expect_error(nb11.check_tile_backward, doubled_after_first, "differs from autograd's")
    expect_error(nb11.check_tile_backward, lambda *args: tile(*args)[:2], "three tensors")
    expect_error(nb11.check_tile_backward, lambda *args: tuple(2 * t for t in tile(*args)), "differ from the tile's")


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
