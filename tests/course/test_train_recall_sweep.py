"""The swept recall protocol (``train_recall --sweep``): its order, its selection rule on fake records,
skipping what is saved, a real (tiny) run's record, and the shipped records against the rule."""

import json

import pytest
import torch

from selfattn_lite.course import train_recall as tr
from selfattn_lite.recall_models import load_recall_model


def fake(mixer, lr, seed, val):
    return {"run": tr.v2_run_name(mixer, lr, seed), "config": {"mixer": mixer}, "seed": seed,
            "recipe": {"lr": lr}, "val": {"accuracy": {"4": val, "8": val}}}


def write(out, record):
    (out / f"{record['run']}.json").write_text(json.dumps(record))


def test_run_names():
    assert tr.v2_run_name("gated_delta", 3e-3, 0) == "gated_delta_lr3e-3_s0"
    assert [tr.lr_tag(lr) for lr in tr.V2_LRS] == ["3e-3", "1e-2", "1e-3"]
    assert max(tr.V2_LRS) / min(tr.V2_LRS) >= 10 and len(tr.V2_LRS) >= 3   # a decade, three rates
    assert tr.V2_STEPS >= 3 * tr.STEPS


def test_selection_rule_picks_the_best_mean_validation_accuracy_and_breaks_ties_low():
    records = [fake("delta", 1e-3, 0, 0.2), fake("delta", 3e-3, 0, 0.5), fake("delta", 1e-2, 0, 0.4),
               fake("delta", 1e-2, 1, 0.9),                        # another seed never takes part
               fake("s6", 1e-3, 0, 0.3), fake("s6", 3e-3, 0, 0.3), fake("s6", 1e-2, 0, 0.1)]
    assert tr.select_lr(records, "delta") == 3e-3
    assert tr.select_lr(records, "s6") == 1e-3                     # tie: the smaller rate
    assert tr.select_lr(records[:2], "delta") is None              # not every rate trained yet
    records[0]["val"]["accuracy"] = {"4": 1.0, "8": 0.05}          # mean 0.525: the mean over pair counts decides
    assert tr.select_lr(records, "delta") == 1e-3


def test_a_choice_at_the_top_of_the_sweep_extends_it_to_zoologys_largest_rate(tmp_path):
    records = [fake("linear", 1e-3, 0, 0.2), fake("linear", 3e-3, 0, 0.5), fake("linear", 1e-2, 0, 0.6)]
    assert tr.V2_LR_TOP > max(tr.V2_LRS) and tr.mixer_lrs(records, "linear") == tr.V2_LRS + (tr.V2_LR_TOP,)
    assert tr.select_lr(records, "linear") is None                  # 1e-2 wins: 3e-2 must be tried first
    assert tr.select_lr(records, "linear", lrs=tr.V2_LRS) == 1e-2
    for record in records:
        write(tmp_path, record)
    assert tr.sweep_plan(tmp_path)[-1] == ("linear", tr.V2_LR_TOP, 0)
    assert tr.select_lr(records + [fake("linear", tr.V2_LR_TOP, 0, 0.7)], "linear") == tr.V2_LR_TOP
    assert tr.select_lr(records + [fake("linear", tr.V2_LR_TOP, 0, 0.6)], "linear") == 1e-2   # tie: smaller
    interior = [fake("s6", 1e-3, 0, 0.2), fake("s6", 3e-3, 0, 0.5), fake("s6", 1e-2, 0, 0.4)]
    assert tr.mixer_lrs(interior, "s6") == tr.V2_LRS and tr.select_lr(interior, "s6") == 3e-3


def test_plan_puts_every_seed0_sweep_first_and_skips_saved_runs(tmp_path):
    plan = tr.sweep_plan(tmp_path)
    n = len(tr.V2_MIXERS) * len(tr.V2_LRS)
    assert len(plan) == n and all(seed == 0 for _, _, seed in plan)
    assert [lr for _, lr, _ in plan[:len(tr.V2_MIXERS)]] == [tr.V2_LRS[0]] * len(tr.V2_MIXERS)
    for lr, val in zip(tr.V2_LRS, (0.6, 0.3, 0.1)):
        write(tmp_path, fake("linear", lr, 0, val))
    write(tmp_path, fake("linear", 3e-3, 1, 0.5))                  # seed 1 at the chosen rate: already saved
    plan = tr.sweep_plan(tmp_path)
    assert not any(m == "linear" and s == 0 for m, _, s in plan)
    assert plan[-1] == ("linear", 3e-3, 2) and ("linear", 3e-3, 1) not in plan
    assert len(plan) == n - 3 + 1


