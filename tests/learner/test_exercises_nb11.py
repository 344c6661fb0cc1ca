"""Checkers of notebook 11: right answers pass, typical wrong answers get the right diagnosis."""

import pytest
import torch
from helpers import expect_error

from selfattn_lite.exercises import nb11


def stub(*args, **kwargs):
    raise NotImplementedError


# ----------------------------------------------------------------------------- softmax_jacobian

def jacobian_right(p):
    return torch.diag(p) - torch.outer(p, p)


def test_softmax_jacobian_right_and_not_attempted(capsys):
    nb11.check_softmax_jacobian(jacobian_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb11.check_softmax_jacobian(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


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

def test_grad_v_right_and_not_attempted(capsys):
    nb11.check_grad_v(lambda p, do: p.T @ do)
    assert capsys.readouterr().out.startswith("Correct")
    nb11.check_grad_v(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


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

def test_row_term_right_keepdim_and_not_attempted(capsys):
    nb11.check_row_term(lambda out, do: (do * out).sum(-1))
    assert capsys.readouterr().out.startswith("Correct")
    nb11.check_row_term(lambda out, do: (do * out).sum(-1, keepdim=True))
    assert capsys.readouterr().out.startswith("Correct")
    nb11.check_row_term(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


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
