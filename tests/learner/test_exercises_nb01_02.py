"""The checkers of notebooks 01 and 02 accept right answers and diagnose typical wrong ones."""

import math

import pytest
import torch
from helpers import expect_correct, expect_not_attempted, right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError, nb01, nb02


def good_softmax(x):
    x = x - x.amax(-1, keepdim=True)
    return x.exp() / x.exp().sum(-1, keepdim=True)


def good_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own
RIGHT["softmax"] = nb01.check_softmax, good_softmax


@pytest.mark.parametrize("wrong, match", [
    (lambda x: x.exp() / x.exp().sum(0, keepdim=True), "dim=-1"),                # columns, not rows
    (lambda x: x.exp(), "sum to 1"),
    (lambda x: x.exp() / x.exp().sum(-1, keepdim=True), "overflows"),
    (lambda x: (x - x.max()).exp() / (x - x.max()).exp().sum(-1, keepdim=True), "global max"),   # 0/0 rows
    (lambda x: (x - x.amax(1, keepdim=True)).exp() / (x - x.amax(1, keepdim=True)).exp().sum(1, keepdim=True),
     "dim=1"),                                                                    # right for 2-D inputs only
    (lambda x: torch.full_like(x, 0.25), "differ from softmax"),
    (lambda x: torch.softmax(x, dim=-1), "calls torch's softmax"),           # the function being rebuilt
    (lambda x: x.softmax(-1), "calls torch's softmax"),
    (lambda x: torch.nn.functional.softmax(x, -1), "calls torch's softmax"),
])
def test_softmax_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb01.check_softmax(wrong)


@pytest.mark.parametrize("right", [
    lambda x: torch.log_softmax(x, -1).exp(),                  # a correct softmax, built another way
    lambda x: (x - x.amax(-1, keepdim=True)).exp() / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True),
])
def test_softmax_checker_accepts_other_right_answers(right, capsys):
    expect_correct(nb01.check_softmax, right, capsys)


def good_jacobian(s):
    w = torch.softmax(s, -1)
    return torch.diag_embed(w) - w[..., :, None] * w[..., None, :]


def unstable_jacobian(s):
    e = s.exp()
    w = e / e.sum(-1, keepdim=True)
    return torch.diag_embed(w) - w[..., :, None] * w[..., None, :]


def autograd_jacobian(s):
    return torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), s)


def backward_jacobian(s):
    s = s.requires_grad_()
    torch.softmax(s, -1)[0].backward()
    return s.grad


RIGHT["softmax_jacobian"] = nb01.check_softmax_jacobian, good_jacobian


@pytest.mark.parametrize("wrong, match", [
    (lambda s: -good_jacobian(s), "sign is flipped"),
    (lambda s: torch.diag_embed(torch.softmax(s, -1)), "only diag\\(w\\)"),
    (lambda s: -(torch.softmax(s, -1)[..., :, None] * torch.softmax(s, -1)[..., None, :]), "delta_ij term is missing"),
    (lambda s: torch.diag_embed(torch.softmax(s, -1) * (1 - torch.softmax(s, -1))), "off-diagonal"),
    (lambda s: torch.diag_embed(s) - s[..., :, None] * s[..., None, :], "in the scores"),
    (lambda s: torch.diag(torch.softmax(s, -1)) - torch.outer(torch.softmax(s, -1), torch.softmax(s, -1)),
     "a batch of scores"),                                                   # 1-D only
    (lambda s: good_jacobian(s).flatten(0, -3)[:1].expand(*s.shape, s.shape[-1]) if s.dim() > 1 else good_jacobian(s),
     "wrong for a batch"),                                                   # one row copied over the batch
    (unstable_jacobian, "stable softmax"),
    (lambda s: torch.rand(*s.shape, s.shape[-1]), "differs from autograd"),
    (autograd_jacobian, "uses autograd"), (backward_jacobian, "uses autograd"),
])
def test_softmax_jacobian_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb01.check_softmax_jacobian(wrong)
    x = torch.randn(3, requires_grad=True)                                   # autograd works again afterwards
    torch.softmax(x, -1)[0].backward()
    assert x.grad is not None


