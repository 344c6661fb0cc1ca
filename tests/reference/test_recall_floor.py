"""The no-recall floor of MQAR: each exact formula of recall.no_recall_floor against a simulation with its own
random draws, the per-row scores against hand-made rows, and query_retention against the delta rule itself."""

import math
import random

import pytest
import torch

from selfattn_lite.recall import (
    IGNORE_INDEX,
    mqar,
    no_recall_floor,
    no_recall_loss,
    no_recall_scores,
    query_retention,
)
from selfattn_lite.recurrent import delta_rule


def simulate(n, m, rows=40000, seed=0):
    """Monte-Carlo accuracy of each strategy, drawing n values with replacement from m, by plain Python."""
    rng = random.Random(seed)
    totals = dict(seen_distinct=0.0, seen_slot=0.0, most_frequent=0.0)
    for _ in range(rows):
        values = [rng.randrange(m) for _ in range(n)]
        asked = values[rng.randrange(n)]                      # the query of a uniformly chosen pair
        counts = {x: values.count(x) for x in values}
        totals["seen_distinct"] += rng.choice(sorted(counts)) == asked
        totals["seen_slot"] += values[rng.randrange(n)] == asked
        top = max(counts.values())
        totals["most_frequent"] += rng.choice([x for x, c in counts.items() if c == top]) == asked
    return {name: total / rows for name, total in totals.items()}


