"""Notebook 12's checkers: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb12 as check
from selfattn_lite.positions import rope_inv_freq, scaled_inv_freq


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


# ----------------------------------------------------------------------------- Llama 3.1's blend

def llama3(theta, s, L, low, high, *, mistake=None):
    """Llama 3.1's frequencies, pair by pair as Meta's apply_scaling writes them; or with one mistake."""
    out = []
    for f in theta.tolist():
        wavelength = (1 / f) if mistake == "no_2pi" else 2 * math.pi / f
        fast, slow = (L / low, L / high) if mistake == "swapped" else (L / high, L / low)
        smooth = (L / wavelength - low) / (high - low)
        if mistake == "swapped":
            smooth = (L / wavelength - high) / (low - high)
        if mistake == "wavelength":
            smooth = (L / low - wavelength) / (L / low - L / high)
        if mistake == "no_clamp":
            out.append((1 - smooth) * f / s + smooth * f)
        elif wavelength < fast:
            out.append(f)
        elif wavelength > slow:
            out.append(f / s)
        elif mistake == "reversed":
            out.append((1 - smooth) * f + smooth * f / s)
        else:
            out.append((1 - smooth) * f / s + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


RIGHT["llama3_inv_freq"] = check.check_llama3_inv_freq, llama3


@pytest.mark.parametrize("wrong, message", [
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi, mistake="swapped"), "boundaries are swapped"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi, mistake="reversed"), "blend is reversed"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi, mistake="wavelength"), "not in the wavelength"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi, mistake="no_2pi"), "forgot the 2π"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi, mistake="no_clamp"), "smooth leaves [0, 1]"),
    (lambda th, s, L, lo, hi: th.clone(), "unscaled"),
    (lambda th, s, L, lo, hi: th / s, "position interpolation"),
    (lambda th, s, L, lo, hi: llama3(th, 8.0, 8192, 1.0, 4.0), "use the arguments"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi) * 1.01, "expected θ where"),
    (lambda th, s, L, lo, hi: llama3(th, s, L, lo, hi)[:-1], "shape"),
])
def test_llama3_inv_freq_wrong(wrong, message):
    with pytest.raises(ExerciseError) as info:
        check.check_llama3_inv_freq(wrong)
    assert message in str(info.value), str(info.value)


def test_llama3_answer_matches_the_package_at_llama_3_1s_shape():
    theta = rope_inv_freq(128, 500000.0).double()
    ours = llama3(theta, 8.0, 8192, 1.0, 4.0)
    package = scaled_inv_freq(128, 500000.0, {"kind": "llama3", "factor": 8.0, "original_max_len": 8192})[0]
    torch.testing.assert_close(ours, package.double(), rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------- where NTK-aware breaks

def ntk_break(d, base, s, L, *, mistake=None):
    """The earliest position where a pair under one turn in L meets an angle beyond L * theta_i."""
    exponent = 1 if mistake == "no_exponent" else d / (d - 2)
    positions = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        slowed = (base * s ** exponent) ** (-2 * i / d)
        if mistake in ("all_pairs", "slowest_pair") or L * theta / (2 * math.pi) < 1:
            positions.append(L * theta / slowed)
    return positions[-1] if mistake == "slowest_pair" else min(positions)


RIGHT["ntk_break"] = check.check_ntk_break, ntk_break


@pytest.mark.parametrize("wrong, message", [
    (lambda d, b, s, L: ntk_break(d, b, s, L, mistake="slowest_pair"), "slowest pair"),
    (lambda d, b, s, L: ntk_break(d, b, s, L, mistake="all_pairs"), "already seen every angle"),
    (lambda d, b, s, L: ntk_break(d, b, s, L, mistake="no_exponent"), "b · s^(d/(d−2)), not b · s"),
    (lambda d, b, s, L: float(L), "already seen every angle"),       # pair 0 is kept by NTK: L, as all_pairs
    (lambda d, b, s, L: ntk_break(16, 10000.0, 4.0, 512), "use the arguments"),
    (lambda d, b, s, L: ntk_break(d, b, s, L) + 50, "expected the earliest"),
    (lambda d, b, s, L: [ntk_break(d, b, s, L)], "return one number"),
])
def test_ntk_break_wrong(wrong, message):
    with pytest.raises(ExerciseError) as info:
        check.check_ntk_break(wrong)
    assert message in str(info.value), str(info.value)


def test_ntk_break_on_the_tiny_decoder_is_pair_4_and_the_saved_losses_rise_after_it():
    position = ntk_break(16, 10000.0, 4.0, 512)
    assert 1024 < position < 1280                                      # pair 4: 512 * 4^(8/14)
    assert math.isclose(position, 512 * 4 ** (8 / 14), rel_tol=1e-12)
    seen = check._ntk_measured(position)
    assert seen["first_after"] == 1280 and seen["mean"] > seen["sd"] > 0


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)


def test_ntk_break_message_names_the_buckets_it_averages(capsys):
    """The message's range is the buckets averaged: 512 up to the last bucket wholly before 1131, i.e. 1024."""
    from selfattn_lite.exercises import nb12 as ex
    seen = ex._ntk_measured(ex._ntk_break(16, 10000.0, 4.0, 512))
    assert (seen["last_before"], seen["first_after"]) == (1024, 1280)
    check.check_ntk_break(ntk_break)
    out = capsys.readouterr().out
    assert "between 512 and 1024" in out and "from 1280 on" in out and "between 512 and 1131" not in out
