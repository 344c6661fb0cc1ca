"""Every reading notebook 16 makes of the shipped recall runs (the swept protocol, ``data/recall_v2``), recomputed
from the JSON records with its own arithmetic.

The floor is recounted here from the evaluation rows (per query, 1 / the number of distinct values among the row's
pairs, by plain Python), and the rows are tied to the records by their sha256, hashed here; the selection rule, the
standings against the floor, the pairwise rankings, the loss tails and the budget check (the brackets, and seed by seed: each seed's 6,000-step
accuracy minus its own 3,000-step one) are written out again from the records' numbers; the distance readings re-evaluate the shipped models on rows of seeds the notebook does not
use, with Gated DeltaNet's gate and S6's decay recomputed from the weights and the retention exp(g_{p+1} + ... + g_t)
summed query by query.
"""

import hashlib
import itertools
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from selfattn_lite.recall import IGNORE_INDEX, mqar
from selfattn_lite.recall_models import RECALL_V2_DIR, load_recall_model

PAIRS = ["4", "8", "12", "16"]
MIXERS = ["attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid", "hybrid_1in4"]
LRS = [1e-3, 3e-3, 1e-2]
TOP = 3e-2
RUNS = {r["run"]: r for r in (json.loads(p.read_text()) for p in sorted(Path(RECALL_V2_DIR).glob("*.json")))}
BUDGET = {r["run"]: r for r in (json.loads(p.read_text())
                                for p in sorted((Path(RECALL_V2_DIR) / "budget").glob("*.json")))}
MARGIN, GAP = 0.05, 0.02
VOCAB = 128


def name(mixer: str, lr: float, seed: int) -> str:
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mixer}_lr{mantissa}e{int(exponent)}_s{seed}"


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def tried_rates(mixer: str) -> list[float]:
    """1e-3, 3e-3, 1e-2; and 3e-2 where 1e-2 is the best of those three."""
    return LRS + [TOP] if best_of(mixer, LRS) == max(LRS) else LRS


def best_of(mixer: str, lrs: list[float]) -> float:
    """Highest mean validation accuracy of the seed-0 runs; a tie goes to the smaller rate."""
    best = None
    for lr in sorted(lrs):                                          # ascending: a tie keeps the smaller
        score = mean(RUNS[name(mixer, lr, 0)]["val"]["accuracy"].values())
        if best is None or score > best[0]:
            best = (score, lr)
    return best[1]


def chosen_rate(mixer: str) -> float:
    return best_of(mixer, tried_rates(mixer))


CHOSEN = {m: chosen_rate(m) for m in MIXERS}


def seeds(mixer: str) -> list[str]:
    return [name(mixer, CHOSEN[mixer], s) for s in range(3)]


def acc(run: str, p: str) -> float:
    return RUNS[run]["accuracy"][p]


def evaluation_floor() -> tuple[dict, str]:
    """Per number of pairs, the mean over queries of 1 / (distinct values among the row's pairs) when the answer is
    among them; and the sha256 of the rows as drawn."""
    gen = torch.Generator().manual_seed(12345)
    digest, out = hashlib.sha256(), {}
    for p in PAIRS:
        rows, targets = mqar(512, 64, int(p), VOCAB, generator=gen, style="zoology")
        digest.update(rows.numpy().tobytes())
        digest.update(targets.numpy().tobytes())
        chances = []
        for row, target in zip(rows.tolist(), targets.tolist()):
            values = set(row[1:2 * int(p):2])
            chances += [(y in values) / len(values) for y in target if y != IGNORE_INDEX]
        out[p] = mean(chances)
    return out, digest.hexdigest()


FLOOR, EVAL_SHA = evaluation_floor()


