"""Notebook 12's checkers: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb12 as check
from selfattn_lite.positions import RotaryEmbedding, apply_rotary, rope_inv_freq, scaled_inv_freq
from selfattn_lite.rope_scaling import llama3_inv_freq


def stub(*args, **kwargs):
    raise NotImplementedError


def raises(checker, wrong, message):
    with pytest.raises(ExerciseError) as info:
        checker(wrong)
    assert message in str(info.value), str(info.value)


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ---------------------------------------------------------------- 1. the NTK-aware factor a target length needs
def ntk_factor(d, base, L, T, *, mistake=None):
    """Written as a learner would, pair by pair; or with one mistake."""
    slow = [i for i in range(d // 2)
            if L * base ** (-2 * i / d) / (1 if mistake == "no_2pi" else 2 * math.pi) < 1]
    if not slow:
        return 1.0 if mistake != "none_slow" else T / L
    i = slow[0] + {"pair_before": -1, "pair_after": 1}.get(mistake, 0)
    if mistake == "nominal":
        return T / L
    if mistake == "inverted":
        return (T / L) ** (2 * i / (d - 2))
    s = (T / L) ** ((d - 2) / (2 * i))
    return s ** (d / (d - 2)) if mistake == "base_ratio" else s


RIGHT["ntk_factor_for"] = check.check_ntk_factor_for, ntk_factor
RIGHT["ntk_factor_for_0d_tensor"] = (check.check_ntk_factor_for,
                                     lambda d, b, L, T: torch.tensor(ntk_factor(d, b, L, T), dtype=torch.float64))


@pytest.mark.parametrize("mistake, message", [
    ("nominal", "T / L is the extension ratio"),
    ("pair_before", "it has seen every angle"),
    ("pair_after", "the second pair under one turn"),
    ("no_2pi", "without the 2π you picked the wrong pair"),
    ("inverted", "upside down"),
    ("base_ratio", "how much the base grows"),
    ("none_slow", "no factor is needed; return 1.0"),
])
def test_ntk_factor_for_wrong(mistake, message):
    raises(check.check_ntk_factor_for, lambda d, b, L, T: ntk_factor(d, b, L, T, mistake=mistake), message)


@pytest.mark.parametrize("wrong, message", [
    (lambda d, b, L, T: ntk_factor(16, 10000.0, 512, 2048), "use the arguments"),
    (lambda d, b, L, T: 1.05 * ntk_factor(d, b, L, T), "expected 11.3137"),
    (lambda d, b, L, T: [ntk_factor(d, b, L, T)], "one number"),
])
def test_ntk_factor_for_wrong_kind(wrong, message):
    raises(check.check_ntk_factor_for, wrong, message)


def test_ntk_factor_against_the_package_and_the_yarn_papers_remark():
    """At the returned factor the package's NTK-aware frequencies first show a new angle at exactly T; the factor
    is larger than T / L (YaRN, Peng et al. 2023, sec. 3.1: s "has to be set higher than the expected scale"),
    equal to it only when the slowest pair alone turns less than once in L."""
    for d, base, L, T in ((16, 10000.0, 512, 2048), (128, 10000.0, 4096, 32768), (96, 500000.0, 8192, 65536)):
        s = ntk_factor(d, base, L, T)
        theta = rope_inv_freq(d, base).double()
        slowed = scaled_inv_freq(d, base, {"kind": "ntk", "factor": s})[0].double()
        under = L * theta / (2 * math.pi) < 1
        assert math.isclose((L * theta / slowed)[under].min().item(), T, rel_tol=1e-5)
        assert s > T / L
    assert math.isclose(ntk_factor(16, 10000.0, 8192, 32768), 4.0, rel_tol=1e-12)     # only pair 7 is slow
    assert math.isclose(ntk_factor(16, 10000.0, 512, 2048), 4 ** (14 / 8), rel_tol=1e-12)   # pair 4


def test_ntk_factor_measured_the_rise_shrinks_and_the_printed_digits_are_not_decided_by_rounding():
    run = check._ntk_run(check._ntk_factor(16, 10000.0, 512, 2048))
    assert run["rise_at_4"]["mean"] > run["rise_at_4"]["sd"]                        # s = 4: ranked rise
    assert abs(run["rise"]["mean"]) < run["rise"]["sd"]                             # its factor: none shown
    change = run["rise_change"]                                                     # paired: smaller than s = 4's
    torch.testing.assert_close(change["diffs"], run["rise"]["diffs"] - run["rise_at_4"]["diffs"])
    assert change["diffs"].max() < 0 and abs(change["mean"]) > change["sd"]
    assert run["past"]["diffs"].max() < 0 < run["inside_cost"]["diffs"].min()
    for x in (run["rise"]["mean"], run["rise"]["sd"], run["past"]["mean"], run["inside_cost"]["mean"],
              change["mean"], change["sd"]):
        assert abs(x * 100 - math.floor(x * 100) - 0.5) > 0.02                       # >= 2e-4 from a rounding edge


# ---------------------------------------------------------------- 2. YaRN's temperature in the softmax scale
def yarn_partial(q, k, v, positions, rope_dim, s, L, *, mistake=None):
    """Written as a learner would (float32 angles, torch's SDPA); or with one mistake."""
    d = q.shape[-1]
    rope = RotaryEmbedding(rope_dim, scaling={"kind": "yarn", "factor": s, "original_max_len": L})
    if mistake == "cos_sin":
        q_rot = torch.cat([q[..., :d - rope_dim], rope(q[..., d - rope_dim:], positions)], -1)
        k_rot = torch.cat([k[..., :d - rope_dim], rope(k[..., d - rope_dim:], positions)], -1)
        return F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True)
    angles = positions[:, None] * rope.inv_freq
    cos, sin = angles.cos(), angles.sin()

    def rotate(x):
        if mistake == "first_features":
            return torch.cat([apply_rotary(x[..., :rope_dim], cos, sin), x[..., rope_dim:]], -1)
        return torch.cat([x[..., :d - rope_dim], apply_rotary(x[..., d - rope_dim:], cos, sin)], -1)

    m = rope.attention_scaling
    scale = {"mscale_once": m / math.sqrt(d), "no_sqrt_d": m ** 2, "none": 1 / math.sqrt(d),
             "sqrt_rope_dim": m ** 2 / math.sqrt(rope_dim)}.get(mistake, m ** 2 / math.sqrt(d))
    return F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=mistake != "not_causal", scale=scale)


