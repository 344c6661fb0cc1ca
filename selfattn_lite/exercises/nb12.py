"""Checkers for notebook 12: NTK-aware frequencies, YaRN's frequencies (as the reference code ramps them),
YaRN's ramp and temperature from the paper's definitions, the loss at every position of a window
(the measurement behind the notebook's curves), Llama 3.1's frequency blend from its definition, and
the position where zero-shot NTK-aware scaling first breaks."""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from ..models import DATA_DIR
from ..positions import RotaryEmbedding, rope_inv_freq, scaled_inv_freq
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_ntk_inv_freq", "check_yarn_inv_freq", "check_yarn_paper", "check_loss_per_position",
           "check_llama3_inv_freq", "check_ntk_break"]


def check_ntk_inv_freq(fn) -> None:
    """``fn(head_dim, base, factor)`` must return the NTK-aware (d/2,) frequencies."""
    d, base, s = 16, 10000.0, 4.0
    try:
        got = attempt(fn, d, base, s)
    except NotAttempted:
        return not_attempted("ntk_inv_freq")
    got = require_tensor("ntk_inv_freq(16, 10000.0, 4.0)", got, (d // 2,)).double()
    plain = rope_inv_freq(d, base).double()
    expected = scaled_inv_freq(d, base, {"kind": "ntk", "factor": s})[0].double()
    if close(got, plain):
        raise ExerciseError("these are the unscaled frequencies: change the base to b * s^(d / (d - 2))")
    if close(got, plain / s):
        raise ExerciseError("you divided every frequency by s: that is position interpolation (PI); NTK-aware "
                            "scaling changes the base so that pair 0 keeps its speed")
    if close(got, rope_inv_freq(d, base * s).double()):
        raise ExerciseError("base * s is not enough: the slowest pair is then slowed by s^((d-2)/d), not s; "
                            "use b' = b * s^(d / (d - 2))")
    if close(got, rope_inv_freq(d, base * s ** ((d - 2) / d)).double()):
        raise ExerciseError("the exponent is upside down: b' = b * s^(d / (d - 2)), not s^((d - 2) / d)")
    if not close(got, expected):
        raise ExerciseError(f"expected {[round(v, 6) for v in expected.tolist()]}, "
                            f"got {[round(v, 6) for v in got.tolist()]}")
    for d2, s2 in ((64, 8.0), (128, 2.0)):
        again = require_tensor(f"ntk_inv_freq({d2}, 10000.0, {s2})", attempt(fn, d2, base, s2), (d2 // 2,))
        if not close(again.double(), scaled_inv_freq(d2, base, {"kind": "ntk", "factor": s2})[0].double()):
            raise ExerciseError(f"right for head_dim 16, wrong for head_dim {d2}, factor {s2}: use d and s, "
                                "not constants")
    return passed("NTK-aware base b * s^(d/(d-2)): pair 0 unchanged, the slowest pair exactly s times slower")


def _yarn_variants(d: int, base: float, s: float, L: int) -> dict[str, torch.Tensor]:
    """YaRN's frequencies and the usual wrong versions (float64)."""
    theta = rope_inv_freq(d, base).double()
    i = torch.arange(d // 2, dtype=torch.float64)

    def pair_with_turns(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair_with_turns(32.0)), 0), min(math.ceil(pair_with_turns(1.0)), d - 1)
    ramp = ((i - low) / (high - low)).clamp(0, 1)                 # 0 = keep, 1 = interpolate
    turns = L * theta / (2 * math.pi)
    ramp_r = (1 - (turns - 1) / (32 - 1)).clamp(0, 1)              # linear in r (the paper's equation)
    lo_raw, hi_raw = pair_with_turns(32.0), pair_with_turns(1.0)
    ramp_unrounded = ((i - lo_raw) / (hi_raw - lo_raw)).clamp(0, 1)
    return {
        "right": (1 - ramp) * theta + ramp * theta / s,
        "reversed": ramp * theta + (1 - ramp) * theta / s,
        "in_r": (1 - ramp_r) * theta + ramp_r * theta / s,
        "unrounded": (1 - ramp_unrounded) * theta + ramp_unrounded * theta / s,
    }


def check_yarn_inv_freq(fn) -> None:
    """``fn(head_dim, base, factor, original_max_len)`` must return YaRN's (d/2,) frequencies
    (beta_fast = 32, beta_slow = 1, the ramp linear in the pair index as in the reference code)."""
    d, base, s, L = 64, 10000.0, 8.0, 4096
    try:
        got = attempt(fn, d, base, s, L)
    except NotAttempted:
        return not_attempted("yarn_inv_freq")
    got = require_tensor("yarn_inv_freq(64, 10000.0, 8.0, 4096)", got, (d // 2,)).double()
    v = _yarn_variants(d, base, s, L)
    theta = rope_inv_freq(d, base).double()
    torch.testing.assert_close(v["right"].float(), scaled_inv_freq(d, base, {"kind": "yarn", "factor": s,
                                                                            "original_max_len": L})[0])
    if close(got, theta / s):
        raise ExerciseError("every pair divided by s is PI; YaRN keeps the fast pairs (more than 32 turns in L)")
    if close(got, theta):
        raise ExerciseError("unchanged frequencies: the slow pairs (under one turn in L) must be divided by s")
    if close(got, v["reversed"]):
        raise ExerciseError("the ramp is reversed: fast pairs (many turns in L) keep theta_i, slow ones get "
                            "theta_i / s")
    if close(got, v["in_r"]):
        raise ExerciseError("you ramped linearly in the number of turns r_i (the paper's equation); this exercise "
                            "follows the reference code: linear in the pair index i between the pairs where "
                            "r = 32 and r = 1")
    if close(got, v["unrounded"]):
        raise ExerciseError("nearly: the reference code rounds the ramp's ends outwards (floor at r = 32, "
                            "ceil at r = 1) before ramping")
    if not close(got, v["right"]):
        worst = (got - v["right"]).abs().max().item()
        raise ExerciseError(f"values differ from YaRN's by up to {worst:.3g}")
    return passed("YaRN: fast pairs kept, slow pairs / s, a ramp in the pair index between them")


def _paper_variants(theta: torch.Tensor, s: float, L: int) -> dict[str, torch.Tensor]:
    """The paper's h(theta) (alpha = 1, beta = 32) and the usual wrong versions, float64."""
    def blend(gamma):
        return (1 - gamma) * theta / s + gamma * theta

    turns = L * theta / (2 * math.pi)                                     # r = L / lambda
    gamma = ((turns - 1) / (32 - 1)).clamp(0, 1)
    d = 2 * len(theta)
    base = theta[1].item() ** (-d / 2)                                    # theta_1 = base^(-2/d)
    code_gamma = scaled_inv_freq(d, base, {"kind": "yarn", "factor": s, "original_max_len": L})[0].double()
    return {
        "right": blend(gamma),
        "reversed": blend(1 - gamma),
        "no_2pi": blend(((L * theta - 1) / 31).clamp(0, 1)),
        "wavelength": blend(((2 * math.pi / theta - 1) / 31).clamp(0, 1)),
        "no_clamp": blend((turns - 1) / 31),
        "not_normalised": blend((turns - 1).clamp(0, 1)),
        "code_ramp": code_gamma,
    }


_PAPER_MISTAKES = {
    "reversed": "the ramp is reversed: in the paper gamma = 1 keeps theta_i (fast pairs, r > beta) and gamma = 0 "
                "divides it by s (slow pairs, r < alpha): h = (1 - gamma) theta / s + gamma theta",
    "no_2pi": "r_i = L / lambda_i with lambda_i = 2 pi / theta_i, so r_i = L theta_i / (2 pi): you forgot the 2 pi",
    "wavelength": "the ramp is over the turns r_i = L / lambda_i, not over the wavelength lambda_i",
    "no_clamp": "clamp gamma to [0, 1]: pairs with more than beta turns keep theta_i, not more than theta_i",
    "not_normalised": "between alpha and beta, gamma = (r - alpha) / (beta - alpha): divide by beta - alpha",
    "code_ramp": "that is the reference code's ramp (linear in the pair index i, as in exercise 2); the paper's is "
                 "linear in the turns r_i: gamma = clamp((r - alpha) / (beta - alpha), 0, 1)",
}


def check_yarn_paper(fn) -> None:
    """``fn(inv_freq, factor, original_max_len) -> (new_inv_freq, mscale)``: YaRN by the paper's definitions.

    r_i = L theta_i / (2 pi), gamma = clamp((r - 1) / (32 - 1), 0, 1), h(theta_i) = (1 - gamma) theta_i / s
    + gamma theta_i, and sqrt(1/t) = 0.1 ln s + 1 (the factor on cos and sin). Checked against the
    package's yarn scaling wherever the paper's ramp is 0 or 1, and against the score factor that the
    package's RotaryEmbedding produces.
    """
    theta = rope_inv_freq(16, 10000.0).double()                          # the tiny decoder's 8 pairs
    s, L = 4.0, 512
    try:
        got = attempt(fn, theta.clone(), s, L)
    except NotAttempted:
        return not_attempted("yarn_paper")
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseError(f"return two things, (new_inv_freq, mscale), mscale being the factor on cos and sin, "
                            f"sqrt(1/t) = 0.1 ln s + 1; got {type(got).__name__}")
    freq = require_tensor("yarn_paper(...)[0]", got[0], (8,)).double()
    mscale = got[1].item() if isinstance(got[1], torch.Tensor) else got[1]
    if not isinstance(mscale, (int, float)):
        raise ExerciseError(f"mscale (the factor on cos and sin) should be a number, got {type(mscale).__name__}")
    v = _paper_variants(theta, s, L)
    if close(freq, theta / s):
        raise ExerciseError("every pair divided by s is PI; the paper keeps pairs with more than beta = 32 turns")
    if close(freq, theta):
        raise ExerciseError("unchanged frequencies: pairs with fewer than alpha = 1 turn must be divided by s")
    if not close(freq, v["right"], atol=1e-9, rtol=1e-7):
        for name, message in _PAPER_MISTAKES.items():
            if close(freq, v[name], atol=1e-9, rtol=1e-7):
                raise ExerciseError(message)
        raise ExerciseError(f"expected {[round(x, 6) for x in v['right'].tolist()]}, "
                            f"got {[round(x, 6) for x in freq.tolist()]}")
    want = 0.1 * math.log(s) + 1
    if math.isclose(mscale, want ** 2, rel_tol=1e-6):
        raise ExerciseError("that is 1/t, the factor on the scores q·k; cos and sin (so q and k) each get its "
                            "square root, sqrt(1/t) = 0.1 ln s + 1")
    if math.isclose(mscale, 0.1 * math.log10(s) + 1, rel_tol=1e-6):
        raise ExerciseError("use the natural log: 0.1 ln s + 1")
    if math.isclose(mscale, 1 / want, rel_tol=1e-6):
        raise ExerciseError("upside down: YaRN sharpens the scores, so the factor is 0.1 ln s + 1 > 1")
    if math.isclose(mscale, 1.0):
        raise ExerciseError("mscale (the factor on cos and sin) = 1 leaves out YaRN's temperature: "
                            "sqrt(1/t) = 0.1 ln s + 1")
    if not math.isclose(mscale, want, rel_tol=1e-6):
        raise ExerciseError(f"mscale should be 0.1 ln s + 1 = {want:.4f} for s = {s:g}, got {mscale:.4f}")
    for d, s2, L2 in ((16, 4.0, 512), (128, 8.0, 4096), (64, 16.0, 2048)):   # against the package
        theta2 = rope_inv_freq(d, 10000.0).double()
        freq2, mscale2 = attempt(fn, theta2.clone(), s2, L2)
        scaling = {"kind": "yarn", "factor": s2, "original_max_len": L2}
        package, package_mscale = scaled_inv_freq(d, 10000.0, scaling)
        right = _paper_variants(theta2, s2, L2)["right"]
        if not close(torch.as_tensor(freq2).double(), right, atol=1e-9, rtol=1e-7):
            raise ExerciseError(f"right for (d = 16, s = 4, L = 512), wrong for d = {d}, s = {s2:g}, L = {L2}: "
                                "use the arguments, not constants")
        ends = (right == theta2) | (right == theta2 / s2)                # where the paper's ramp is 1 or 0
        assert close(right[ends], package.double()[ends])                # the package's code agrees there
        mscale2 = float(mscale2)
        if not math.isclose(mscale2, package_mscale, rel_tol=1e-6):
            raise ExerciseError(f"mscale for s = {s2:g} should be the package's {package_mscale:.4f}")
        rope = RotaryEmbedding(d, scaling=scaling)                        # the score factor, measured
        qk = torch.randn(2, 1, d, generator=torch.Generator().manual_seed(d), dtype=torch.float64)
        pos = torch.tensor([L2 // 3])
        plain = RotaryEmbedding(d, scaling=scaling)
        plain.attention_scaling = 1.0
        ratio = (rope(qk[0], pos) @ rope(qk[1], pos).T) / (plain(qk[0], pos) @ plain(qk[1], pos).T)
        assert math.isclose(ratio.item(), mscale2 ** 2, rel_tol=1e-6)   # scores times mscale^2 = 1/t
    return passed("the paper's ramp over the turns r, h(theta) = (1 - gamma) theta / s + gamma theta, and "
                  "sqrt(1/t) = 0.1 ln s + 1; the package agrees where the ramp is 0 or 1, and its scores "
                  "are scaled by mscale^2")


def _tiny_model(vocab: int = 11):
    """A deterministic toy 'model': logits that depend on the token and its position."""
    gen = torch.Generator().manual_seed(12)
    table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)

    def model(ids):                                               # (n, T) -> (n, T, V)
        pos = torch.arange(ids.shape[1], dtype=torch.float64)[None, :, None]
        return table[ids] + 0.05 * pos
    return model


def check_loss_per_position(fn) -> None:
    """``fn(model, windows)`` must return (n, T) cross-entropies of predicting windows[:, t + 1]."""
    model = _tiny_model()
    windows = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(2))   # (n, T + 1)
    try:
        got = attempt(fn, model, windows.clone())
    except NotAttempted:
        return not_attempted("loss_per_position")
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        raise ExerciseError("a single number: keep one loss per window and position, shape (n, T); "
                            "use reduction='none'")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (8,):
        raise ExerciseError("you averaged over the windows: return (n, T), one row per window")
    got = require_tensor("loss_per_position(model, windows)", got, (3, 8)).double()
    logits = model(windows[:, :-1])                               # (n, T, V)
    expected = F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")
    same_token = F.cross_entropy(logits.transpose(1, 2), windows[:, :-1], reduction="none")
    if close(got, same_token):
        raise ExerciseError("the targets are not shifted: position t predicts token t + 1 (windows[:, 1:])")
    whole = F.cross_entropy(model(windows[:, 1:]).transpose(1, 2), windows[:, 1:], reduction="none")
    if close(got, whole):
        raise ExerciseError("the model must read windows[:, :-1] (the inputs), not windows[:, 1:]")
    if close(got, -logits.gather(-1, windows[:, 1:, None])[..., 0]):
        raise ExerciseError("that is minus the raw logit; the loss is minus the log-softmax at the target")
    if not close(got, expected):
        raise ExerciseError("not the cross-entropy at each position: -log softmax(logits[:, t])[windows[:, t + 1]]")
    return passed("one cross-entropy per window and position, targets shifted by one")


# ----------------------------------------------------------------------------- Llama 3.1's frequency blend

def _llama3_variants(theta: torch.Tensor, s: float, L: int, low: float, high: float) -> dict[str, torch.Tensor]:
    """Llama 3.1's frequencies from its definition, right and with the usual mistakes."""
    wavelength = 2 * math.pi / theta
    smooth = (L / wavelength - low) / (high - low)                       # linear in the turns r = L / lambda

    def blend(sm, keep_fast=wavelength < L / high, divide_slow=wavelength > L / low, reversed_=False):
        mid = (1 - sm) * theta / s + sm * theta if not reversed_ else (1 - sm) * theta + sm * theta / s
        return torch.where(keep_fast, theta, torch.where(divide_slow, theta / s, mid))

    in_wavelength = (L / low - wavelength) / (L / low - L / high)         # linear in lambda instead of r
    no_2pi = 1 / theta
    return {
        "right": blend(smooth),
        "unchanged": theta.clone(),
        "pi": theta / s,
        "swapped": blend((L / wavelength - high) / (low - high), keep_fast=wavelength < L / low,
                         divide_slow=wavelength > L / high),
        "reversed": blend(smooth, reversed_=True),
        "wavelength": blend(in_wavelength),
        "no_2pi": blend((L / no_2pi - low) / (high - low), keep_fast=no_2pi < L / high, divide_slow=no_2pi > L / low),
        "no_clamp": (1 - smooth) * theta / s + smooth * theta,
    }


_LLAMA3_MISTAKES = {
    "unchanged": "these are the unscaled frequencies: pairs with a wavelength over L / low_freq_factor are divided "
                 "by s, and the pairs between the two boundaries are blended",
    "pi": "every pair divided by s is position interpolation; Llama 3.1 keeps the fast pairs (wavelength under "
          "L / high_freq_factor) as they are",
    "swapped": "the two boundaries are swapped: keep θ where the wavelength is under L / high_freq_factor "
               "(more than high_freq_factor turns in L), divide by s where it is over L / low_freq_factor",
    "reversed": "the blend is reversed: smooth = 1 at the fast end keeps θ, so the blend is "
                "(1 − smooth) θ / s + smooth θ",
    "wavelength": "the blend is linear in the turns r = L / λ, not in the wavelength λ: "
                  "smooth = (L / λ − low_freq_factor) / (high_freq_factor − low_freq_factor)",
    "no_2pi": "the wavelength of a pair is λ = 2π / θ: you forgot the 2π",
    "no_clamp": "outside the two boundaries smooth leaves [0, 1]: keep θ for the fast pairs and use θ / s for "
                "the slow ones, and blend only between",
}


def check_llama3_inv_freq(fn) -> None:
    """``fn(inv_freq, factor, original_max_len, low_freq_factor, high_freq_factor) -> (d/2,)``: Llama 3.1's blend.

    With λ = 2π / θ: θ kept where λ < L / high_freq_factor, θ / s where λ > L / low_freq_factor, and
    (1 − smooth) θ / s + smooth θ between, smooth = (L / λ − low) / (high − low). Checked against the
    package's ``llama3`` scaling at Llama 3.1's own shape (d = 128, base 500000, L = 8192, s = 8) and at
    the tiny decoder's (d = 16, base 10000, L = 512, s = 4).
    """
    cases = ((128, 500000.0, 8.0, 8192, 1.0, 4.0), (16, 10000.0, 4.0, 512, 1.0, 4.0),
             (64, 10000.0, 4.0, 2048, 2.0, 8.0))
    for k, (d, base, s, L, low, high) in enumerate(cases):
        theta = rope_inv_freq(d, base).double()
        try:
            got = attempt(fn, theta.clone(), s, L, low, high)
        except NotAttempted:
            return not_attempted("llama3_inv_freq")
        got = require_tensor(f"llama3_inv_freq for d = {d}", got, (d // 2,)).double()
        scaling = {"kind": "llama3", "factor": s, "original_max_len": L, "low_freq_factor": low,
                   "high_freq_factor": high}
        package = scaled_inv_freq(d, base, scaling)[0].double()
        variants = _llama3_variants(theta, s, L, low, high)
        if close(got, variants["right"], atol=1e-9, rtol=1e-5) and close(got, package, atol=1e-9, rtol=1e-5):
            continue
        for name, message in _LLAMA3_MISTAKES.items():
            if close(got, variants[name], atol=1e-9, rtol=1e-5):
                raise ExerciseError(message)
        if k > 0:
            raise ExerciseError(f"right for Llama 3.1's own shape but not for d = {d}, L = {L}, s = {s}, "
                                f"low = {low}, high = {high}: use the arguments, not Llama 3.1's constants")
        raise ExerciseError("expected θ where λ < L / high_freq_factor, θ / s where λ > L / low_freq_factor, "
                            "and (1 − smooth) θ / s + smooth θ between, smooth = (L / λ − low) / (high − low)")
    return passed("Llama 3.1's blend: fast pairs kept, slow pairs / s, linear in the turns L / λ between; "
                  "the same as the package's llama3 scaling (and Meta's apply_scaling)")


# ----------------------------------------------------------------------------- where NTK-aware breaks

def _ntk_break(d: int, base: float, s: float, L: int, mistake: str | None = None) -> float:
    """The first position where a zero-shot NTK-aware pair meets an angle it never saw in training."""
    theta = rope_inv_freq(d, base).double()
    exponent = 1.0 if mistake == "no_exponent" else d / (d - 2)
    slowed = rope_inv_freq(d, base * s ** exponent).double()
    turns = L * theta / (2 * math.pi)                                    # r_i = L / lambda_i
    new_at = L * theta / slowed                                          # position where m theta'_i = L theta_i
    if mistake == "all_pairs":
        return new_at.min().item()
    if mistake == "slowest_pair":
        return new_at[-1].item()
    return new_at[turns < 1].min().item()


_NTK_BREAK_MISTAKES = {
    "slowest_pair": "that is the slowest pair, slowed by the full s: it meets new angles only at L · s. The pairs "
                    "between are slowed by less (s^(2i/(d−2))), so one of them reaches new angles first",
    "all_pairs": "a pair that turns at least once within L has already seen every angle, so it never meets a new "
                 "one; only the pairs with r_i = L / λ_i < 1 can, and NTK-aware slows the first of them by less "
                 "than s",
    "no_exponent": "NTK-aware's base is b · s^(d/(d−2)), not b · s: the exponent makes the slowest pair exactly "
                   "s times slower",
}


def _ntk_measured(position: float) -> dict:
    """The saved run's NTK-aware loss past 512: buckets wholly before ``position`` against those wholly after."""
    results = json.loads((DATA_DIR / "context_eval.json").read_text())
    buckets = torch.tensor(results["loss"]["ntk"]["per_window_bucket"], dtype=torch.float64)   # (windows, 8)
    size, trained = results["bucket"], results["trained_len"]
    starts = range(0, results["target_len"], size)
    before = [k for k, e in enumerate(starts) if e >= trained and e + size <= position]
    after = [k for k, e in enumerate(starts) if e >= position]
    diffs = buckets[:, after].mean(-1) - buckets[:, before].mean(-1)    # paired over the windows
    return dict(before=buckets[:, before].mean().item(), after=buckets[:, after].mean().item(),
                mean=diffs.mean().item(), sd=diffs.std().item(), first_after=starts[after[0]],
                last_before=starts[before[-1]] + size)


def check_ntk_break(fn) -> None:
    """``fn(head_dim, base, factor, trained_len) -> position``: where zero-shot NTK-aware first breaks.

    A pair with r_i = L θ_i / (2π) < 1 turns less than once in training and saw only angles up to about
    L θ_i. Slowed to θ'_i it reaches the angle L θ_i at position L θ_i / θ'_i; the answer is the earliest
    such position. Checked against the package's NTK-aware frequencies (the tiny decoder's shape and a
    Llama 2-like head), then against the measured losses of notebook 12: the saved run's NTK-aware loss
    in the buckets wholly after the predicted position is above its loss in the buckets from 512 wholly before
    it, on the same windows.
    """
    cases = ((16, 10000.0, 4.0, 512), (128, 10000.0, 8.0, 4096), (64, 10000.0, 2.0, 1024))
    for k, (d, base, s, L) in enumerate(cases):
        try:
            got = attempt(fn, d, base, s, L)
        except NotAttempted:
            return not_attempted("ntk_break")
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)):
            raise ExerciseError(f"return one number, the position, got {type(got).__name__}")
        want = _ntk_break(d, base, s, L)
        if math.isclose(got, want, rel_tol=1e-4):
            continue
        for name, message in _NTK_BREAK_MISTAKES.items():
            if math.isclose(got, _ntk_break(d, base, s, L, name), rel_tol=1e-4):
                raise ExerciseError(message)
        if math.isclose(got, L, rel_tol=1e-4):
            raise ExerciseError("L itself is where RoPE without scaling breaks; NTK-aware slows the slow pairs, "
                                "so its first new angle comes later")
        if k > 0:
            raise ExerciseError(f"right for the tiny decoder but not for d = {d}, base = {base:g}, s = {s}, "
                                f"L = {L}: use the arguments")
        raise ExerciseError("expected the earliest L θ_i / θ'_i over the pairs with L θ_i / (2π) < 1, "
                            "θ'_i being NTK-aware's frequencies (base b · s^(d/(d−2)))")
    position = _ntk_break(16, 10000.0, 4.0, 512)
    seen = _ntk_measured(position)
    if not seen["mean"] > seen["sd"]:                                    # the saved run must bear the prediction out
        raise ExerciseError("the saved run does not show NTK-aware's loss rising after the predicted position")
    return passed(f"NTK-aware first meets new angles at position {position:.0f} on the tiny decoder; the saved run's "
                  f"NTK-aware loss from {seen['first_after']} on is above its loss between 512 and "
                  f"{seen['last_before']} (the buckets wholly before it), "
                  f"on the same windows (by {seen['mean']:.2f} ± {seen['sd']:.2f} nats)")
