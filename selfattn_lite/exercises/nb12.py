"""Checkers for notebook 12: NTK-aware frequencies, YaRN's frequencies (as the reference code ramps them),
YaRN's ramp and temperature from the paper's definitions, and the loss at every position of a window
(the measurement behind the notebook's curves)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..positions import RotaryEmbedding, rope_inv_freq, scaled_inv_freq
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_ntk_inv_freq", "check_yarn_inv_freq", "check_yarn_paper", "check_loss_per_position"]


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
        raise ExerciseError(f"return two things, (new_inv_freq, mscale); got {type(got).__name__}")
    freq = require_tensor("yarn_paper(...)[0]", got[0], (8,)).double()
    mscale = got[1].item() if isinstance(got[1], torch.Tensor) else got[1]
    if not isinstance(mscale, (int, float)):
        raise ExerciseError(f"mscale should be a number, got {type(mscale).__name__}")
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
        raise ExerciseError("mscale = 1 leaves out YaRN's temperature: sqrt(1/t) = 0.1 ln s + 1")
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