def test_the_records_share_one_protocol_and_one_evaluation():
    assert len(RUNS) == sum(len(tried_rates(m)) for m in MIXERS) + 2 * len(MIXERS)
    assert {m for m in MIXERS if len(tried_rates(m)) == 4} == {"linear", "delta", "hybrid_1in4"}
    for r in RUNS.values():
        assert r["eval"]["seed"] == 12345 and r["eval"]["rows"] == 512 and r["eval"]["sha256"] == EVAL_SHA
        assert r["config"]["vocab_size"] == VOCAB and r["recipe"]["mqar_style"] == "zoology"
        assert r["recipe"]["steps"] == 3000 and r["val"]["sha256"] != EVAL_SHA


def test_the_floor_is_one_over_n_on_the_evaluation_rows():
    for p in PAIRS:
        assert abs(FLOOR[p] - 1 / int(p)) < 1e-12, (p, FLOOR[p])


def test_the_margin_exceeds_what_the_query_order_adds_to_the_floor():
    """Answering the r-th query (in position order) with the r-th pair's value, on the evaluation rows: its excess
    over the floor stays below the 0.05 margin at every number of pairs."""
    gen = torch.Generator().manual_seed(12345)
    for p in PAIRS:
        rows, targets = mqar(512, 64, int(p), VOCAB, generator=gen, style="zoology")
        right = []
        for row, target in zip(rows.tolist(), targets.tolist()):
            asked = [y for y in target if y != IGNORE_INDEX]
            right += [y == v for y, v in zip(asked, row[1:2 * int(p):2])]
        excess = mean(right) - 1 / int(p)
        assert 0.01 < excess < MARGIN, (p, excess)


def test_the_selection_and_which_rates_leave_the_floor():
    assert [m for m in MIXERS if CHOSEN[m] == max(tried_rates(m))] == []          # every choice bracketed
    assert CHOSEN == {"attention": 3e-3, "window": 3e-3, "linear": 1e-2, "delta": 1e-2, "gated_delta": 3e-3,
                      "s6": 3e-3, "hybrid": 3e-3, "hybrid_1in4": 1e-2}
    for mixer in MIXERS:                                            # seeds 1 and 2 only at the chosen rate
        assert {r["recipe"]["lr"] for r in RUNS.values() if r["config"]["mixer"] == mixer and r["seed"] > 0} == \
            {CHOSEN[mixer]}
    floor_mean = mean(FLOOR.values())
    off = {m: sum(mean(RUNS[name(m, lr, 0)]["val"]["accuracy"].values()) - floor_mean > MARGIN
                  for lr in tried_rates(m)) for m in MIXERS}
    assert off == {"attention": 1, "window": 0, "linear": 4, "delta": 3, "gated_delta": 1, "s6": 0, "hybrid": 0,
                   "hybrid_1in4": 2}
    # bracketed only where the chosen rate leaves the floor and a tried rate lies on each side of it
    val = {m: {lr: mean(RUNS[name(m, lr, 0)]["val"]["accuracy"].values()) for lr in tried_rates(m)} for m in MIXERS}
    bracketed = [m for m in MIXERS if val[m][CHOSEN[m]] - floor_mean > MARGIN
                 and min(tried_rates(m)) < CHOSEN[m] < max(tried_rates(m))
                 and all(x <= val[m][CHOSEN[m]] for x in val[m].values())]
    assert bracketed == ["attention", "linear", "delta", "gated_delta", "hybrid_1in4"]
    assert [m for m in MIXERS if all(x - floor_mean <= MARGIN for x in val[m].values())] == ["window", "s6", "hybrid"]
    # one seed per rate: a bracket clears the seed noise only where both neighbouring rates fall short of seed 0 by
    # more than the range of the chosen rate's three seeds (validation rows)
    clear = []
    for m in bracketed:
        rates = sorted(val[m])
        i = rates.index(CHOSEN[m])
        shortfall = min(val[m][CHOSEN[m]] - val[m][rates[i - 1]], val[m][CHOSEN[m]] - val[m][rates[i + 1]])
        seed_means = [mean(RUNS[r]["val"]["accuracy"].values()) for r in seeds(m)]
        if shortfall > max(seed_means) - min(seed_means):
            clear.append(m)
    assert clear == ["attention", "gated_delta"]