def share_with_std(std_of):
    """A saturated_share whose scores have standard deviation std_of(dk, scale): the planted mistakes' template."""
    def share(dk, scale, n_keys=16, rows=100_000, seed=0):
        s = torch.randn(rows, n_keys, generator=torch.Generator().manual_seed(seed)) * std_of(dk, scale)
        return (torch.softmax(s, -1).amax(-1) > 0.99).float().mean().item()
    return share


good_saturated_share = share_with_std(lambda dk, scale: scale * math.sqrt(dk))


def vectors_saturated_share(dk, scale, n_keys=16, rows=100_000, seed=0):
    """Right too, the long way (fine at the checker's sizes up to dk = 1024): real q and k, |q| not fixed."""
    g = torch.Generator().manual_seed(seed)
    rows = min(rows, 4000)
    q, k = torch.randn(rows, 1, dk, generator=g), torch.randn(rows, n_keys, dk, generator=g)
    s = (q @ k.transpose(-2, -1)).squeeze(1) * scale
    return (torch.softmax(s, -1).amax(-1) > 0.99).float().mean()          # a 0-d tensor is accepted


RIGHT["saturated_share"] = nb01.check_saturated_share, good_saturated_share


def test_saturated_share_accepts_the_long_way(capsys):
    expect_correct(nb01.check_saturated_share, vectors_saturated_share, capsys)


def test_saturated_share_compares_the_shortcut_with_real_q_and_k(capsys):
    """The checker prints the shortcut's share next to real q and k at dk = 16 (where |q|^2 / dk spreads most)
    and at dk = 4096; for the right answer each pair agrees to within the checker's 0.05."""
    import re

    out = expect_correct(nb01.check_saturated_share, good_saturated_share, capsys)
    pairs = re.findall(r"(\d+(?:\.\d)?)% saturated, 20,000 rows of real q and k give (\d+(?:\.\d)?)%", out)
    pairs += re.findall(r"at dk = 4096 (\d+)% against (\d+)%", out)
    assert "at dk = 16" in out and len(pairs) == 2, out
    assert all(abs(float(a) - float(b)) <= 5 for a, b in pairs), out
    assert nb01._measured_share(16, rows=20_000) != good_saturated_share(16, 1.0, 16, 20_000)   # a real measurement


def count_not_share(dk, scale, n_keys=16, rows=100_000, seed=0):
    return good_saturated_share(dk, scale, n_keys, rows, seed) * rows


def unsaturated_share(dk, scale, n_keys=16, rows=100_000, seed=0):
    return 1 - good_saturated_share(dk, scale, n_keys, rows, seed)


def softmax_over_rows(dk, scale, n_keys=16, rows=100_000, seed=0):
    s = torch.randn(rows, n_keys, generator=torch.Generator().manual_seed(seed)) * (scale * math.sqrt(dk))
    return (torch.softmax(s, 0).amax(-1) > 0.99).float().mean().item()


def per_row(dk, scale, n_keys=16, rows=100_000, seed=0):
    s = torch.randn(rows, n_keys, generator=torch.Generator().manual_seed(seed)) * (scale * math.sqrt(dk))
    return torch.softmax(s, -1).amax(-1) > 0.99


@pytest.mark.parametrize("wrong, match", [
    (share_with_std(lambda dk, scale: scale * dk), "variance"),              # std = dk, not sqrt(dk)
    (share_with_std(lambda dk, scale: scale), "without the sqrt"),           # the sum's growth forgotten
    (share_with_std(lambda dk, scale: math.sqrt(dk)), "scale is ignored"),
    (unsaturated_share, "NOT saturated"),
    (count_not_share, "count of rows"),
    (per_row, "one number"),
    (softmax_over_rows, "dim=-1"),
])
def test_saturated_share_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb01.check_saturated_share(wrong)


