"""Every reading notebook 16 makes of the shipped recall runs, recomputed from the records with its own arithmetic.

The floor is recounted here from the evaluation rows (each row's most frequent value, by plain Python), not taken
from ``recall.no_recall_floor``; the rankings use the same rule as the notebook (a's worst seed beats b's best seed
by more than 0.02) written out again; the distance readings re-evaluate the shipped models on rows of seeds the
notebook does not use, with the retention exp(g_{p+1} + ... + g_t) summed query by query.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from selfattn_lite.recall import IGNORE_INDEX, mqar, value_range
from selfattn_lite.recall_models import load_recall_model, recall_runs

PAIRS = ["4", "8", "12", "16"]
MAIN = ["attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid"]
FIXED = ["linear", "delta", "gated_delta", "s6"]
RUNS = {r["run"]: r for r in recall_runs()}
MARGIN, GAP = 0.05, 0.02


def acc(run: str, p: str) -> float:
    return RUNS[run]["accuracy"][p]


def seeds(group: str) -> list[str]:
    return [f"{group}_s{s}" for s in range(3)]


def mode_share(rows: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """(mean over queries of the chance that the row's most frequent pair value is the answer, same for the
    strategy that strikes the values already asked), counted query by query."""
    total = struck = 0.0
    count = 0
    for row, target in zip(rows.tolist(), targets.tolist()):
        asked = [t for t, y in enumerate(target) if y != IGNORE_INDEX]
        values = row[1:2 * len(asked):2]
        top = max(values.count(x) for x in values)
        modes = {x for x in values if values.count(x) == top}
        left = list(values)
        for t in asked:
            total += (target[t] in modes) / len(modes)
            best = max(left.count(x) for x in left)
            tied = {x for x in left if left.count(x) == best}
            struck += (target[t] in tied) / len(tied)
            left.remove(target[t])
            count += 1
    return total / count, struck / count


def evaluation_floor() -> dict[str, float]:
    gen = torch.Generator().manual_seed(RUNS["attention_s0"]["eval"]["seed"])
    out = {}
    for p in PAIRS:
        rows, targets = mqar(RUNS["attention_s0"]["eval"]["rows"], 64, int(p), 64, generator=gen)
        out[p] = mode_share(rows, targets)[0]
    return out


FLOOR = evaluation_floor()


def test_the_records_share_one_evaluation():
    for r in RUNS.values():
        assert r["eval"] == {"seed": 12345, "rows": 512, "pairs": [4, 8, 12, 16]}
        assert r["config"]["vocab_size"] == 64 and r["recipe"]["seq_len"] == 64


def test_the_floor_is_near_the_stated_values_and_falls():
    expected = {"4": 0.295, "8": 0.208, "12": 0.174, "16": 0.150}          # the notebook's exact values
    for p in PAIRS:
        assert abs(FLOOR[p] - expected[p]) < 0.01, (p, FLOOR[p])
    assert FLOOR["4"] > FLOOR["8"] > FLOOR["12"] > FLOOR["16"]


def test_seeds_above_the_floor_at_every_number_of_pairs():
    counted = {m: sum(all(acc(run, p) - FLOOR[p] > MARGIN for p in PAIRS) for run in seeds(m)) for m in MAIN}
    assert counted == {"attention": 3, "window": 0, "linear": 2, "delta": 1, "gated_delta": 3, "s6": 0, "hybrid": 3}
    assert all(acc(run, p) - FLOOR[p] > 0.65 for m in ("attention", "hybrid") for run in seeds(m) for p in PAIRS)
    assert all(acc("delta_s1", p) < FLOOR[p] for p in PAIRS)                  # "below it everywhere"
    assert all(acc("s6_s1", p) - FLOOR[p] > MARGIN for p in PAIRS[:3])         # s6_s1 above it up to 12 pairs
    assert all(acc("linear_s1", p) - FLOOR[p] <= MARGIN for p in ("8", "12", "16"))  # on it from 8 pairs on


def test_the_short_windows_guess_among_the_values():
    m = len(value_range(64))
    for run in seeds("window"):
        for p in PAIRS:
            assert acc(run, p) < FLOOR[p] and abs(acc(run, p) - 1 / m) < 0.01


def verdict(a: str, b: str, p: str) -> str:
    lo_a, hi_a = min(acc(r, p) for r in seeds(a)), max(acc(r, p) for r in seeds(a))
    lo_b, hi_b = min(acc(r, p) for r in seeds(b)), max(acc(r, p) for r in seeds(b))
    return ">" if lo_a - hi_b > GAP else "<" if lo_b - hi_a > GAP else "~"


def test_rankings_pair_by_pair():
    ranked = {(a, b, p) for a, b in itertools.permutations(MAIN, 2) for p in PAIRS if verdict(a, b, p) == ">"}
    for p in PAIRS:
        for top in ("attention", "hybrid"):
            assert all((top, m, p) in ranked for m in FIXED + ["window"])
        assert verdict("attention", "hybrid", p) == "~"
        assert all((m, "window", p) in ranked for m in FIXED)
    among = sorted((a, b, p) for a, b, p in ranked if a in FIXED and b in FIXED)
    assert among == [("gated_delta", "delta", "4"), ("gated_delta", "s6", "12"), ("gated_delta", "s6", "16")]
    # the prose: at 8 pairs the two delta rules' brackets are disjoint, by less than the gap
    assert 0 < min(acc(r, "8") for r in seeds("gated_delta")) - max(acc(r, "8") for r in seeds("delta")) < GAP


def test_state_size_readings():
    def group(name):
        return [[acc(f"{name}_s{s}", p) for p in PAIRS] for s in range(3)]
    s6_n4, linear_h8 = group("s6_n4"), group("linear_h8")
    assert all(row[i] < FLOOR[p] for row in s6_n4 for i, p in ((2, "12"), (3, "16")))
    assert all(linear_h8[s][2] - FLOOR["12"] > 0.1 for s in (0, 2)) and linear_h8[1][2] - FLOOR["12"] < 0.1
    h1, h8 = group("delta_h1"), group("delta_h8")
    assert not min(r[3] for r in h1) - max(r[3] for r in h8) > GAP
    assert sum(r[3] - FLOOR["16"] <= MARGIN for r in h1) == 2
    for name in ("linear_h8", "linear", "delta_h8", "delta", "delta_h1", "s6_n4", "s6"):
        assert min(r[3] for r in group(name)) - FLOOR["16"] <= MARGIN, name


def no_recall_loss(n: int, m: int = 32) -> float:
    """E[log(n / c)], c = 1 + Binomial(n - 1, 1/m), summed term by term."""
    return sum(math.comb(n - 1, b) * m ** -b * (1 - 1 / m) ** (n - 1 - b) * math.log(n / (1 + b)) for b in range(n))


def test_loss_readings():
    below = set()
    for name, r in RUNS.items():
        if name.split("_s")[0] not in MAIN:
            continue
        last = {}
        for point in r["losses"]:                              # step s trained on train_pairs[(s - 1) % 4]
            last[r["recipe"]["train_pairs"][(point["step"] - 1) % 4]] = point["loss"]
        if all(last[n] < no_recall_loss(n) for n in (4, 8, 12, 16)):
            below.add(name)
    assert below == {*seeds("attention"), *seeds("hybrid"), "linear_s0", "linear_s2", "gated_delta_s0",
                     "gated_delta_s1"}
    assert all(pt["loss"] > math.log(32) - 0.05 for run in seeds("window") for pt in RUNS[run]["losses"])
    others = [r for name, r in RUNS.items() if name.split("_s")[0] in MAIN and not name.startswith("window")]
    for r in others:                                           # every other run ends below ln 32, every pair count
        for i, n in enumerate(r["recipe"]["train_pairs"]):
            last = [pt["loss"] for pt in r["losses"] if (pt["step"] - 1) % 4 == i][-1]
            assert last < math.log(32) - 0.05, (r["run"], n)


# --- live readings on rows of other seeds -------------------------------------------------------------------

def fresh_rows(seed: int, rows: int):
    inputs, targets = mqar(rows, 64, 8, 64, generator=torch.Generator().manual_seed(seed))
    queries = []                                                   # (row, t, p): query t asks the value at p
    for b, t in (targets != IGNORE_INDEX).nonzero().tolist():
        p = inputs[b].tolist().index(inputs[b, t].item()) + 1
        queries.append((b, t, p))
    return inputs, targets, queries


def floor_of(inputs, targets, queries):
    """The most-frequent-value strategy's chance, per query."""
    out = {}
    for b, t, _ in queries:
        n = int((targets[b] != IGNORE_INDEX).sum())
        values = inputs[b, 1:2 * n:2].tolist()
        top = max(values.count(x) for x in values)
        modes = {x for x in values if values.count(x) == top}
        out[b, t] = (targets[b, t].item() in modes) / len(modes)
    return out