def standing(run: str, accuracy=None) -> str:
    """A run's place against the floor, from its accuracies (by default its 3,000-step record's)."""
    accuracy = accuracy or (lambda p: acc(run, p))
    margins = [accuracy(p) - FLOOR[p] for p in PAIRS]
    if all(x > MARGIN for x in margins):
        return "above"
    if all(abs(x) <= MARGIN for x in margins):
        return "on the floor"
    return "below" if all(x < 0 for x in margins) else "mixed"


def test_seeds_above_on_and_below_the_floor():
    counted = {m: sum(standing(run) == "above" for run in seeds(m)) for m in MIXERS}
    assert counted == {"attention": 2, "window": 0, "linear": 3, "delta": 3, "gated_delta": 3, "s6": 0, "hybrid": 0,
                       "hybrid_1in4": 2}
    runs = [run for m in MIXERS for run in seeds(m)]
    assert all(acc(run, p) - FLOOR[p] > 0.6 for run in runs if standing(run) == "above" for p in PAIRS)
    assert {run for run in runs if standing(run) == "on the floor"} == {
        "attention_lr3e-3_s2", "hybrid_1in4_lr1e-2_s2", *seeds("s6"), *seeds("hybrid")}
    assert all(standing(run) == "below" for run in seeds("window"))
    # the hybrid's first layer alone (the gated delta model) learns at the same rate, every seed
    assert CHOSEN["hybrid"] == CHOSEN["gated_delta"] and all(standing(r) == "above" for r in seeds("gated_delta"))


def verdict(a: str, b: str, p: str) -> str:
    lo_a, hi_a = min(acc(r, p) for r in seeds(a)), max(acc(r, p) for r in seeds(a))
    lo_b, hi_b = min(acc(r, p) for r in seeds(b)), max(acc(r, p) for r in seeds(b))
    return ">" if lo_a - hi_b > GAP else "<" if lo_b - hi_a > GAP else "~"


def test_rankings_pair_by_pair():
    ranked = {}
    for a, b in itertools.permutations(MIXERS, 2):
        at = [p for p in PAIRS if verdict(a, b, p) == ">"]
        if at:
            ranked[a, b] = at
    learned = ["linear", "delta", "gated_delta"]
    expected = {(m, "window"): PAIRS for m in MIXERS if m != "window"}
    expected |= {(m, stuck): PAIRS for m in learned for stuck in ("s6", "hybrid")}
    expected |= {("delta", "linear"): ["8"], ("gated_delta", "linear"): ["4", "8"], ("gated_delta", "attention"): ["4"]}
    assert ranked == expected
    for p in ("12", "16"):                                       # none of the three that learned separates there
        assert all(verdict(a, b, p) == "~" for a, b in itertools.combinations(learned, 2))
    recall = ["attention", "linear", "delta", "gated_delta", "hybrid_1in4"]
    tests = [(a, b, p) for a, b in itertools.combinations(recall, 2) for p in PAIRS]
    separated = [(a, b, p) for a, b, p in tests if verdict(a, b, p) != "~"]
    assert len(separated) == 4 <= len(tests) / 10                # as many as chance (1 in 10) would give
    assert all(p in ("4", "8") for _, _, p in separated)


def test_best_and_median_seed_readings():
    def best(m, p):
        return max(acc(r, p) for r in seeds(m))

    def median(m, p):
        return sorted(acc(r, p) for r in seeds(m))[1]

    for p in PAIRS:
        assert best("attention", p) > 0.95 and median("attention", p) > 0.95
        assert best("delta", p) > 0.95 and median("delta", p) > 0.95 and best("hybrid_1in4", p) > 0.99
    assert best("linear", "16") < 0.9 and best("gated_delta", "16") < 0.9
    assert min(acc(r, "16") for r in seeds("delta")) < 0.8                # the delta rule's third seed


