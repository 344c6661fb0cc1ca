"""Checkers of notebook 11: right answers pass, typical wrong answers get the right diagnosis."""

import pytest
import torch
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite.exercises import nb11


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- temperature_softmax_backward

def temperature_parts(s, dp, tau):
    """p = softmax(s / tau) and dz, the gradient at s / tau, written out independently of the checker."""
    p = torch.softmax(s / tau, dim=-1)
    return p, p * (dp - (p * dp).sum(-1, keepdim=True))


def temperature_right(s, dp, tau):
    p, dz = temperature_parts(s, dp, tau)
    return dz / tau, -(dz * s).sum() / tau**2


def with_ds(ds_of):                                       # a wrong ds beside the right dtau
    return lambda s, dp, tau: (ds_of(*temperature_parts(s, dp, tau), tau), temperature_right(s, dp, tau)[1])


def with_dtau(dtau_of):                                   # the right ds beside a wrong dtau
    return lambda s, dp, tau: (temperature_right(s, dp, tau)[0], dtau_of(s, *temperature_parts(s, dp, tau), tau))


RIGHT["temperature_softmax_backward"] = nb11.check_temperature_softmax_backward, temperature_right
RIGHT["temperature_softmax_backward_float_dtau"] = nb11.check_temperature_softmax_backward, lambda s, dp, tau: (
    temperature_right(s, dp, tau)[0], temperature_right(s, dp, tau)[1].item())


@pytest.mark.parametrize("wrong,fragment", [
    (lambda s, dp, tau: temperature_right(s, dp, tau)[0], "return two things"),
    (with_ds(lambda p, dz, tau: dz), "tau = 1"),
    (with_ds(lambda p, dz, tau: dz * tau), "not tau"),
    (with_ds(lambda p, dz, tau: dz[:, :3]), "shape (4, 6)"),
    (with_ds(lambda p, dz, tau: dz / tau + 0.1), "ds does not match autograd"),
    (with_dtau(lambda s, p, dz, tau: (dz * s).sum() / tau**2), "wrong sign"),
    (with_dtau(lambda s, p, dz, tau: -(dz * s).sum() / tau), "missing a factor 1 / tau"),
    (with_dtau(lambda s, p, dz, tau: -(dz * s).mean() / tau**2), "SUM"),
    (with_dtau(lambda s, p, dz, tau: -(dz * s).sum(-1) / tau**2), "one number too"),
    (with_dtau(lambda s, p, dz, tau: -dz.sum() / tau**2), "dtau = 0"),
    (with_dtau(lambda s, p, dz, tau: -(dz * s).sum() / tau**2 + 0.1), "dtau does not match autograd"),
    (lambda s, dp, tau: temperature_right(s, dp, 0.5), "tau = 2"),
])
def test_temperature_softmax_backward_diagnoses(wrong, fragment):
    expect_error(nb11.check_temperature_softmax_backward, wrong, fragment)


def test_temperature_softmax_backward_names_the_row_sum_mistakes():
    def rowsum_over(dim):
        def answer(s, dp, tau):
            p = torch.softmax(s / tau, dim=-1)
            row = (dp * p).sum() if dim is None else (dp * p).sum(dim, keepdim=True)
            return p * (dp - row) / tau, temperature_right(s, dp, tau)[1]
        return answer

    expect_error(nb11.check_temperature_softmax_backward, rowsum_over(0), "dim 0")
    expect_error(nb11.check_temperature_softmax_backward, rowsum_over(None), "whole matrix")
    expect_error(nb11.check_temperature_softmax_backward,
                 lambda s, dp, tau: (torch.softmax(s / tau, -1) * dp / tau, temperature_right(s, dp, tau)[1]),
                 "row term is missing")


# ----------------------------------------------------------------------------- bias_grad

def bias_ds(q, k, v, bias, do):
    """(B, h, L, N) dS written out, independently of the checker."""
    p = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias, dim=-1)
    dp = do @ v.transpose(-2, -1)
    return p, dp, p * (dp - (p * dp).sum(-1, keepdim=True))


