"""Notebook 12's checkers: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb12 as check


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


def theta(d, base):
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


# ---------------------------------------------------------------- 1. NTK-aware
def ntk(d, base, s, *, exponent=None, new_base=None):
    b = new_base(base, s, d) if new_base else base * s ** (d / (d - 2) if exponent is None else exponent(d))
    return theta(d, b)


RIGHT["ntk_inv_freq"] = check.check_ntk_inv_freq, ntk


@pytest.mark.parametrize("wrong, message", [
    (lambda d, b, s: theta(d, b), "unscaled"),
    (lambda d, b, s: theta(d, b) / s, "position interpolation"),
    (lambda d, b, s: theta(d, b * s), "base \\* s is not enough"),
    (lambda d, b, s: theta(d, b * s ** ((d - 2) / d)), "upside down"),
    (lambda d, b, s: theta(d, b * s ** (16 / 14)), "wrong for head_dim"),
    (lambda d, b, s: theta(d, b * s ** 1.2), "expected"),
])
def test_ntk_wrong(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_ntk_inv_freq(wrong)


# ---------------------------------------------------------------- 2. YaRN
def yarn(d, base, s, L, *, reverse=False, in_r=False, no_round=False):
    th = theta(d, base)

    def pair(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    if in_r:
        gamma = (1 - (L * th / (2 * math.pi) - 1) / 31).clamp(0, 1)
    else:
        low, high = (pair(32.0), pair(1.0)) if no_round else (math.floor(pair(32.0)), math.ceil(pair(1.0)))
        gamma = ((torch.arange(d // 2) - low) / (high - low)).clamp(0, 1)
    if reverse:
        gamma = 1 - gamma
    return (1 - gamma) * th + gamma * th / s


RIGHT["yarn_inv_freq"] = check.check_yarn_inv_freq, yarn


@pytest.mark.parametrize("wrong, message", [
    (lambda d, b, s, L: theta(d, b) / s, "PI"),
    (lambda d, b, s, L: theta(d, b), "unchanged"),
    (lambda d, b, s, L: yarn(d, b, s, L, reverse=True), "reversed"),
    (lambda d, b, s, L: yarn(d, b, s, L, in_r=True), "linearly in the number of turns"),
    (lambda d, b, s, L: yarn(d, b, s, L, no_round=True), "rounds the ramp"),
    (lambda d, b, s, L: yarn(d, b, s, L) * 1.01, "differ from YaRN"),
    (lambda d, b, s, L: theta(d, b)[:-1], "shape"),
])
def test_yarn_wrong(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_yarn_inv_freq(wrong)


# ---------------------------------------------------------------- 3. loss per position
def lpp(model, windows):
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")


RIGHT["loss_per_position"] = check.check_loss_per_position, lpp


@pytest.mark.parametrize("wrong, message", [
    (lambda m, w: lpp(m, w).mean(), "single number"),
    (lambda m, w: lpp(m, w).mean(0), "averaged over the windows"),
    (lambda m, w: F.cross_entropy(m(w[:, :-1]).transpose(1, 2), w[:, :-1], reduction="none"), "not shifted"),
    (lambda m, w: F.cross_entropy(m(w[:, 1:]).transpose(1, 2), w[:, 1:], reduction="none"), "must read"),
    (lambda m, w: -m(w[:, :-1]).gather(-1, w[:, 1:, None])[..., 0], "raw logit"),
    (lambda m, w: lpp(m, w) + 0.1, "not the cross-entropy"),
    (lambda m, w: lpp(m, w)[:, :-1], "shape"),
])
def test_loss_per_position_wrong(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_loss_per_position(wrong)


# ---------------------------------------------------------------- 4. YaRN by the paper's definitions
def paper(th, s, L, *, mistake=None):
    """h(theta) and sqrt(1/t) as the YaRN paper defines them (alpha = 1, beta = 32), or a planted mistake."""
    r = L * th / (2 * math.pi)
    if mistake == "no_2pi":
        r = L * th
    if mistake == "wavelength":
        r = 2 * math.pi / th
    gamma = (r - 1) / (32 - 1) if mistake != "not_normalised" else r - 1
    if mistake != "no_clamp":
        gamma = gamma.clamp(0, 1)
    if mistake == "reversed":
        gamma = 1 - gamma
    mscale = {"squared": (0.1 * math.log(s) + 1) ** 2, "log10": 0.1 * math.log10(s) + 1,
              "inverse": 1 / (0.1 * math.log(s) + 1), "none": 1.0}.get(mistake, 0.1 * math.log(s) + 1)
    return (1 - gamma) * th / s + gamma * th, mscale


RIGHT["yarn_paper"] = check.check_yarn_paper, paper
RIGHT["yarn_paper_0d_tensor"] = (
    check.check_yarn_paper,
    lambda th, s, L: (paper(th, s, L)[0], torch.tensor(paper(th, s, L)[1])))


def code_ramp(th, s, L):
    d = 2 * len(th)
    return yarn(d, 10000.0, s, L), 0.1 * math.log(s) + 1


@pytest.mark.parametrize("wrong, message", [
    (lambda th, s, L: paper(th, s, L, mistake="reversed"), "reversed"),
    (lambda th, s, L: paper(th, s, L, mistake="no_2pi"), "forgot the 2 pi"),
    (lambda th, s, L: paper(th, s, L, mistake="wavelength"), "not over the wavelength"),
    (lambda th, s, L: paper(th, s, L, mistake="no_clamp"), "clamp gamma"),
    (lambda th, s, L: paper(th, s, L, mistake="not_normalised"), "divide by beta - alpha"),
    (code_ramp, "reference code's ramp"),
    (lambda th, s, L: (th / s, 0.1 * math.log(s) + 1), "PI"),
    (lambda th, s, L: (th, 0.1 * math.log(s) + 1), "unchanged"),
    (lambda th, s, L: paper(th, s, L, mistake="squared"), "1/t, the factor on the scores"),
    (lambda th, s, L: paper(th, s, L, mistake="log10"), "natural log"),
    (lambda th, s, L: paper(th, s, L, mistake="inverse"), "upside down"),
    (lambda th, s, L: paper(th, s, L, mistake="none"), "leaves out YaRN's temperature"),
    (lambda th, s, L: (paper(th, s, L)[0], 1.3), "should be 0.1 ln s"),
    (lambda th, s, L: paper(th, s, L)[0], "return two things"),
    (lambda th, s, L: (paper(th, s, L)[0] * 1.01, 0.1 * math.log(s) + 1), "expected"),
    (lambda th, s, L: paper(th, 4.0, 512) if len(th) == 8 else paper(th, 4.0, 512), "use the arguments"),
])
def test_yarn_paper_wrong(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_yarn_paper(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