def test_the_largest_rows_against_the_read_out_bounds():
    for m in ("linear", "delta", "gated_delta", "s6"):
        config = RUNS[seeds(m)[0]]["config"]
        per_head = config["d_state"] if m == "s6" else config["d_model"] // config["n_heads"]
        per_layer = config["d_state"] if m == "s6" else config["n_heads"] * per_head     # a layer's query: h x dk
        assert per_head == 16 and max(int(p) for p in PAIRS) == per_head          # at the per-head bound
        # per layer: at S6's N; half of a two-head layer's h x dk = 32 (values of a head's width)
        assert per_layer == (16 if m == "s6" else 32) and config["n_heads"] == 2
    for m in ("gated_delta", "linear"):
        assert all(acc(r, "4") - acc(r, "16") > 0.1 for r in seeds(m))


def tail(losses: list) -> tuple[float, float]:
    """Mean of the tenth of the losses before the last tenth, and of the last tenth."""
    k = len(losses) // 10
    return mean(losses[-2 * k:-k]), mean(losses[-k:])


def test_loss_readings():
    runs = [run for m in MIXERS for run in seeds(m)]
    tails = {run: {p: tail(RUNS[run]["losses_by_pairs"][p]) for p in PAIRS} for run in runs}
    assert all(len(RUNS[run]["losses_by_pairs"][p]) == 750 for run in runs for p in PAIRS)
    assert all(abs(last - before) < 0.05 for t in tails.values() for before, last in t.values())
    below = {run for run in runs if all(tails[run][p][1] < math.log(int(p)) for p in PAIRS)}
    assert below == {run for run in runs if standing(run) == "above"}
    stuck = [run for run in runs if standing(run) == "on the floor"]
    assert all(tails[run][p][1] > math.log(int(p)) for run in stuck for p in PAIRS)
    assert all(abs(tails[run][p][1] - math.log(64)) < 0.15 for run in seeds("window") for p in PAIRS)


def long_acc(run: str, p: str) -> float:
    return BUDGET[f"{run}_steps6000"]["accuracy"][p]


def bracket(xs: list[float], ys: list[float]) -> str:
    return ">" if min(xs) - max(ys) > GAP else "<" if min(ys) - max(xs) > GAP else "~"


def long_standing(run: str) -> str:
    return standing(run, lambda p: long_acc(run, p))


def test_the_budget_check_reruns_every_seed_at_twice_the_steps():
    assert len(BUDGET) == 3 * len(MIXERS), sorted(BUDGET)
    for name_, long in BUDGET.items():
        short = RUNS[name_.removesuffix("_steps6000")]
        assert short["run"] in seeds(short["config"]["mixer"])      # at the chosen rate
        assert long["recipe"]["steps"] == 6000 and long["recipe"]["lr"] == short["recipe"]["lr"]
        assert long["seed"] == short["seed"] and long["config"] == short["config"]
        assert long["eval"]["sha256"] == EVAL_SHA and sum(len(v) for v in long["losses_by_pairs"].values()) == 6000
        assert (Path(RECALL_V2_DIR) / "budget" / f"{name_}.safetensors").exists()
    change = {m: [bracket([long_acc(r, p) for r in seeds(m)], [acc(r, p) for r in seeds(m)]) for p in PAIRS]
              for m in MIXERS}
    assert change["gated_delta"] == ["~", "~", ">", ">"]            # 3,000 steps were not enough at 12, 16 pairs
    assert change["window"] == [">", "~", "~", "~"]                 # the windows: at 4 pairs, still below the floor
    assert all(c == "~" for m in ("attention", "linear", "delta") for c in change[m])
    above = {m: sum(long_standing(r) == "above" for r in seeds(m)) for m in MIXERS}
    assert above == {"attention": 2, "window": 0, "linear": 3, "delta": 3, "gated_delta": 3, "s6": 0, "hybrid": 1,
                     "hybrid_1in4": 3}
    assert all(long_standing(r) == "below" for r in seeds("window"))
    assert all(long_standing(r) == "on the floor" for r in seeds("s6") + ["attention_lr3e-3_s2"])
    assert long_standing("hybrid_1in4_lr1e-2_s2") == "above" and standing("hybrid_1in4_lr1e-2_s2") == "on the floor"
    runs = [r for m in MIXERS for r in seeds(m)]
    assert {r for r in runs if long_standing(r) != standing(r)} == {"hybrid_lr3e-3_s1", "hybrid_1in4_lr1e-2_s2"}


