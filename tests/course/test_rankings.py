"""Every ranking that notebooks 11 and 12 claim is backed by a margin larger than its printed spread.

Recomputed here from the shipped records (``selfattn_lite/data/context_eval.json`` and the tiny models'
JSON training records), with plain tensor arithmetic rather than the helpers the notebooks use:

* notebook 12, paired over the evaluation windows: the mean of the per-window differences must exceed
  their standard deviation for a ranking ("<" or ">"), and must not for a pair the notebook calls
  "indistinguishable here" ("~");
* notebook 11, over the training seeds: the difference of the means must exceed the sum of the two
  standard deviations (the error bars do not overlap) for a ranking, and must not for "~".
"""

import json
import math

import pytest
import torch

from selfattn_lite.course import context_eval
from selfattn_lite.models import DATA_DIR

RESULTS = json.loads(context_eval.RESULTS_FILE.read_text())
INSIDE = RESULTS["trained_len"] // RESULTS["bucket"]          # buckets inside the trained length
PARTS = {"first_512": slice(0, INSIDE), "past_512": slice(INSIDE, None),
         "512-1024": slice(INSIDE, 1024 // RESULTS["bucket"]), "past_1280": slice(1280 // RESULTS["bucket"], None)}


def per_window(method: str, part: str) -> torch.Tensor:
    """(n,) the method's mean loss on each window over the buckets of ``part``."""
    buckets = torch.tensor(RESULTS["loss"][method]["per_window_bucket"], dtype=torch.float64)   # (n, 8)
    return buckets[:, PARTS[part]].mean(-1)


# (method a, part of a, method b, part of b, claim): "<" a ranked below b, ">" above, "~" indistinguishable
NB12_LOSS_CLAIMS = [
    ("none", "past_512", "none", "first_512", ">"),           # 1. no scaling breaks past 512
    ("yarn", "past_512", "ntk", "past_512", "<"),             # 2. the zero-shot order, step by step
    ("ntk", "past_512", "llama3", "past_512", "<"),
    ("llama3", "past_512", "none", "past_512", "<"),
    ("none", "past_512", "pi", "past_512", "<"),
    ("pi", "first_512", "none", "first_512", ">"),            #    PI hurts even inside 512
    *[(m, "first_512", "none", "first_512", ">") for m in ("ntk", "yarn", "llama3")],   # 4. every zero-shot, inside
    ("ntk", "first_512", "yarn", "first_512", "<"),           #    in the order NTK < YaRN < Llama 3.1 < PI
    ("yarn", "first_512", "llama3", "first_512", "<"),
    ("llama3", "first_512", "pi", "first_512", "<"),
    ("ntk", "past_1280", "ntk", "512-1024", ">"),             # 3. NTK-aware rises past 1280
    ("yarn", "past_1280", "yarn", "512-1024", "~"),           #    YaRN does not
    ("pi_ft", "past_512", "pi", "past_512", "<"),             # 5. fine-tuning helps both
    ("yarn_ft", "past_512", "yarn", "past_512", "<"),
    ("pi_ft", "past_512", "yarn_ft", "past_512", ">"),        #    PI's still far above YaRN's
    ("alibi", "past_512", "alibi", "first_512", "~"),         # ALiBi 1. flat
    *[("alibi", "past_512", m, "past_512", "<") for m in context_eval.ZERO_SHOT],   # 2. beats every zero-shot
    ("alibi", "past_512", "yarn_ft", "past_512", "~"),        # 3. against fine-tuned YaRN
    ("none", "first_512", "alibi", "first_512", "~"),         # 4. RoPE against ALiBi inside 512
]


def verdict(mean: float, spread: float) -> str:
    if abs(mean) <= spread:
        return "~"
    return "<" if mean < 0 else ">"


@pytest.mark.parametrize("a, a_part, b, b_part, claim", NB12_LOSS_CLAIMS,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_nb12_loss_rankings_are_larger_than_the_window_spread(a, a_part, b, b_part, claim):
    diffs = per_window(a, a_part) - per_window(b, b_part)   # paired: the same windows
    mean, sd = diffs.mean().item(), diffs.std().item()
    assert verdict(mean, sd) == claim, f"{a} {a_part} - {b} {b_part}: {mean:+.3f} ± {sd:.3f}, notebook says {claim}"
    got = context_eval.paired_difference(per_window(a, a_part), per_window(b, b_part))   # what the notebook prints
    assert got["mean"] == pytest.approx(mean) and got["sd"] == pytest.approx(sd)
    assert context_eval.is_ranked(got["mean"], got["sd"]) == (claim != "~")


def test_window_losses_are_the_saved_means():
    for method in RESULTS["loss"]:
        for part in ("first_512", "past_512"):
            got = context_eval.window_losses(RESULTS, method, part)
            assert torch.equal(got, per_window(method, part))
            assert got.mean().item() == pytest.approx(RESULTS["loss"][method][part], abs=1e-4)


def test_paired_difference_and_is_ranked():
    d = context_eval.paired_difference(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 0.0]))
    assert d["mean"] == pytest.approx(2.0) and d["sd"] == pytest.approx(1.0) and d["n"] == 3
    assert context_eval.is_ranked(2.0, 1.0) and not context_eval.is_ranked(-1.0, 1.0)
    with pytest.raises(ValueError, match="n >= 2"):
        context_eval.paired_difference(torch.tensor([1.0]), torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        context_eval.paired_difference(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="part must be"):
        context_eval.window_losses(RESULTS, "none", "middle")


# ------------------------------------------------------------------ notebook 11: MHA / GQA / MQA over seeds
SEEDS = (0, 1, 2)
STEMS = {"MHA": "tiny_mha", "GQA": "tiny_gqa", "MQA": "tiny_mqa"}


def seed_losses(stem: str) -> torch.Tensor:
    """(3,) the recorded held-out loss of seeds 0, 1, 2 (seed 0 beside the weights, the rest in seed_runs/)."""
    losses = []
    for seed in SEEDS:
        path = DATA_DIR / f"{stem}.json" if seed == 0 else DATA_DIR / "seed_runs" / f"{stem}_seed{seed}.json"
        record = json.loads(path.read_text())
        assert record["training"]["seed"] == seed and record["training"]["steps"] == 600
        losses.append(record["val_loss"])
    return torch.tensor(losses, dtype=torch.float64)


# "~": not ranked (the difference is within the two error bars together); "trend": not ranked, but larger
# than either error bar alone ("not resolved with 3 seeds"); "noise": smaller than the larger error bar
NB11_CLAIMS = [("MQA", "MHA", "trend"), ("MQA", "GQA", "noise"), ("GQA", "MHA", "noise")]


@pytest.mark.parametrize("a, b, claim", NB11_CLAIMS, ids=lambda x: x)
def test_nb11_rankings_are_larger_than_the_seed_error_bars(a, b, claim):
    la, lb = seed_losses(STEMS[a]), seed_losses(STEMS[b])
    diff = sum(la.tolist()) / 3 - sum(lb.tolist()) / 3
    sds = [math.sqrt(sum((x - sum(t.tolist()) / 3) ** 2 for x in t.tolist()) / 2) for t in (la, lb)]   # n - 1
    assert verdict(diff, sum(sds)) == "~", f"{a} - {b}: {diff:+.4f}, error bars together {sum(sds):.4f}"
    assert (abs(diff) > max(sds)) == (claim == "trend"), f"{a} - {b}: {diff:+.4f}, larger error bar {max(sds):.4f}"
    if claim == "trend":
        assert diff > 0                                                        # MQA trends worse, not better


def test_nb11_mqa_is_worst_with_two_of_three_seeds_and_the_order_changes():
    losses = torch.stack([seed_losses(stem) for stem in STEMS.values()])       # (3 variants, 3 seeds)
    worst = [max(range(3), key=lambda v: losses[v, k].item()) for k in range(len(SEEDS))]
    assert worst.count(list(STEMS).index("MQA")) == 2                          # "worst with 2 of the 3 seeds"
    orders = {tuple(losses[:, k].argsort().tolist()) for k in range(len(SEEDS))}
    assert len(orders) > 1                                                     # the order changes with the seed


# ------------------------------------------------------------------ notebook 12: attention entropy
ENTROPY = {key: torch.tensor(RESULTS["entropy"]["per_window"][key], dtype=torch.float64)   # (lengths, windows)
           for key in ("none", "yarn", "yarn_no_temperature")}


def test_nb12_entropy_claims_are_larger_than_their_spread():
    lengths = RESULTS["entropy"]["lengths"]
    for key, rows in ENTROPY.items():                                  # the saved means are the windows' means
        assert rows.mean(1).tolist() == pytest.approx(RESULTS["entropy"][key], abs=1e-4)
    none = ENTROPY["none"]                                             # 1. grows up to 1024, then indistinguishable
    steps = [verdict((none[k + 1].mean() - none[k].mean()).item(), (none[k + 1].std() + none[k].std()).item())
             for k in range(len(lengths) - 1)]
    assert steps == [">", ">", ">", "~"] and lengths[-2:] == [1024, 2048]
    for k in range(len(lengths)):                                      # 2. the temperature sharpens, paired
        diffs = ENTROPY["yarn"][k] - ENTROPY["yarn_no_temperature"][k]
        assert verdict(diffs.mean().item(), diffs.std().item()) == "<"
    diffs = ENTROPY["yarn"][-1] - ENTROPY["none"][-1]                  # 3. YaRN vs none at 2048
    assert verdict(diffs.mean().item(), diffs.std().item()) == "~"


# ------------------------------------------------------------------ notebook 12: ALiBi with its context cut to 512
def test_nb12_alibi_does_not_use_the_context_past_512():
    cut = RESULTS["context_cut"]
    assert (cut["method"], cut["context"]) == ("alibi", RESULTS["trained_len"])
    diffs = torch.tensor(cut["per_window_past_512"], dtype=torch.float64) - per_window("alibi", "past_512")
    assert verdict(diffs.mean().item(), diffs.std().item()) == "~"             # indistinguishable here
    assert diffs.abs().max() < 0.01                                            # under 0.01 nats on every window


def test_nb12_budgets_of_alibi_and_fine_tuned_yarn():
    records = {stem: json.loads((DATA_DIR / f"{stem}.json").read_text())["training"]
               for stem in ("tiny_decoder", "tiny_decoder_alibi", "tiny_decoder_yarn")}
    chars = {stem: r["steps"] * r["batch"] * r["seq_len"] for stem, r in records.items()}
    assert all(chars[stem] == records[stem]["tokens"] for stem in chars)
    yarn_ft = chars["tiny_decoder"] + chars["tiny_decoder_yarn"]             # pre-training + fine-tune
    assert yarn_ft / chars["tiny_decoder_alibi"] == 1.25                     # "25% more characters"



def test_nb12_pi_zero_shot_is_worse_than_the_unigram_floor():
    """Notebook 12: an add-one unigram model of the training split beats zero-shot PI, inside and past 512."""
    from selfattn_lite.models import load_tiny_decoder
    tok = load_tiny_decoder().tokenizer
    train = tok.encode(context_eval.split_text(context_eval.load_text())[0])
    V = len(tok.chars)
    counts = torch.zeros(V, dtype=torch.float64).index_add_(0, train, torch.ones(len(train), dtype=torch.float64))
    nll = -((counts + 1) / (len(train) + V)).log()                     # (V,) nats per character
    windows = context_eval.eval_windows(context_eval.held_out_ids(tok), RESULTS["target_len"])
    floor = nll[windows[:, 1:]].mean().item()
    assert floor < math.log(V)
    assert RESULTS["loss"]["pi"]["first_512"] > floor and RESULTS["loss"]["pi"]["past_512"] > floor
    assert all(RESULTS["loss"][m]["past_512"] < floor for m in ("none", "ntk", "yarn", "llama3"))