RIGHT["bias_grad"] = nb11.check_bias_grad, lambda *args: bias_ds(*args)[2].sum(0)


def bias_autograd(q, k, v, bias, do):                     # right numbers, but through autograd: refused
    bias = bias.clone().requires_grad_()
    out = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias, dim=-1) @ v
    return torch.autograd.grad(out, bias, do)[0]


def temperature_autograd(s, dp, tau):                     # right numbers, but through autograd: refused
    s, tau = s.clone().requires_grad_(), torch.tensor(tau, dtype=s.dtype, requires_grad=True)
    torch.softmax(s / tau, dim=-1).backward(dp)
    return s.grad, tau.grad


def causal_tile_autograd(q, k, v, out, do, lse, q_start, k_start, scale):
    if k_start >= q_start + len(q):
        return None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    future = torch.arange(k_start, k_start + len(k))[None, :] > torch.arange(q_start, q_start + len(q))[:, None]
    p = torch.exp((scale * leaves[0] @ leaves[1].T).masked_fill(future, -torch.inf) - lse[:, None])
    dp = do @ v.T                                           # the row term from out and do, outside the graph
    loss = (p * (dp - (do * out).sum(-1, keepdim=True)).detach()).sum() + (p.detach() @ leaves[2] * do).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("checker,answer", [
    (nb11.check_temperature_softmax_backward, temperature_autograd),
    (nb11.check_bias_grad, bias_autograd),
    (nb11.check_causal_tile_backward, causal_tile_autograd),
], ids=["temperature", "bias", "causal_tile"])
def test_an_answer_through_autograd_is_refused(checker, answer):
    expect_error(checker, answer, "calls autograd")
    torch.ones(2, requires_grad=True).sum().backward()      # and autograd works again after the check
    assert torch.autograd.grad(torch.ones(2, requires_grad=True).sum(), [torch.ones(1, requires_grad=True)],
                               allow_unused=True) == (None,)


@pytest.mark.parametrize("wrong,fragment", [
    (lambda *args: bias_ds(*args)[2], "shared by the whole batch"),
    (lambda *args: bias_ds(*args)[2].mean(0), "SUM"),
    (lambda *args: bias_ds(*args)[2].sum(0) / args[0].shape[-1] ** 0.5, "multiplied by scale"),
    (lambda *args: (bias_ds(*args)[0] * bias_ds(*args)[1]).sum(0), "row term is missing"),
    (lambda *args: bias_ds(*args)[1].sum(0), "go through the softmax"),
    (lambda *args: bias_ds(*args)[2].sum(0) * 1.1, "does not match autograd"),
])
def test_bias_grad_diagnoses(wrong, fragment):
    expect_error(nb11.check_bias_grad, wrong, fragment)


# ----------------------------------------------------------------------------- recompute_weights

RIGHT["recompute_weights"] = nb11.check_recompute_weights, lambda s, lse: torch.where(
    torch.isneginf(lse)[:, None], 0.0, torch.exp(s - lse[:, None]))
RIGHT["recompute_weights_lse_zeroed"] = nb11.check_recompute_weights, lambda s, lse: torch.exp(
    s - lse.masked_fill(torch.isneginf(lse), 0.0)[:, None])


@pytest.mark.parametrize("wrong,fragment", [
    (lambda s, lse: torch.exp(s - lse[:, None]), "NaN on row [2]"),
    (lambda s, lse: torch.exp(s), "not normalised"),
    (lambda s, lse: torch.softmax(s, dim=-1), "over this tile"),
    (lambda s, lse: torch.where(torch.isneginf(lse)[:, None], 1.0, torch.exp(s - lse[:, None])), "row 2 sees no key"),
    (lambda s, lse: torch.exp(s - lse[:, None]).nan_to_num() * 1.1, "differ from exp(s − lse)"),
    (lambda s, lse: torch.exp(s - lse[:, None]).nan_to_num()[:3], "shape (4, 4)"),
])
def test_recompute_weights_diagnoses(wrong, fragment):
    expect_error(nb11.check_recompute_weights, wrong, fragment)


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