def test_the_budget_check_seed_by_seed():
    """Same seed, same initialisation and training stream: each seed's 6,000-step accuracy minus its 3,000-step one."""
    for name_, long in BUDGET.items():
        assert long["data_seed"] == RUNS[name_.removesuffix("_steps6000")]["data_seed"] == 1000 + long["seed"]
    diff = {r: [long_acc(r, p) - acc(r, p) for p in PAIRS] for m in MIXERS for r in seeds(m)}
    gains = [m for m in MIXERS if all(x > 0 for r in seeds(m) for x in diff[r])]
    assert gains == ["attention", "window", "linear", "gated_delta", "s6", "hybrid"]
    fell = [r for r in diff if any(x < 0 for x in diff[r])]
    assert fell == ["delta_lr1e-2_s2", "hybrid_1in4_lr1e-2_s0"]
    assert all(all(x < 0 for x in diff[r]) for r in fell)                          # at every number of pairs
    assert all(diff[r][-1] == min(diff[r]) for r in fell)                          # most at 16 pairs
    assert diff["delta_lr1e-2_s2"][-1] < -0.1 and diff["hybrid_1in4_lr1e-2_s0"][-1] < -0.5
    assert all(diff[r][-1] > 0.05 for r in seeds("gated_delta"))
    assert all(0 < x < 0.05 for r in seeds("linear") for x in diff[r])
    for r in seeds("attention")[:2] + seeds("delta")[:2]:                         # near the ceiling
        assert all(acc(r, p) > 0.95 for p in PAIRS) and all(abs(x) < 0.02 for x in diff[r])


def test_rankings_at_twice_the_steps():
    def long_verdict(a, b, p):
        return bracket([long_acc(r, p) for r in seeds(a)], [long_acc(r, p) for r in seeds(b)])

    learned = ["linear", "delta", "gated_delta"]
    assert all(long_verdict(a, b, p) == ">" for a in learned for b in ("window", "s6") for p in PAIRS)
    recall = ["attention", "linear", "delta", "gated_delta", "hybrid_1in4"]
    separated = {(a, b) if long_verdict(a, b, p) == ">" else (b, a)
                 for a, b in itertools.combinations(recall, 2) for p in PAIRS if long_verdict(a, b, p) != "~"}
    assert separated == {("gated_delta", "attention"), ("gated_delta", "linear"), ("gated_delta", "hybrid_1in4")}
    assert all(long_verdict("gated_delta", "linear", p) == ">" for p in PAIRS)
    # the search: of the C(5, 2) = 10 pairs of mixers with recall, those separating at every number of pairs; one
    # pair's four pair counts are one event, of chance at most 2 / C(6, 3) = 1/10 with exchangeable seeds
    everywhere = [(a, b) for a, b in itertools.combinations(recall, 2)
                  if all(long_verdict(a, b, p) != "~" for p in PAIRS)]
    assert everywhere == [("linear", "gated_delta")]
    assert math.comb(len(recall), 2) == 10 and 2 / math.comb(6, 3) == 1 / 10
    assert len(everywhere) <= math.comb(len(recall), 2) * 2 / math.comb(6, 3)    # no more than chance allows


# --- live readings on rows of other seeds -------------------------------------------------------------------

BINS = [(1, 8), (8, 16), (16, 32), (32, 64)]


def fresh_rows(seed: int, rows: int):
    inputs, targets = mqar(rows, 64, 8, VOCAB, generator=torch.Generator().manual_seed(seed), style="zoology")
    queries = []                                                   # (row, t, p): query t asks the value at p
    for b, t in (targets != IGNORE_INDEX).nonzero().tolist():
        queries.append((b, t, inputs[b].tolist().index(inputs[b, t].item()) + 1))
    return inputs, targets, queries