BINS = [(1, 8), (8, 16), (16, 32), (32, 64)]


def by_bin(values: dict, queries) -> list[float]:
    means = []
    for lo, hi in BINS:
        chosen = [values[b, t] for b, t, p in queries if lo <= t - p < hi]
        means.append(sum(chosen) / len(chosen))
    return means


@pytest.mark.slow
def test_windows_beyond_their_span_sit_below_the_floor():
    inputs, targets, queries = fresh_rows(31, 160)
    floor = by_bin(floor_of(inputs, targets, queries), queries)
    for name in seeds("window") + seeds("window_w32"):
        with torch.no_grad():
            guess = load_recall_model(name)(inputs).argmax(-1)
        right = by_bin({(b, t): float(guess[b, t] == targets[b, t]) for b, t, _ in queries}, queries)
        if name.startswith("window_w32"):
            assert right[-1] < floor[-1], name                        # beyond 32 tokens
        else:
            assert all(r < f for r, f in zip(right, floor)), name     # every distance


def decays(model, ids):
    """Per layer, the log-decay of every step: (B, heads, T) for the gated delta rule, (B, d, n, T) for S6."""
    x, out = model.embed(ids), []
    for block in model.blocks:
        h = block.conv(block.norm1(x))
        mixer = block.mixer
        if hasattr(mixer, "scan_inputs"):
            _, delta, A, _, _ = mixer.scan_inputs(h)
            out.append(torch.einsum("bdt,dn->bdnt", delta, A))
        else:
            out.append(F.logsigmoid(mixer.g_proj(h)).transpose(1, 2))
        x = block(x)
    return out


@pytest.mark.slow
def test_decaying_mixers_against_their_predicted_retention():
    inputs, targets, queries = fresh_rows(41, 80)
    floor = by_bin(floor_of(inputs, targets, queries), queries)
    for name in seeds("gated_delta") + seeds("s6"):
        model = load_recall_model(name)
        with torch.no_grad():
            guess = model(inputs).argmax(-1)
            layers = decays(model, inputs)
        right = by_bin({(b, t): float(guess[b, t] == targets[b, t]) for b, t, _ in queries}, queries)
        for g in layers:
            kept = {}
            for b, t, p in queries:
                total = g[b, ..., p + 1:t + 1].double().sum(-1)          # g_{p+1} + ... + g_t
                share = torch.exp(total)
                kept[b, t] = (share.amax(-1) if g.dim() == 4 else share).mean().item()
            kept_bins = by_bin(kept, queries)
            if name.startswith("gated"):
                assert min(kept.values()) > 0.9, name
            else:
                assert all(far < near for near, far in zip(kept_bins, kept_bins[1:])), name
        if name.startswith("gated"):
            assert all(r - f > MARGIN for r, f in zip(right, floor)), name
        else:
            assert right[-1] >= right[0], name