def unscaled(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1), -1)
    return w @ v, w


def by_dk(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], -1)
    return w @ v, w


def wrong_dim(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -2)
    return w @ v, w


def flipped_mask(q, k, v, mask=None):
    return good_attention(q, k, v, None if mask is None else ~mask)


def ignored_mask(q, k, v, mask=None):
    return good_attention(q, k, v)


def only_weights_right(q, k, v, mask=None):
    out, w = good_attention(q, k, v, mask)
    return out * 2, w


def sdpa_of_the_package(q, k, v, mask=None):
    import selfattn_lite as sal
    return sal.scaled_dot_product_attention(q, k, v, attn_mask=mask)


RIGHT["attention"] = nb01.check_attention, good_attention


@pytest.mark.parametrize("wrong, match", [
    (unscaled, "sqrt\\(dk\\)"), (by_dk, "by dk"), (wrong_dim, "dim=-1"), (flipped_mask, "polarity"),
    (ignored_mask, "ignored"), (only_weights_right, "output is not weights @ V"),
    (lambda q, k, v, mask=None: good_attention(q, k, v)[0], "pair"),
    (lambda q, k, v, mask=None: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
     "scaled_dot_product_attention"),
    (sdpa_of_the_package, "scaled_dot_product_attention"),
])
def test_attention_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb01.check_attention(wrong)


def test_forbidden_functions_come_back():
    """A checker that refused torch's softmax or SDPA leaves them working afterwards."""
    import selfattn_lite as sal
    with pytest.raises(ExerciseError):
        nb01.check_softmax(lambda x: x.softmax(-1))
    with pytest.raises(ExerciseError):
        nb01.check_attention(sdpa_of_the_package)
    x = torch.randn(2, 3)
    torch.testing.assert_close(x.softmax(-1), torch.nn.functional.softmax(x, -1))
    torch.testing.assert_close(torch.softmax(x, -1), torch.special.softmax(x, -1))
    torch.testing.assert_close(sal.scaled_dot_product_attention(x, x, x)[0],
                               torch.nn.functional.scaled_dot_product_attention(x, x, x))


def token2_causal(scores):
    """softmax over tokens 1 and 2 (token 2's causal row), 0 for token 3."""
    return torch.softmax(scores.masked_fill(torch.tensor([False, False, True]), float("-inf")), -1)


def test_second_query_checker(capsys):
    s = nb02.KEYS @ torch.tensor([0.0, 1.0]) / math.sqrt(2)
    w = token2_causal(s)
    out = expect_correct(nb02.check_second_query, w, capsys, w @ nb02.VALUES)
    assert "weights [0.33, 0.67, 0.0], output [0.33, 1.34]" in out
    expect_not_attempted(nb02.check_second_query, None, capsys, None)
    unmasked = torch.softmax(s, -1)
    planted = [
        (unmasked, "without the mask"),                                              # no causal mask
        (unmasked * torch.tensor([1.0, 1.0, 0.0]), "after the softmax"),              # zeroed, not renormalised
        (torch.tensor([1.0, 0.0, 0.0]), "token 1's row"),                             # the first row of the mask
        (token2_causal(s * math.sqrt(2)), "sqrt\\(2\\)"),                              # scale forgotten
        (token2_causal(s * 2), "multiplied the scores"),                               # times sqrt(2), not divided
        (s.masked_fill(torch.tensor([False, False, True]), 0.0), "apply softmax"),    # scores, not weights
    ]
    for weights, match in planted:
        with pytest.raises(ExerciseError, match=match):
            nb02.check_second_query(weights, weights @ nb02.VALUES)
    with pytest.raises(ExerciseError, match="weights @ VALUES"):
        nb02.check_second_query(w, w @ nb02.KEYS)
    with pytest.raises(ExerciseError, match=r"shape \(3,\)"):
        nb02.check_second_query(w[:2], w @ nb02.VALUES)