def test_a_tiny_sweep_writes_loadable_records_with_validation_and_every_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "V2_MIXERS", ("gated_delta",))
    monkeypatch.setattr(tr, "EVAL_ROWS", 16)
    monkeypatch.setattr(tr, "VAL_ROWS", 16)
    assert tr.main(["--sweep", "--steps", "8", "--out", str(tmp_path)]) == 0
    names = sorted(p.stem for p in tmp_path.glob("*.json"))
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert len(names) == len(tr.mixer_lrs(records, "gated_delta")) + 2   # the rates at seed 0, then seeds 1, 2
    chosen = tr.select_lr(records, "gated_delta")
    assert {r["recipe"]["lr"] for r in records if r["seed"] > 0} == {chosen}
    record = records[0]
    assert record["protocol"] == "v2" and record["recipe"]["mqar_style"] == "zoology"
    assert record["config"]["gate"] == "gdn" and record["config"]["conv"] == "mixer"
    assert record["config"]["conv_width"] == 4 and record["config"]["vocab_size"] == tr.V2_VOCAB
    assert record["val"]["seed"] != record["eval"]["seed"] and record["val"]["sha256"] != record["eval"]["sha256"]
    assert {n: len(v) for n, v in record["losses_by_pairs"].items()} == {"4": 2, "8": 2, "12": 2, "16": 2}
    assert record["torch"] == torch.__version__ and record["cpu_seconds"] > 0
    model = load_recall_model(record["run"], tmp_path)
    assert model.config.gate == "gdn"
    assert tr.main(["--sweep", "--steps", "8", "--out", str(tmp_path)]) == 0   # nothing left: nothing retrained
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == names
    assert all(json.loads((tmp_path / f"{n}.json").read_text()) == r for n, r in zip(names, records))


SHIPPED = [json.loads(p.read_text()) for p in sorted(tr.RECALL_V2_DIR.glob("*.json"))]


def test_loss_tail_compares_the_last_tenth_with_the_tenth_before_per_pair_count():
    record = {"run": "x", "losses_by_pairs": {"4": [9.0] * 80 + [3.0] * 10 + [1.0] * 10, "8": [2.0] * 20}}
    assert tr.loss_tail(record) == {"4": (3.0, 1.0), "8": (2.0, 2.0)}
    with pytest.raises(ValueError, match="too few"):
        tr.loss_tail({"run": "x", "losses_by_pairs": {"4": [1.0]}})


def test_shipped_swept_runs_follow_the_protocol():
    assert SHIPPED, f"no run of the swept protocol in {tr.RECALL_V2_DIR}"
    total = sum(p.stat().st_size for p in tr.RECALL_V2_DIR.iterdir() if p.is_file())
    assert total < 8 * 2**20, f"the swept runs take {total / 2**20:.1f} MiB"
    for record in SHIPPED:
        assert record["recipe"]["steps"] == tr.V2_STEPS and record["recipe"]["lr"] in tr.mixer_lrs(SHIPPED, record["config"]["mixer"])
        assert record["config"] == tr.v2_config(record["config"]["mixer"]).__dict__
        assert record["run"] == tr.v2_run_name(record["config"]["mixer"], record["recipe"]["lr"], record["seed"])
        assert (tr.RECALL_V2_DIR / f"{record['run']}.safetensors").exists()
        steps = sum(len(v) for v in record["losses_by_pairs"].values())
        assert steps == tr.V2_STEPS
        if record["seed"] > 0:      # other seeds only at the rate the rule chose from the seed-0 runs
            assert record["recipe"]["lr"] == tr.select_lr(SHIPPED, record["config"]["mixer"])


def test_shipped_budget_runs_are_each_mixers_chosen_runs_at_twice_the_steps():
    budget = [json.loads(p.read_text()) for p in sorted((tr.RECALL_V2_DIR / "budget").glob("*.json"))]
    assert budget, "no run of the budget check shipped"
    total = sum(p.stat().st_size for p in (tr.RECALL_V2_DIR / "budget").iterdir())
    assert total < 6 * 2**20, f"the budget runs take {total / 2**20:.1f} MiB"
    for record in budget:
        mixer = record["config"]["mixer"]
        lr = tr.select_lr(SHIPPED, mixer)
        seed = record["seed"]
        assert seed in tr.SEEDS, record["run"]
        assert record["run"] == tr.budget_run_name(mixer, lr, seed) == f"{tr.v2_run_name(mixer, lr, seed)}_steps6000"
        assert record["recipe"]["steps"] == tr.BUDGET_STEPS == 2 * tr.V2_STEPS and record["recipe"]["lr"] == lr
        assert record["config"] == tr.v2_config(mixer).__dict__
        assert sum(len(v) for v in record["losses_by_pairs"].values()) == tr.BUDGET_STEPS
        assert (tr.RECALL_V2_DIR / "budget" / f"{record['run']}.safetensors").exists()
    assert tr.budget_plan(tr.RECALL_V2_DIR, tr.RECALL_V2_DIR / "budget") == []   # every planned run is shipped
    assert {(r["config"]["mixer"], r["seed"]) for r in budget} == {(m, s) for m in tr.V2_MIXERS for s in tr.SEEDS}
