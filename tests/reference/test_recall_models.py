"""The recall models: the parameter budget, each mixer equal to the package's function it wraps, the
state sizes, and the shipped runs re-evaluated on fresh rows."""

import json

import pytest
import torch
import torch.nn.functional as F

from selfattn_lite.efficient import linear_attention_step
from selfattn_lite.recall import mqar
from selfattn_lite.recall_models import (
    MIXERS,
    PARAMETER_TOLERANCE,
    RECALL_DIR,
    RecallConfig,
    RecallModel,
    count_parameters,
    load_recall_model,
    recall_accuracy,
    recall_runs,
    state_bytes,
)
from selfattn_lite.recurrent import delta_rule_step, selective_scan_step


def test_every_mixer_has_the_same_parameter_budget_within_ten_percent():
    base = count_parameters(RecallConfig(mixer="attention"))
    for mixer in MIXERS:
        n = count_parameters(RecallConfig(mixer=mixer))
        assert abs(n - base) <= PARAMETER_TOLERANCE * base, f"{mixer}: {n} vs attention {base}"
    for mixer in ("linear", "delta", "gated_delta"):             # the state sweep over heads keeps the budget
        for n_heads in (1, 8):
            n = count_parameters(RecallConfig(mixer=mixer, n_heads=n_heads))
            assert abs(n - base) <= PARAMETER_TOLERANCE * base, f"{mixer}, {n_heads} heads: {n} vs attention {base}"
    # s6's sweep over the state size n does not: B, C and A grow by 3 d n per layer (stated in the notebook)
    assert count_parameters(RecallConfig(mixer="s6", d_state=64)) - count_parameters(RecallConfig(mixer="s6")) == \
        2 * 3 * 32 * (64 - 16)


@pytest.mark.parametrize("mixer", MIXERS)
def test_models_are_causal_and_shaped(mixer):
    torch.manual_seed(0)
    model = RecallModel(RecallConfig(mixer=mixer)).double().eval()
    ids = torch.randint(0, 64, (2, 20))
    logits = model(ids)
    assert logits.shape == (2, 20, 64)
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 64
    torch.testing.assert_close(model(changed)[:, :12], logits[:, :12])          # the future never leaks


def test_recurrent_mixers_decode_token_by_token_like_the_parallel_form():
    torch.manual_seed(0)
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    for mixer in ("delta", "gated_delta"):
        layer = RecallModel(RecallConfig(mixer=mixer)).double().blocks[0].mixer
        q = F.normalize(layer.split(layer.q_proj(x)), dim=-1)
        k = F.normalize(layer.split(layer.k_proj(x)), dim=-1)
        v = layer.split(layer.v_proj(x))
        beta, g = layer.gates(x)
        state, outs = torch.zeros(2, 2, 16, 16, dtype=torch.float64), []
        for t in range(11):
            o, state = delta_rule_step(state, q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                       g=None if g is None else g[:, :, t])
            outs.append(o)
        torch.testing.assert_close(layer.merge(torch.stack(outs, 2)), layer(x))
    layer = RecallModel(RecallConfig(mixer="linear")).double().blocks[0].mixer
    q, k, v = layer.split(layer.q_proj(x)), layer.split(layer.k_proj(x)), layer.split(layer.v_proj(x))
    state, outs = None, []
    for t in range(11):
        o, state = linear_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t])
        outs.append(o)
    torch.testing.assert_close(layer.merge(torch.stack(outs, 2)), layer(x))
    layer = RecallModel(RecallConfig(mixer="s6")).double().blocks[0].mixer
    u, delta, A, B, C = layer.scan_inputs(x)
    state, ys = torch.zeros(2, 32, 16, dtype=torch.float64), []
    for t in range(11):
        y, state = selective_scan_step(state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D=layer.D)
        ys.append(y)
    torch.testing.assert_close(layer.out_proj(torch.stack(ys, -1).transpose(1, 2)), layer(x))


def test_state_bytes():
    c = RecallConfig()
    assert state_bytes(c, "delta") == 2 * 16 * 16 * 4
    assert state_bytes(c, "linear") == 2 * (16 * 16 + 16) * 4
    assert state_bytes(c, "s6", bytes_per_value=2) == 32 * 16 * 2
    assert state_bytes(c, "window") == 2 * 8 * 32 * 4
    with pytest.raises(ValueError, match="'attention' layer has no constant-size state"):
        state_bytes(c, "attention")


@pytest.mark.parametrize("changes, match", [({"mixer": "lstm"}, "mixer must be one of"),
                                            ({"n_heads": 3}, "d_model=32 is not divisible by n_heads=3"),
                                            ({"window": 0}, "window must be a positive int, got 0")])
def test_bad_configs_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        RecallConfig(**changes)


# the shipped runs --------------------------------------------------------------------------------------
RUNS = recall_runs()
MARGIN = 0.06   # 512 fresh rows of 4-16 queries: the binomial standard error of an accuracy is <= 0.011


def test_every_shipped_run_has_its_record_and_weights():
    assert len(RUNS) >= 3 * len(MIXERS), "at least three seeds of every mixer"
    for record in RUNS:
        for key in ("config", "recipe", "seed", "data_seed", "seconds", "cpu_seconds", "torch", "losses", "accuracy"):
            assert key in record, f"{record['run']}: {key} missing"
        assert (RECALL_DIR / f"{record['run']}.safetensors").exists()
    for mixer in MIXERS:
        assert sum(r["config"]["mixer"] == mixer and r["run"].count("_") == mixer.count("_") + 1
                   for r in RUNS) >= 3, f"{mixer}: fewer than three seeds at the default shape"
    total = sum(p.stat().st_size for p in RECALL_DIR.iterdir())
    assert total < 8 * 2**20, f"the shipped runs take {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("run", ["attention_s0", "delta_s1", "s6_s2"])
def test_a_shipped_model_recalls_fresh_rows_as_recorded(run):
    model = load_recall_model(run)
    n = 8
    inputs, targets = mqar(512, model.info["recipe"]["seq_len"], n, model.config.vocab_size,
                           generator=torch.Generator().manual_seed(777))          # not the recorded eval seed
    fresh = recall_accuracy(model, inputs, targets)
    assert abs(fresh - model.info["accuracy"][str(n)]) <= MARGIN, (run, fresh, model.info["accuracy"])


def test_records_are_json_with_the_config_that_rebuilds_the_model():
    record = json.loads((RECALL_DIR / "hybrid_s0.json").read_text())
    assert RecallConfig(**record["config"]).layer_mixers == ("gated_delta", "attention")
    assert count_parameters(RecallConfig(**record["config"])) == record["n_params"]


def test_the_training_command_writes_a_loadable_run(tmp_path):
    from selfattn_lite.course import train_recall

    assert train_recall.main(["--mixer", "gated_delta", "--seed", "3", "--steps", "4", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "gated_delta_s3.json").read_text())
    assert record["recipe"]["steps"] == 4 and record["seed"] == 3 and record["torch"] == torch.__version__
    assert set(record["accuracy"]) == {"4", "8", "12", "16"} and record["cpu_seconds"] > 0
    model = load_recall_model("gated_delta_s3", tmp_path)
    assert model.config.mixer == "gated_delta" and count_parameters(model) == record["n_params"]
    names = [train_recall.run_name(c, s) for c, s in train_recall.grid()]
    assert len(names) == len(set(names)) and sum(n.endswith("_s0") for n in names) * 3 == len(names)