def by_bin(values: dict, queries) -> list[float]:
    return [mean(values[b, t] for b, t, p in queries if lo <= t - p < hi) for lo, hi in BINS]


@pytest.mark.slow
def test_windows_sit_below_the_floor_and_mostly_answer_tokens_out_of_reach():
    inputs, targets, queries = fresh_rows(31, 200)
    for run in seeds("window"):
        with torch.no_grad():
            guess = load_recall_model(run, RECALL_V2_DIR)(inputs).argmax(-1)
        right = by_bin({(b, t): float(guess[b, t] == targets[b, t]) for b, t, _ in queries}, queries)
        assert all(r < 1 / 8 for r in right), (run, right)
        pair_value = mean(guess[b, t].item() in inputs[b, 1:16:2].tolist() for b, t, _ in queries)
        value_token = mean(guess[b, t].item() >= VOCAB // 2 for b, t, _ in queries)
        assert pair_value < 0.5 and value_token > 0.9, (run, pair_value, value_token)
        in_reach = mean(guess[b, t].item() in inputs[b, max(0, t - 20):t + 1].tolist() for b, t, _ in queries)
        assert in_reach < 0.5, (run, in_reach)                     # two layers reach 2 x (7 + 3) = 20 positions
    assert mean(t - p > 20 for _, t, p in queries) > 0.4           # nearly half the values sit beyond that reach


def decays(model, ids):
    """Per layer, the log-decay of every step: (B, heads, T) for Gated DeltaNet's gate, (B, d, n, T) for S6."""
    x, out = model.embed(ids), []
    for block in model.blocks:
        h = block.conv(block.norm1(x))
        mixer = block.mixer
        if hasattr(mixer, "A_log") and hasattr(mixer, "a_proj"):       # g = -exp(A_log) softplus(W_a x + dt_bias)
            out.append((-torch.exp(mixer.A_log) * F.softplus(h @ mixer.a_proj.weight.T + mixer.dt_bias)).transpose(1, 2))
        else:                                                          # S6: delta A, delta from the convolved u
            u = F.silu(mixer.conv(mixer.in_proj(h)))
            delta = F.softplus(u @ mixer.dt_proj.weight.T + mixer.dt_proj.bias)      # (B, T, d)
            out.append(torch.einsum("btd,dn->bdnt", delta, -torch.exp(mixer.A_log)))
        x = block(x)
    return out


@pytest.mark.slow
def test_decaying_mixers_against_their_predicted_retention():
    inputs, targets, queries = fresh_rows(41, 96)
    farthest_kept = []
    for run in seeds("gated_delta") + seeds("s6"):
        model = load_recall_model(run, RECALL_V2_DIR)
        with torch.no_grad():
            guess = model(inputs).argmax(-1)
            layers = decays(model, inputs)
        right = by_bin({(b, t): float(guess[b, t] == targets[b, t]) for b, t, _ in queries}, queries)
        kept_bins = []
        for g in layers:
            kept = {}
            for b, t, p in queries:
                share = torch.exp(g[b, ..., p + 1:t + 1].double().sum(-1))   # exp(g_{p+1} + ... + g_t)
                kept[b, t] = (share.amax(-1) if g.dim() == 4 else share).mean().item()
            kept_bins.append(by_bin(kept, queries))
        if run.startswith("gated"):
            farthest_kept += [k[-1] for k in kept_bins]
            assert max(k[-1] for k in kept_bins) > 0.75, run
            assert all(r - 1 / 8 > MARGIN for r in right) and max(right) - right[-1] < 0.05, (run, right)
        else:
            assert all(all(far < near for near, far in zip(k, k[1:])) for k in kept_bins), run
            assert all(r - 1 / 8 <= MARGIN for r in right), (run, right)
    assert min(farthest_kept) < 0.5                                    # some gate forgets