RIGHT["yarn_partial_attention"] = check.check_yarn_partial_attention, yarn_partial


@pytest.mark.parametrize("mistake, message", [
    ("cos_sin", "only the rotated features were sharpened"),
    ("mscale_once", "the square of the factor on cos and sin"),
    ("no_sqrt_d", "keep it, scale ="),
    ("none", "no temperature"),
    ("sqrt_rope_dim", "not over rope_dim"),
    ("first_features", "rotate the last rope_dim features"),
    ("not_causal", "the attention is causal"),
])
def test_yarn_partial_attention_wrong(mistake, message):
    raises(check.check_yarn_partial_attention, lambda *a: yarn_partial(*a, mistake=mistake), message)


def test_yarn_partial_attention_other_mistakes():
    def both(q, k, v, positions, rope_dim, s, L):               # RotaryEmbedding's tables and the scale too
        d = q.shape[-1]
        rope = RotaryEmbedding(rope_dim, scaling={"kind": "yarn", "factor": s, "original_max_len": L})
        q_rot = torch.cat([q[..., :d - rope_dim], rope(q[..., d - rope_dim:], positions)], -1)
        k_rot = torch.cat([k[..., :d - rope_dim], rope(k[..., d - rope_dim:], positions)], -1)
        return F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True,
                                              scale=rope.attention_scaling ** 2 / math.sqrt(d))

    def plain_freq(q, k, v, positions, rope_dim, s, L):
        d = q.shape[-1]
        rope = RotaryEmbedding(rope_dim)
        q_rot = torch.cat([q[..., :d - rope_dim], rope(q[..., d - rope_dim:], positions)], -1)
        k_rot = torch.cat([k[..., :d - rope_dim], rope(k[..., d - rope_dim:], positions)], -1)
        m = 0.1 * math.log(s) + 1
        return F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True, scale=m ** 2 / math.sqrt(d))

    raises(check.check_yarn_partial_attention, both, "the temperature is applied twice")
    raises(check.check_yarn_partial_attention, plain_freq, "not plain RoPE's")
    raises(check.check_yarn_partial_attention, lambda *a: yarn_partial(*a) * 1.01, "differs from the expected")
    raises(check.check_yarn_partial_attention, lambda *a: yarn_partial(*a)[..., :-1], "should have shape")


