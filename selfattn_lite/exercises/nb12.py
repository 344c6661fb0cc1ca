"""Checkers for notebook 12: the NTK-aware factor a target length needs (predicted from where NTK-aware
breaks, checked against the package and against the tiny decoder run at that factor), YaRN's temperature
carried by the softmax scale when only part of each head is rotated (as DeepSeek-V3's inference code
does), a sliding-window evaluation at any length (and how much context the tiny decoder uses), and
Llama 3.1's scaling read back from the frequencies it produced."""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..models import DATA_DIR, load_text, load_tiny_decoder, split_text
from ..positions import RotaryEmbedding, apply_rotary, rope_inv_freq, scaled_inv_freq
from ..rope_scaling import llama3_inv_freq, yarn_attention_scaling
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_ntk_factor_for", "check_yarn_partial_attention", "check_sliding_window_loss",
           "check_read_llama3_scaling"]


def _number(name: str, x) -> float:
    """x as a Python float (a 0-d tensor is accepted), or ExerciseError."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ExerciseError(f"{name} should be one number, got {type(x).__name__}")
    return float(x)


# ----------------------------------------------------------------------------- 1. the NTK-aware factor a target needs

def _ntk_factor(d: int, base: float, L: int, T: int, mistake: str | None = None) -> float:
    """The smallest NTK-aware factor s whose first new angle comes at T or later (or a planted mistake).

    Pair i turns r_i = L theta_i / (2 pi) times within L; a pair with r_i < 1 saw angles up to L theta_i,
    and NTK-aware (b' = b s^(d/(d-2))) slows it by s^(2i/(d-2)), so it first meets a new angle at
    L s^(2i/(d-2)). The first such pair i* is the least slowed: s = (T / L)^((d - 2) / (2 i*)).
    """
    i = torch.arange(d // 2, dtype=torch.float64)
    theta = base ** (-2 * i / d)                                          # (d/2,)
    turns = L * theta / (1.0 if mistake == "no_2pi" else 2 * math.pi)
    slow = (turns < 1).nonzero().flatten().tolist()
    if not slow:
        return 1.0                                                        # every pair has seen every angle
    first = slow[0]
    if mistake == "nominal":
        return T / L
    if mistake == "pair_before":
        first -= 1
    if mistake == "pair_after":
        first = min(first + 1, d // 2 - 1)
    if mistake == "inverted":
        return (T / L) ** (2 * first / (d - 2))
    s = (T / L) ** ((d - 2) / (2 * first))
    return s ** (d / (d - 2)) if mistake == "base_ratio" else s


def _ntk_first_new_angle(d: int, base: float, L: int, s: float) -> float:
    """With the package's NTK-aware frequencies at factor s: the first position where a pair under one
    turn in L reaches an angle beyond L theta_i (inf when no pair is under one turn)."""
    theta = rope_inv_freq(d, base).double()
    slowed = scaled_inv_freq(d, base, {"kind": "ntk", "factor": s})[0].double()
    under_one_turn = L * theta / (2 * math.pi) < 1
    return (L * theta / slowed)[under_one_turn].min().item() if under_one_turn.any() else math.inf


_NTK_FACTOR_MISTAKES = {
    "nominal": "T / L is the extension ratio, and NTK-aware slows only its slowest pair by the full factor; "
               "the first pair that turns less than once in L is slowed by s^(2i/(d−2)) only, so it meets new "
               "angles long before T: solve s^(2i/(d−2)) = T / L for that pair",
    "pair_before": "that pair turns at least once within L: it has seen every angle and never meets a new one. "
                   "Use the first pair with L θ_i / (2π) < 1",
    "pair_after": "that is the second pair under one turn; the first of them (the fastest, so the least slowed) "
                  "meets new angles first",
    "no_2pi": "a pair turns r_i = L θ_i / (2π) times within L (its wavelength is 2π / θ_i): without the 2π you "
              "picked the wrong pair",
    "inverted": "upside down: pair i is slowed by s^(2i/(d−2)); setting that to T / L gives "
                "s = (T / L)^((d−2) / (2i))",
    "base_ratio": "that is b' / b = s^(d/(d−2)), how much the base grows; return the factor s itself",
}


def _held_out_windows(tokenizer, length: int) -> torch.Tensor:
    """(n, length + 1) consecutive windows from the start of the held-out text, as many as fit."""
    ids = tokenizer.encode(split_text(load_text())[1])
    n = len(ids) // (length + 1)
    return ids[: n * (length + 1)].reshape(n, length + 1)


@torch.no_grad()
def _ntk_run(factor: float) -> dict:
    """The tiny decoder with NTK-aware at ``factor``, on every held-out window of 2048, against the saved
    run of NTK-aware at s = 4 (the notebook's): paired over the windows, bucket by bucket (256 positions)."""
    results = json.loads((DATA_DIR / "context_eval.json").read_text())
    T, L, size = results["target_len"], results["trained_len"], results["bucket"]
    model = load_tiny_decoder(rope_scaling={"kind": "ntk", "factor": factor}, max_len=T)
    windows = _held_out_windows(model.tokenizer, T)                       # (n, T + 1)
    assert len(windows) == results["n_windows"]
    rows = []
    for window in windows:                                                # one window at a time: small memory
        logits = model(window[None, :-1]).double()                        # (1, T, V)
        rows.append(-logits.log_softmax(-1).gather(-1, window[None, 1:, None])[0, :, 0])
    buckets = torch.stack(rows).reshape(len(windows), T // size, size).mean(-1)   # (n, 8)
    saved = torch.tensor(results["loss"]["ntk"]["per_window_bucket"], dtype=torch.float64)   # (n, 8), s = 4
    inside, after, before = L // size, slice(1280 // size, None), slice(L // size, 1024 // size)

    def paired(x):
        return dict(mean=x.mean().item(), sd=x.std().item(), diffs=x)

    return dict(n=len(windows),
                rise=paired(buckets[:, after].mean(-1) - buckets[:, before].mean(-1)),
                rise_at_4=paired(saved[:, after].mean(-1) - saved[:, before].mean(-1)),
                rise_change=paired(buckets[:, after].mean(-1) - buckets[:, before].mean(-1)
                                   - saved[:, after].mean(-1) + saved[:, before].mean(-1)),   # this rise - s = 4's
                inside_cost=paired(buckets[:, :inside].mean(-1) - saved[:, :inside].mean(-1)),
                past=paired(buckets[:, inside:].mean(-1) - saved[:, inside:].mean(-1)))


def check_ntk_factor_for(fn) -> None:
    """``fn(head_dim, base, trained_len, target_len) -> s``: the smallest NTK-aware factor whose first new
    angle comes at target_len or later.

    Checked on heads the notebook never printed (one with no pair under one turn, one where only the slowest
    pair is), against the package's NTK-aware frequencies at the returned factor (their first new angle is
    target_len; a factor 0.1% smaller breaks before it), then measured: the tiny decoder run at that factor
    on every held-out window at 2048, against the saved run at s = 4.
    """
    cases = ((16, 10000.0, 512, 2048), (128, 10000.0, 4096, 32768), (64, 10000.0, 1000, 3000),
             (96, 500000.0, 8192, 65536), (16, 10000.0, 8192, 32768), (8, 100.0, 512, 2048))
    for k, (d, base, L, T) in enumerate(cases):
        try:
            got = attempt(fn, d, base, L, T)
        except NotAttempted:
            return not_attempted("ntk_factor_for")
        got = _number(f"ntk_factor_for({d}, {base:g}, {L}, {T})", got)
        want = _ntk_factor(d, base, L, T)
        if math.isclose(got, want, rel_tol=1e-4):
            if want > 1:                                                  # against the package's frequencies
                assert math.isclose(_ntk_first_new_angle(d, base, L, got), T, rel_tol=1e-4)
                assert _ntk_first_new_angle(d, base, L, got * (1 - 1e-3)) < T
            continue
        if want == 1.0:
            raise ExerciseError(f"no pair of this head (d = {d}, base = {base:g}) turns less than once in L = {L}: "
                                "every pair has seen every angle, so no factor is needed; return 1.0")
        for name, message in _NTK_FACTOR_MISTAKES.items():
            wrong = _ntk_factor(d, base, L, T, name)
            if not math.isclose(wrong, want, rel_tol=1e-4) and math.isclose(got, wrong, rel_tol=1e-4):
                raise ExerciseError(message)
        if k > 0:
            raise ExerciseError(f"right for the tiny decoder but not for d = {d}, base = {base:g}, L = {L}, "
                                f"T = {T} (expected {want:.4f}, got {got:.4f}): use the arguments")
        raise ExerciseError(f"expected {want:.4f} for the tiny decoder (d = 16, L = 512, T = 2048), got {got:.4f}: "
                            "find the first pair with L θ_i / (2π) < 1 and solve s^(2i/(d−2)) = T / L")
    factor = _ntk_factor(*cases[0])
    run = _ntk_run(factor)
    rise, rise4, cost, past = run["rise"], run["rise_at_4"], run["inside_cost"], run["past"]
    change = run["rise_change"]
    bears_out = (rise4["mean"] > rise4["sd"] and abs(rise["mean"]) < rise["sd"]      # no rise shown at this factor
                 and change["diffs"].max() < 0 and abs(change["mean"]) > change["sd"]   # smaller than s = 4's, paired
                 and past["diffs"].max() < 0 and cost["diffs"].min() > 0)         # lower past 512, dearer inside
    if not bears_out:                                    # the saved run and the model no longer agree
        raise ExerciseError("the measurement does not bear the prediction out: at this factor the loss after 1280 "
                            "should rise less than at s = 4, on every window")
    return passed(f"NTK-aware needs s = {factor:.2f} to reach 2048 on the tiny decoder without a new angle (a Llama "
                  f"2-like head: {_ntk_factor(*cases[1]):.1f} for 8 times its 4096), not T / L. Measured on all "
                  f"{run['n']} held-out windows at s = {factor:.2f}, against s = 4: the loss from 1280 on minus "
                  f"512-1024 is {rise['mean']:+.2f} ± {rise['sd']:.2f}, no rise shown (at s = 4: "
                  f"{rise4['mean']:+.2f} ± {rise4['sd']:.2f}, ranked); paired, window by window, this rise minus the "
                  f"one at s = 4 is {change['mean']:+.2f} ± {change['sd']:.2f}, ranked and below 0 on every window: "
                  f"the rise is smaller, and what is left of it is not shown; past 512 it is lower on every window (by "
                  f"{-past['mean']:.2f} nats on average), and the price is paid inside 512: higher on every window "
                  f"(by {cost['mean']:.2f} nats on average)")


# ----------------------------------------------------------------------------- 2. YaRN's temperature, softmax scale

def _yarn_partial(q, k, v, positions, rope_dim: int, s: float, L: int, mistake: str | None = None):
    """Causal attention with the last ``rope_dim`` features of q, k rotated at YaRN's frequencies (cos and sin
    not scaled) and every score sharpened by 1/t = (0.1 ln s + 1)^2: softmax(q k^T (1/t) / sqrt(d)) v."""
    d = q.shape[-1]
    scaling = {"kind": "yarn", "factor": s, "original_max_len": L}
    width = d if mistake == "whole_head" else rope_dim
    rope = RotaryEmbedding(width, scaling=None if mistake == "plain_freq" else scaling)
    if mistake in ("cos_sin", "both"):
        cos, sin = rope.angles(positions, torch.float64)                  # cos, sin times sqrt(1/t)
    else:
        angles = positions[:, None].double() * rope.inv_freq.double()    # (T, width / 2)
        cos, sin = angles.cos(), angles.sin()

    def rotate(x):                                                        # (B, h, T, d)
        if mistake == "first_features":
            return torch.cat([apply_rotary(x[..., :width], cos, sin), x[..., width:]], dim=-1)
        return torch.cat([x[..., : d - width], apply_rotary(x[..., d - width:], cos, sin)], dim=-1)

    mscale = yarn_attention_scaling(s)                                    # sqrt(1/t)
    scale = {"cos_sin": 1 / math.sqrt(d), "no_temperature": 1 / math.sqrt(d), "mscale_once": mscale / math.sqrt(d),
             "no_sqrt_d": mscale ** 2, "sqrt_rope_dim": mscale ** 2 / math.sqrt(rope_dim)}.get(
        mistake, mscale ** 2 / math.sqrt(d))
    out, _ = scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=mistake != "not_causal", scale=scale)
    return out                                                            # (B, h, T, d_v)


_YARN_PARTIAL_MISTAKES = {
    "cos_sin": "only the rotated features were sharpened: cos and sin times sqrt(1/t) scale the rotated part of q·k "
               "by 1/t and leave the other features' part as it was. Rotate with plain cos and sin and put 1/t into "
               "the softmax scale",
    "both": "the temperature is applied twice: with cos and sin already multiplied by sqrt(1/t) (RotaryEmbedding's "
            "tables), the rotated part gets 1/t twice. Rotate with plain cos and sin",
    "no_temperature": "no temperature: every score should be multiplied by 1/t = (0.1 ln s + 1)^2",
    "mscale_once": "the scores get 1/t = (0.1 ln s + 1)^2, the square of the factor on cos and sin (q and k each "
                   "carried one): scale = (0.1 ln s + 1)^2 / sqrt(d)",
    "no_sqrt_d": "the scale replaces SDPA's default 1/sqrt(d): keep it, scale = (0.1 ln s + 1)^2 / sqrt(d)",
    "sqrt_rope_dim": "the 1/sqrt(d) is over the whole head's d features, not over rope_dim",
    "first_features": "rotate the last rope_dim features (the first d − rope_dim carry no position)",
    "plain_freq": "the rotation uses YaRN's frequencies for a rope_dim-wide rotation "
                  "(RotaryEmbedding(rope_dim, scaling=...).inv_freq), not plain RoPE's",
    "whole_head": "only the last rope_dim features are rotated, with a rope_dim-wide rotation's frequencies; the "
                  "first d − rope_dim stay as they are",
    "not_causal": "the attention is causal: each query attends to itself and the keys before it",
}


def check_yarn_partial_attention(fn) -> None:
    """``fn(q, k, v, positions, rope_dim, factor, original_max_len) -> (B, h, T, d_v)``.

    The last rope_dim features of q and k rotated at YaRN's frequencies (``apply_rotary``, cos and sin
    not scaled), the first d − rope_dim left alone, and causal attention whose every score q·k/sqrt(d)
    is multiplied by YaRN's 1/t = (0.1 ln s + 1)^2, as DeepSeek-V3's inference code folds it into the
    softmax scale. Checked against explicit attention (float64) on heads of awkward widths and positions,
    and, with rope_dim = d, against ``RotaryEmbedding``'s YaRN followed by torch's SDPA.
    """
    gen = torch.Generator().manual_seed(12)
    cases = ((2, 3, 19, 24, 8, 10, torch.arange(19) * 181, 8.0, 512),   # B, h, T, d, rope_dim, d_v, positions, s, L
             (1, 2, 13, 40, 16, 7, 700 + torch.arange(13), 3.0, 100),
             (1, 2, 11, 16, 16, 16, torch.arange(11) * 300, 4.0, 512))
    for B, h, T, d, rope_dim, dv, positions, s, L in cases:
        q, k, v = (torch.randn(B, h, T, n, generator=gen, dtype=torch.float64) for n in (d, d, dv))
        try:
            got = attempt(fn, q.clone(), k.clone(), v.clone(), positions.clone(), rope_dim, s, L)
        except NotAttempted:
            return not_attempted("yarn_partial_attention")
        got = require_tensor(f"yarn_partial_attention for q {tuple(q.shape)}, v {tuple(v.shape)}", got,
                             (B, h, T, dv)).double()
        want = _yarn_partial(q, k, v, positions, rope_dim, s, L)
        if close(got, want, atol=1e-4, rtol=1e-4):
            continue
        for name, message in _YARN_PARTIAL_MISTAKES.items():
            wrong = _yarn_partial(q, k, v, positions, rope_dim, s, L, name)
            if not close(wrong, want, atol=1e-4, rtol=1e-4) and close(got, wrong, atol=1e-4, rtol=1e-4):
                raise ExerciseError(message)
        worst = (got - want).abs().max().item()
        raise ExerciseError(f"differs from the expected attention by up to {worst:.3g} (d = {d}, rope_dim = "
                            f"{rope_dim}, s = {s:g}): rotate the last rope_dim features of q and k with plain cos "
                            "and sin of YaRN's angles, and pass scale = (0.1 ln s + 1)^2 / sqrt(d)")
    B, h, T, d, rope_dim, dv, positions, s, L = cases[-1]                 # rope_dim = d: the whole head rotated
    q, k, v = (torch.randn(B, h, T, d, generator=gen, dtype=torch.float64) for _ in range(3))
    rope = RotaryEmbedding(d, scaling={"kind": "yarn", "factor": s, "original_max_len": L})
    ours = F.scaled_dot_product_attention(rope(q, positions), rope(k, positions), v, is_causal=True)
    got = attempt(fn, q.clone(), k.clone(), v.clone(), positions.clone(), rope_dim, s, L)
    if not close(got, ours, atol=1e-4, rtol=1e-4):
        raise ExerciseError("with rope_dim = d your answer should equal RotaryEmbedding's YaRN (cos and sin times "
                            "sqrt(1/t)) followed by torch's SDPA, and it does not")
    return passed("YaRN's 1/t carried by the softmax scale, (0.1 ln s + 1)^2 / sqrt(d), with plain cos and sin on the "
                  "rotated features: every score sharpened, as DeepSeek-V3's inference code does; with the whole "
                  "head rotated it equals RotaryEmbedding's YaRN followed by torch's SDPA")


# ----------------------------------------------------------------------------- 3. a sliding window, at any length

def _tiny_model(vocab: int = 11):
    """A deterministic toy 'model' whose predictions depend on the token, on its position in what was read
    and on the first token read: reading a different stretch of the window changes every loss."""
    gen = torch.Generator().manual_seed(12)
    table, first, slope = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                           for shape in ((vocab, vocab), (vocab, vocab), (vocab,)))

    def model(ids):                                               # (n, T) -> (n, T, V)
        pos = torch.arange(ids.shape[1], dtype=torch.float64)[None, :, None]
        return table[ids] + 0.1 * pos * slope + 0.5 * first[ids[:, :1]]
    return model


def _losses(model, windows) -> torch.Tensor:
    """(n, T): -log p(windows[:, t + 1] | what the model read up to t)."""
    logits = model(windows[:, :-1]).double()                      # (n, T, V)
    return -logits.log_softmax(-1).gather(-1, windows[:, 1:, None])[..., 0]


def _sliding(model, windows, context: int, stride: int, mistake: str | None = None) -> torch.Tensor:
    """The sliding-window losses (n, T), written independently of ``context_eval``, or a planted mistake.

    Columns t < context: read from the start of the window. Then groups of ``stride`` columns (the last
    one may be shorter): a group ending at column end - 1 reads tokens end - context .. end - 1 only.
    """
    T = windows.shape[1] - 1
    if mistake == "whole":
        return _losses(model, windows)
    first = min(T, context)
    out = torch.empty(windows.shape[0], T, dtype=torch.float64)
    out[:, :first] = _losses(model, windows[:, :first + 1])
    step = 1 if mistake == "stride_one" else stride
    start = first
    while start < T:
        end = min(start + step, T)
        if mistake == "drop_tail" and end - start < step:
            out[:, start:] = _losses(model, windows[:, start:])          # the short last group read from its start
            break
        lo = end - context - (1 if mistake == "one_more" else 0)
        out[:, start:end] = _losses(model, windows[:, lo:end + 1])[:, -(end - start):]
        start = end
    return out


_SLIDING_CASES = ((13, 5, 3), (12, 4, 4), (3, 5, 2), (20, 6, 1), (17, 8, 5))     # (T, context, stride)

_SLIDING_MISTAKES = {
    "whole": "you read every target with the whole window before it: past `context`, each target may see at most "
             "`context` tokens, the last `context` before it",
    "one_more": "each group read context + 1 tokens: the group ending at column end - 1 reads windows[:, end - "
                "context:end + 1] (inputs end - context .. end - 1, targets one further)",
    "stride_one": "every target read from exactly `context` tokens (a stride of 1): read the targets in groups of "
                  "`stride`, each group from the `context` tokens that end at its last target",
    "drop_tail": "the last group, shorter than `stride`, is not read like the others: it too reads the `context` "
                 "tokens that end at its last target",
}


def _paired(a, b) -> dict:
    """a - b over windows: mean and sd (n - 1), and whether |mean| > sd (the notebook's ranking rule)."""
    d = (a - b).double()
    mean, sd = d.mean().item(), d.std().item()
    return {"mean": mean, "sd": sd, "ranked": abs(mean) > sd}


def _measure_context(fn) -> str:
    """The learner's function on the shipped unscaled decoder: past 512, context 128, 256, 512 and the whole window."""
    model = load_tiny_decoder(max_len=1024)
    ids = model.tokenizer.encode(split_text(load_text())[1])                   # (N,) the held-out tenth
    windows = ids[: 4 * 1025].reshape(4, 1025)                                 # 4 consecutive windows of 1024
    past = {c: fn(model, windows, c, c // 2)[:, 512:].mean(-1).double() for c in (128, 256, 512)}   # (4,) each
    whole = _losses(model, windows)[:, 512:].mean(-1)
    lines = [f"context {c}: {v.mean():.3f} ± {v.std():.3f}" for c, v in past.items()]
    steps = []
    for a, b in ((128, 256), (256, 512)):
        d = _paired(past[a], past[b])
        steps.append(f"{a} - {b}: {d['mean']:+.3f} ± {d['sd']:.3f} "
                     f"{'ranked' if d['ranked'] else 'indistinguishable here'}")
    d = _paired(past[512], whole)
    steps.append(f"512 - the whole window (up to 1024, past the trained length): {d['mean']:+.3f} ± {d['sd']:.3f} "
                 f"{'ranked' if d['ranked'] else 'indistinguishable here'}")
    return ("; the unscaled decoder's loss on the targets past 512 of 4 held-out windows of 1024, mean ± sd over "
            "the windows, by the context each target reads (stride context / 2): " + ", ".join(lines) +
            "; paired: " + "; ".join(steps))


def check_sliding_window_loss(fn, measure: bool = True) -> None:
    """``fn(model, windows, context, stride)`` must return the (n, T) sliding-window losses, for any T."""
    model = _tiny_model()
    gen = torch.Generator().manual_seed(2)
    for T, context, stride in _SLIDING_CASES:
        windows = torch.randint(0, 11, (2, T + 1), generator=gen)                # (n, T + 1)
        try:
            got = attempt(fn, model, windows.clone(), context, stride)
        except NotAttempted:
            return not_attempted("sliding_window_loss")
        except ValueError as e:
            raise ExerciseError(f"T = {T}, context = {context}, stride = {stride} raised ValueError ({e}): any T must "
                                "work, also when T - context is not a multiple of stride (the last group is "
                                "shorter) and when T <= context") from None
        got = require_tensor(f"sliding_window_loss(model, windows, {context}, {stride})", got, (2, T)).double()
        expected = _sliding(model, windows, context, stride)
        if close(got, expected):
            continue
        for mistake, message in _SLIDING_MISTAKES.items():
            if close(got, _sliding(model, windows, context, stride, mistake)):
                raise ExerciseError(f"T = {T}, context = {context}, stride = {stride}: {message}")
        if close(got[:, :min(T, context)], expected[:, :min(T, context)]):
            raise ExerciseError(f"T = {T}, context = {context}, stride = {stride}: the first `context` columns are "
                                "right, the ones after them are not: the group ending at column end - 1 reads "
                                "windows[:, end - context:end + 1] and keeps its last (group size) losses")
        raise ExerciseError(f"T = {T}, context = {context}, stride = {stride}: not the sliding-window losses. Column t "
                            "< context reads the window from its start; after that, each group of `stride` targets "
                            "reads the `context` tokens that end at its last target")
    extra = _measure_context(fn) if measure else ""
    return passed("every target read from at most `context` tokens, in groups of `stride`, at any T" + extra)


# ----------------------------------------------------------------------------- 4. Llama 3.1's scaling read back

_LLAMA3_CASES = ((128, 500000.0, 8192, 8.0, 1.0, 4.0),     # Llama 3.1's own: d, base, L, s, low, high
                 (64, 10000.0, 2048, 4.0, 2.0, 8.0),
                 (96, 1000000.0, 6000, 5.5, 1.5, 6.5))


def _llama3_case(d: int, base: float, L: int, s: float, low: float, high: float):
    """theta and the package's Llama 3.1 frequencies (float64), and the turns r_i = L theta_i / (2 pi)."""
    theta = rope_inv_freq(d, base).double()
    scaled = llama3_inv_freq(theta, s, L, low, high)
    return theta, scaled, L * theta / (2 * math.pi)


def _llama3_wrong(d, base, L, s, low, high) -> dict[str, tuple[float, float, float]]:
    """The answers the usual mistakes give."""
    theta, scaled, turns = _llama3_case(d, base, L, s, low, high)
    ratio = scaled / theta
    divided, kept = turns < low, turns > high
    return {
        "swapped": (s, high, low),
        "no_2pi": (s, 2 * math.pi * low, 2 * math.pi * high),
        "ratio_as_smooth": (s, low - (high - low) / (s - 1), high),   # smooth taken as theta' / theta
        "nearest_pairs": (s, turns[divided].max().item(), turns[kept].min().item()),
        "inverse_factor": (ratio.min().item(), low, high),               # 1 / s
    }


_LLAMA3_READ_MISTAKES = {
    "swapped": "low_freq_factor is the smaller one: pairs with fewer than low_freq_factor turns in L are divided "
               "by s, pairs with more than high_freq_factor turns are kept",
    "no_2pi": "the turns are r_i = L / λ_i = L θ_i / (2π): without the 2π both boundaries come out 2π times too large",
    "ratio_as_smooth": "smooth is not θ'/θ: the blend gives θ'/θ = (1 − smooth) / s + smooth, so "
                       "smooth = (θ'/θ − 1/s) / (1 − 1/s)",
    "nearest_pairs": "those are the turns of the nearest divided and kept pairs; the boundaries lie between pairs. "
                     "The blended pairs pin them exactly: smooth is linear in the turns, 0 at low_freq_factor and "
                     "1 at high_freq_factor",
    "inverse_factor": "that is 1/s: the divided pairs have θ' = θ / s, so s = θ / θ' there (s > 1)",
}


def check_read_llama3_scaling(fn) -> None:
    """``fn(inv_freq, scaled_inv_freq, original_max_len) -> (factor, low_freq_factor, high_freq_factor)``.

    The frequencies come from the package's ``llama3_inv_freq`` (float64) at Llama 3.1's own shape
    (d = 128, base 500000, L = 8192, s = 8, 1, 4) and at two whose parameters are not Llama 3.1's; each
    answer must match them and rebuild the given frequencies through the package.
    """
    for k, (d, base, L, s, low, high) in enumerate(_LLAMA3_CASES):
        theta, scaled, turns = _llama3_case(d, base, L, s, low, high)
        assert (turns < low).any() and ((turns > low) & (turns < high)).sum() >= 2   # identifiable
        try:
            got = attempt(fn, theta.clone(), scaled.clone(), L)
        except NotAttempted:
            return not_attempted("read_llama3_scaling")
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise ExerciseError(f"return three numbers, (factor, low_freq_factor, high_freq_factor); "
                                f"got {type(got).__name__}")
        got = tuple(_number(name, x) for name, x in zip(("factor", "low_freq_factor", "high_freq_factor"), got))
        want = (s, low, high)
        if all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want)):
            rebuilt = llama3_inv_freq(theta, got[0], L, got[1], got[2])        # through the package
            assert close(rebuilt, scaled, atol=0, rtol=1e-9)
            continue
        for name, wrong in _llama3_wrong(d, base, L, s, low, high).items():
            if all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, wrong)):
                raise ExerciseError(_LLAMA3_READ_MISTAKES[name])
        if any(math.isclose(got[j], L / b, rel_tol=1e-6) for j in (1, 2) for b in (low, high)):
            raise ExerciseError("that is a wavelength boundary, L / low_freq_factor or L / high_freq_factor; the "
                                "factors themselves are turns in L: r = L / λ")
        if k > 0 and all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, _LLAMA3_CASES[0][3:])):
            raise ExerciseError("those are Llama 3.1's own (8, 1, 4); read them from the frequencies you are given")
        try:
            rebuilt = llama3_inv_freq(theta, got[0], L, got[1], got[2])
        except ValueError as error:
            raise ExerciseError(f"the package refuses your (factor, low, high) = {got}: {error}") from None
        off = ((rebuilt - scaled).abs() / scaled).max().item()
        raise ExerciseError(f"for d = {d}, L = {L} you returned {tuple(round(g, 4) for g in got)}; rebuilt through the "
                            f"package they give frequencies up to {off:.2%} off the given ones. s = θ/θ' of a divided "
                            "pair; on the blended pairs smooth = (θ'/θ − 1/s) / (1 − 1/s) is linear in the turns "
                            "r = L θ / (2π), 0 at low_freq_factor and 1 at high_freq_factor")
    return passed("factor, low_freq_factor and high_freq_factor read back from the frequencies alone: s from a divided "
                  "pair, the boundaries from the blended pairs' smooth, linear in the turns L / λ; at Llama 3.1's "
                  "shape (8, 1, 4) and at two others, each rebuilding the given frequencies through the package")