@pytest.mark.parametrize("n, vocab", [(4, 64), (8, 64), (16, 64), (6, 14), (3, 8)])
def test_formulas_match_a_simulation(n, vocab):
    exact, sim = no_recall_floor(n, vocab), simulate(n, vocab // 2)
    for name, p in sim.items():
        se = math.sqrt(exact[name] * (1 - exact[name]) / 40000)
        assert abs(p - exact[name]) < 4 * se, (name, p, exact[name])
    assert exact["uniform_vocab"] == 1 / vocab and exact["uniform_values"] == 1 / (vocab // 2)
    assert exact["floor"] == exact["most_frequent"] == max(exact.values())


def test_closed_forms_at_small_sizes():
    f = no_recall_floor(2, 8)                                   # m = 4 values, 2 pairs: same value with chance 1/4
    assert math.isclose(f["seen_slot"], (1 + 1 / 4) / 2)
    assert math.isclose(f["seen_distinct"], 1 / 4 * 1 + 3 / 4 * 1 / 2)
    assert math.isclose(f["most_frequent"], 1 / 4 * 1 + 3 / 4 * 1 / 2)
    assert no_recall_floor(1, 8)["floor"] == 1.0               # one pair: its value is the answer


def test_scores_on_the_evaluation_rows_match_the_formula():
    """The rows the shipped records were scored on (seed 12345, 512 rows, 4 8 12 16 pairs in turn)."""
    gen = torch.Generator().manual_seed(12345)
    for n in (4, 8, 12, 16):
        inputs, targets = mqar(512, 64, n, 64, generator=gen)
        scores, asked = no_recall_scores(inputs, targets, 64), targets != IGNORE_INDEX
        exact = no_recall_floor(n, 64)
        for name in ("seen_distinct", "seen_slot", "most_frequent"):
            assert abs(scores[name][asked].mean().item() - exact[name]) < 0.01, (n, name)
        assert (scores["strike_asked"][asked].mean() > scores["most_frequent"][asked].mean()).item()
        assert (scores["most_frequent"][~asked] == 0).all()


def test_striking_out_shown_answers_scores_h_n_over_n_where_values_are_distinct():
    """Notebook rows show each answer after its query: with n distinct values the r-th query has n - r + 1 left,
    so striking out the asked ones scores (1 + 1/2 + ... + 1/n) / n, far above the static floor (notebook 16)."""
    n = 8
    inputs, targets = mqar(400, 4 * n, n, 64, generator=torch.Generator().manual_seed(3))
    scores, asked = no_recall_scores(inputs, targets, 64)["strike_asked"], targets != IGNORE_INDEX
    harmonic = sum(1 / r for r in range(1, n + 1)) / n
    distinct = [b for b in range(inputs.shape[0]) if len(set(inputs[b, 1:2 * n:2].tolist())) == n]
    assert len(distinct) > 100
    for b in distinct:
        assert math.isclose(scores[b][asked[b]].mean().item(), harmonic, rel_tol=1e-12)
    assert scores[asked].mean().item() > 1.5 * no_recall_floor(n, 64)["floor"]


@pytest.mark.parametrize("n", [1, 4, 16])
def test_no_recall_loss_is_the_loss_of_predicting_each_value_by_its_share(n):
    """On 3000 drawn rows, -log(count of the answer / n), averaged: the loss of that prediction, by simulation."""
    inputs, targets = mqar(3000, 4 * n, n, 64, generator=torch.Generator().manual_seed(n))
    asked = targets != IGNORE_INDEX
    share = no_recall_scores(inputs, targets, 64)["seen_slot"][asked]          # count / n of each answer
    losses = -share.log()
    se = losses.std().item() / math.sqrt(len(losses))
    assert abs(losses.mean().item() - no_recall_loss(n, 64)) < 4 * se + 1e-12
    assert no_recall_loss(n, 64) <= math.log(n) + 1e-12                        # at most a uniform pick among n


def test_scores_of_one_hand_made_row():
    # pairs (1, 9) (2, 9) (3, 12), then queries 2, 3, 1: values 9 9 12, the mode 9 twice
    inputs = torch.tensor([[1, 9, 2, 9, 3, 12, 2, 9, 3, 12, 1, 9]])
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[0, [6, 8, 10]] = torch.tensor([9, 12, 9])
    s = no_recall_scores(inputs, targets, 16)
    assert s["most_frequent"][0, [6, 8, 10]].tolist() == [1.0, 0.0, 1.0]
    assert s["seen_slot"][0, [6, 8, 10]].tolist() == [2 / 3, 1 / 3, 2 / 3]
    assert s["seen_distinct"][0, [6, 8, 10]].tolist() == [0.5, 0.5, 0.5]
    # strike: first 9 (mode of 9 9 12), then {9, 12} tie -> 12 half, then only 9 left
    assert s["strike_asked"][0, [6, 8, 10]].tolist() == [1.0, 0.5, 1.0]


def test_retention_is_what_the_gated_delta_rule_keeps():
    """Write a value at its position with beta = 1 on a key orthogonal to every later one: the state returns
    exp(g_{p+1} + ... + g_t) of it at the query, the retention query_retention predicts."""
    inputs, targets = mqar(1, 24, 3, 16, generator=torch.Generator().manual_seed(4))
    T = inputs.shape[1]
    g = -torch.rand(1, 1, T, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    retention = query_retention(g, inputs, targets)[0, 0]
    keys = torch.eye(T, dtype=torch.float64)[None, None]                    # orthogonal unit keys
    v = torch.randn(1, 1, T, 2, dtype=torch.float64)
    for t in (targets[0] != IGNORE_INDEX).nonzero().flatten().tolist():
        p = (inputs[0] == inputs[0, t]).nonzero()[0, 0].item() + 1           # the value after the key's first place
        _, S = delta_rule(keys[:, :, :t + 1], keys[:, :, :t + 1], v[:, :, :t + 1], torch.ones(1, 1, t + 1,
                          dtype=torch.float64), g=g[..., :t + 1], return_state=True)
        kept = (keys[0, 0, p] @ S[0, 0]).norm() / v[0, 0, p].norm()
        assert math.isclose(kept.item(), retention[t].item(), rel_tol=1e-9)
    assert (retention[targets[0] == IGNORE_INDEX] == 0).all()


def test_bad_rows_are_named():
    inputs, targets = mqar(2, 16, 2, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"\(2, 16\).*\(2, 15\)"):
        no_recall_scores(inputs, targets[:, :-1], 8)
    with pytest.raises(ValueError, match=r"log_decay \(2, 1, 15\)"):
        query_retention(torch.zeros(2, 1, 15), inputs, targets)
    with pytest.raises(ValueError, match="n_pairs must be a positive int"):
        no_recall_floor(0, 64)


# --- Zoology's rows: values distinct within a row -----------------------------------------------------------

def simulate_zoology(n, vocab, rows=20000, seed=0, power_a=0.01, seq_len=64):
    """Monte-Carlo, by plain Python: n distinct keys and values, query slots drawn one key after another from
    Zoology's power law without replacement; each strategy's accuracy, and query_order's (r-th query -> r-th pair)."""
    rng = random.Random(seed)
    m, n_slots = vocab - vocab // 2, (seq_len - 2 * n) // 2
    weights = [power_a * (j + 1) ** (power_a - 1) for j in range(n_slots)]
    totals = dict(seen_distinct=0.0, seen_slot=0.0, most_frequent=0.0, query_order=0.0)
    for _ in range(rows):
        values = rng.sample(range(m), n)
        free, slot_of = list(range(n_slots)), []
        for _ in range(n):                                        # key i takes the i-th draw
            j = rng.choices(free, weights=[weights[f] for f in free])[0]
            free.remove(j)
            slot_of.append(j)
        order = sorted(range(n), key=lambda i: slot_of[i])       # the pair each query asks, in position order
        r = rng.randrange(n)                                     # one query of the row
        asked = values[order[r]]
        totals["seen_distinct"] += rng.choice(sorted(set(values))) == asked
        totals["seen_slot"] += values[rng.randrange(n)] == asked
        totals["most_frequent"] += rng.choice(values) == asked    # every value once: all tied
        totals["query_order"] += values[r] == asked
    return {name: total / rows for name, total in totals.items()}


@pytest.mark.parametrize("n", [4, 16])
def test_zoology_floor_matches_a_simulation_and_its_rows(n):
    exact, sim = no_recall_floor(n, 128, style="zoology"), simulate_zoology(n, 128)
    for name in ("seen_distinct", "seen_slot", "most_frequent"):
        se = math.sqrt(exact[name] * (1 - exact[name]) / 20000)
        assert abs(sim[name] - exact[name]) < 4 * se, (name, sim[name], exact[name])
        assert exact[name] == 1 / n
    assert exact["floor"] == 1 / n and exact["uniform_vocab"] == 1 / 128 and exact["uniform_values"] == 1 / 64
    assert no_recall_floor(n, 128)["floor"] > exact["floor"]          # values with replacement raise the floor
    inputs, targets = mqar(2000, 64, n, 128, generator=torch.Generator().manual_seed(n), style="zoology")
    scores, asked = no_recall_scores(inputs, targets, 128, style="zoology"), targets != IGNORE_INDEX
    assert "strike_asked" not in scores
    for name in ("seen_distinct", "seen_slot", "most_frequent"):
        assert torch.allclose(scores[name][asked], torch.full_like(scores[name][asked], 1 / n))
    ours, theirs = scores["query_order"][asked].mean().item(), sim["query_order"]
    se = math.sqrt(theirs * (1 - theirs) / 20000) + math.sqrt(theirs * (1 - theirs) / asked.sum().item())
    assert abs(ours - theirs) < 4 * se, (ours, theirs)
    assert theirs > 1 / n + 0.02                                      # the query order beats the floor
    assert no_recall_loss(n, 128, style="zoology") == math.log(n)


def test_query_order_of_one_hand_made_row():
    # pairs (1, 9) (2, 10) (3, 11), then queries 2, 1, 3 (random tokens between): only the last is in pair order
    inputs = torch.tensor([[1, 9, 2, 10, 3, 11, 2, 5, 1, 7, 3, 4]])
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[0, [6, 8, 10]] = torch.tensor([10, 9, 11])
    s = no_recall_scores(inputs, targets, 16, style="zoology")
    assert s["query_order"][0, [6, 8, 10]].tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="style must be one of"):
        no_recall_floor(4, 64, style="zoo")