def good_scale_for_weight(w):
    return math.sqrt(2) * math.log((1 / w - 1) / 2)


RIGHT["scale_for_weight"] = nb02.check_scale_for_weight, good_scale_for_weight


@pytest.mark.parametrize("wrong, match", [
    (lambda w: math.log((1 / w - 1) / 2), "multiply your c by sqrt"),
    (lambda w: math.sqrt(2) * math.log(1 / w - 1), "two keys"),
    (lambda w: math.sqrt(2) * math.log(1 / w), "solve for c"),
    (lambda w: "large", "return a number"),
])
def test_scale_for_weight_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb02.check_scale_for_weight(wrong)


INV_SQRT2 = 1 / math.sqrt(2)


def query_gradient_parts(q, coord=1, scale=INV_SQRT2):
    """(g, w): the gradient of the output's coordinate `coord` on the scaled scores, and the weights, for query q."""
    w = torch.softmax(nb02.KEYS @ q * scale, -1)
    return w * (nb02.VALUES[:, coord] - w @ nb02.VALUES[:, coord]), w


def good_query_gradient(q):
    g, _ = query_gradient_parts(q)
    return g @ nb02.KEYS / math.sqrt(2)


def autograd_query_gradient(q):
    q = q.clone().requires_grad_()
    (torch.softmax(nb02.KEYS @ q / math.sqrt(2), -1) @ nb02.VALUES)[1].backward()
    return q.grad


RIGHT["query_gradient"] = nb02.check_query_gradient, good_query_gradient
RIGHT["query_gradient (autograd)"] = nb02.check_query_gradient, autograd_query_gradient
RIGHT["query_gradient (a list)"] = nb02.check_query_gradient, lambda q: good_query_gradient(q).tolist()


def test_query_gradient_checker_says_what_the_gradient_does(capsys):
    out = expect_correct(nb02.check_query_gradient, good_query_gradient, capsys)
    assert "towards k_2" in out and "along k_3 - k_1" in out and "passes almost nothing" in out
    expect_not_attempted(nb02.check_query_gradient, None, capsys)


AT_START = good_query_gradient(torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("wrong, match", [
    (lambda q: -good_query_gradient(q), "sign is flipped"),
    (lambda q: query_gradient_parts(q)[0] @ nb02.KEYS, "forgot the 1/sqrt"),
    (lambda q: query_gradient_parts(q)[0] @ nb02.KEYS * math.sqrt(2), "multiplied by sqrt"),
    (lambda q: query_gradient_parts(q)[0] @ nb02.VALUES / math.sqrt(2), "not the value"),
    (lambda q: query_gradient_parts(q)[1] @ nb02.KEYS / math.sqrt(2), "attention weights"),
    (lambda q: query_gradient_parts(q, coord=0)[0] @ nb02.KEYS / math.sqrt(2), "o_x"),
    (lambda q: query_gradient_parts(q, scale=1.0)[0] @ nb02.KEYS / math.sqrt(2), "unscaled scores"),
    (lambda q: AT_START, r"right at \[1, 0\] only"),                    # the scale-1 answer for every query
    (lambda q: torch.zeros(2), "chain rule"),
    (lambda q: good_query_gradient(q)[None], r"shape \(2,\)"),
    (good_query_gradient(torch.tensor([1.0, 0.0])), "pass your function"),
])
def test_query_gradient_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb02.check_query_gradient(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)


def test_notebook_02_example_is_the_checkers_keys_and_values():
    """The tensors notebook 02 types in its first cell are the checker's KEYS and VALUES."""
    import nbformat
    from helpers import ROOT
    nb = nbformat.read(ROOT / "notebooks" / "02_worked_numeric_example.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "ea916d59")
    env = {}
    exec(cell.source, {"torch": torch}, env)
    assert torch.equal(env["K"], nb02.KEYS) and torch.equal(env["V"], nb02.VALUES)