def test_yarn_partial_matches_deepseek_v3s_fold():
    """DeepSeek-V3's inference/model.py: softmax_scale = qk_head_dim ** -0.5 * mscale ** 2 with
    mscale = 0.1 * 1.0 * ln(rope_factor) + 1; the rope part rotated with unscaled cos and sin (torch.polar(ones, ...))."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 9, 192, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 9, 128, generator=gen, dtype=torch.float64)
    positions = torch.arange(9) * 5000
    ours = check._yarn_partial(q, k, v, positions, 64, 40.0, 4096)
    rope = RotaryEmbedding(64, scaling={"kind": "yarn", "factor": 40.0, "original_max_len": 4096})
    angles = positions[:, None].double() * rope.inv_freq.double()
    rot = lambda x: torch.cat([x[..., :128], apply_rotary(x[..., 128:], angles.cos(), angles.sin())], -1)  # noqa: E731
    scores = rot(q) @ rot(k).transpose(-1, -2) * 192 ** -0.5 * (0.1 * math.log(40.0) + 1) ** 2
    scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(ours, scores.softmax(-1) @ v)


# ---------------------------------------------------------------- 3. a sliding window, at any length
def lpp(model, windows):
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")


def sliding(model, windows, context, stride, *, mistake=None):
    """Written as a learner would: the first `context` columns from the start, then groups of `stride`."""
    T = windows.shape[1] - 1
    if mistake == "whole":
        return lpp(model, windows)
    out = [lpp(model, windows[:, :min(T, context) + 1])]
    for start in range(context, T, 1 if mistake == "stride_one" else stride):
        end = min(start + (1 if mistake == "stride_one" else stride), T)
        lo = end - context - (1 if mistake == "one_more" else 0)
        if mistake == "from_group_start":
            lo = max(start - context + 1, 0)
        if mistake == "short_tail_from_start" and end - start < stride:
            out.append(lpp(model, windows[:, start:end + 1]))
            continue
        out.append(lpp(model, windows[:, lo:end + 1])[:, -(end - start):])
    got = torch.cat(out, dim=1)
    return got + 0.1 if mistake == "offset" else got


def package_wrap(model, windows, context, stride):
    """Only what the package does: it needs T - context to be a multiple of stride."""
    from selfattn_lite.course import context_eval
    first = context_eval.loss_per_position(model, windows[:, :context + 1])
    return torch.cat([first, context_eval.loss_with_context_cut(model, windows, context, stride)], dim=1)


RIGHT["sliding_window_loss"] = (lambda fn: check.check_sliding_window_loss(fn, measure=False)), sliding


@pytest.mark.parametrize("mistake, message", [
    ("whole", "whole window"),
    ("one_more", "context \\+ 1 tokens"),
    ("stride_one", "a stride of 1"),
    ("short_tail_from_start", "the last group"),
    ("from_group_start", "the first `context` columns are right"),
    ("offset", "not the sliding-window losses"),
])
def test_sliding_window_loss_wrong(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_sliding_window_loss(lambda m, w, c, s: sliding(m, w, c, s, mistake=mistake), measure=False)


def test_sliding_window_loss_refuses_the_package_where_it_cannot_go():
    with pytest.raises(ExerciseError, match="any T must work"):
        check.check_sliding_window_loss(package_wrap, measure=False)
    with pytest.raises(ExerciseError, match="shape"):
        check.check_sliding_window_loss(lambda m, w, c, s: sliding(m, w, c, s)[:, 1:], measure=False)


def test_sliding_window_loss_agrees_with_the_package_where_both_apply():
    model = check._tiny_model()
    windows = torch.randint(0, 11, (2, 21), generator=torch.Generator().manual_seed(0))
    from selfattn_lite.course import context_eval
    torch.testing.assert_close(sliding(model, windows, 5, 3)[:, 5:], context_eval.loss_with_context_cut(model, windows, 5, 3))
    torch.testing.assert_close(check._sliding(model, windows, 5, 3), sliding(model, windows, 5, 3).double())


def test_sliding_window_loss_measures_the_shipped_decoder(capsys):
    check.check_sliding_window_loss(sliding)
    out = capsys.readouterr().out
    assert out.startswith("Correct:") and "context 128" in out and "512 - the whole window" in out


# ---------------------------------------------------------------- 4. Llama 3.1's scaling read back
def read_llama3(theta, scaled, L, *, mistake=None):
    """Written as a learner would: s from the divided pairs, the boundaries from two blended pairs."""
    ratio = scaled / theta
    s = 1 / ratio.min().item()
    blended = (ratio > (1 + 1e-9) / s) & (ratio < 1 - 1e-9)
    turns = L * theta / (1 if mistake == "no_2pi" else 2 * math.pi)
    smooth = ratio if mistake == "ratio_as_smooth" else (ratio - 1 / s) / (1 - 1 / s)
    x = (L * 2 * math.pi / theta) if mistake == "wavelength" else turns
    (x0, x1), (y0, y1) = x[blended][[0, -1]].tolist(), smooth[blended][[0, -1]].tolist()
    slope = (y1 - y0) / (x1 - x0)
    low, high = x0 - y0 / slope, x0 + (1 - y0) / slope
    if mistake == "wavelength":
        low, high = high, low
    if mistake == "swapped":
        low, high = high, low
    if mistake == "nearest_pairs":
        low, high = turns[ratio <= (1 + 1e-9) / s].max().item(), turns[ratio >= 1 - 1e-9].min().item()
    if mistake == "inverse_factor":
        s = 1 / s
    return s, low, high


RIGHT["read_llama3_scaling"] = check.check_read_llama3_scaling, read_llama3


@pytest.mark.parametrize("mistake, message", [
    ("swapped", "low_freq_factor is the smaller one"),
    ("no_2pi", "without the 2π"),
    ("ratio_as_smooth", "smooth is not θ'/θ"),
    ("nearest_pairs", "the boundaries lie between pairs"),
    ("inverse_factor", "that is 1/s"),
    ("wavelength", "rebuilt through the package"),
])
def test_read_llama3_scaling_wrong(mistake, message):
    raises(check.check_read_llama3_scaling, lambda th, sc, L: read_llama3(th, sc, L, mistake=mistake), message)


@pytest.mark.parametrize("wrong, message", [
    (lambda th, sc, L: (8.0, 1.0, 4.0), "read them from the frequencies"),
    (lambda th, sc, L: (read_llama3(th, sc, L)[0], L / 1.0, L / 4.0) if len(th) == 64 else read_llama3(th, sc, L),
     "wavelength boundary"),
    (lambda th, sc, L: read_llama3(th, sc, L)[:2], "return three numbers"),
    (lambda th, sc, L: (read_llama3(th, sc, L)[0], "1", 4.0), "should be one number"),
])
def test_read_llama3_scaling_wrong_kind(wrong, message):
    raises(check.check_read_llama3_scaling, wrong, message)


def test_read_llama3_inverts_the_package_at_llama_3_1s_shape():
    theta = rope_inv_freq(128, 500000.0).double()
    scaled = llama3_inv_freq(theta, 8.0, 8192, 1.0, 4.0)
    assert all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(read_llama3(theta, scaled, 8192), (8.0, 1.0, 4.0)))


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
