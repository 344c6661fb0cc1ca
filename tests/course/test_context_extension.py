"""Notebook 12's package side: ALiBi in the tiny decoder, load_tiny_decoder(rope_scaling, max_len),
train_tiny's options, the shipped fine-tuned models and context_eval's saved measurements."""

import hashlib
import json
import math

import pytest
import torch
from helpers import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.course import context_eval
from selfattn_lite.models import (
    CONFIG_FILE,
    DATA_DIR,
    WEIGHTS_FILE,
    load_text,
    load_tiny_decoder,
)
from selfattn_lite.positions import scaled_inv_freq


# ---------------------------------------------------------------- ALiBi in the decoder
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 50), T=st.integers(2, 20), split=st.integers(1, 19), heads=st.sampled_from([4, 2, 1]))
def test_alibi_decoder_cached_equals_uncached(seed, T, split, heads):
    model = tiny_model(seed, position="alibi", n_kv_heads=heads)
    ids = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(seed))
    split = min(split, T - 1)
    with torch.no_grad():
        full = model(ids)
        caches = model.new_caches(2)
        parts = torch.cat([model(ids[:, :split], caches=caches), model(ids[:, split:], caches=caches)], dim=1)
    torch.testing.assert_close(parts, full, atol=1e-5, rtol=1e-5)
    assert model.rope is None


def _captured_weights(model, ids):
    weights = []
    pre = model.blocks[0].attn.register_forward_pre_hook(lambda m, a, kw: (a, {**kw, "need_weights": True}),
                                                        with_kwargs=True)
    post = model.blocks[0].attn.register_forward_hook(lambda m, a, kw, out: weights.append(out[1]), with_kwargs=True)
    with torch.no_grad():
        model(ids)
    pre.remove()
    post.remove()
    return weights[0]


def test_alibi_bias_is_minus_slope_times_distance_to_earlier_keys():
    model = tiny_model(1, position="alibi", n_heads=4)
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.zero_()                   # scores = the bias alone
    T = 7
    got = _captured_weights(model, torch.randint(0, 11, (1, T)))[0]  # (h, T, T)
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)])
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    scores = (-slopes[:, None, None] * (i - j)).masked_fill(j > i, float("-inf"))
    torch.testing.assert_close(got, scores.softmax(-1))


def test_rope_decoder_unchanged_by_the_new_options():
    a, b = tiny_model(3), tiny_model(3, position="rope", rope_scaling=None)
    ids = torch.randint(0, 11, (1, 12))
    torch.testing.assert_close(a(ids), b(ids), atol=0, rtol=0)


@pytest.mark.parametrize("kw, pattern", [
    (dict(position="xpos"), "position must be 'rope' or 'alibi'"),
    (dict(position="alibi", rope_scaling={"kind": "linear", "factor": 2.0}), "rope_scaling applies to"),
    (dict(rope_scaling={"kind": "linear"}), "needs \\['factor'\\]"),
    (dict(rope_scaling={"kind": "pi", "factor": 2.0}), "unknown scaling kind"),
])
def test_config_errors(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        tiny_model(**kw)


# ---------------------------------------------------------------- load_tiny_decoder(rope_scaling, max_len)
def test_load_with_scaling_and_longer_context():
    plain = load_tiny_decoder()
    assert plain.config.rope_scaling is None and plain.config.max_len == 512
    scaling = {"kind": "yarn", "factor": 4.0, "original_max_len": 512}
    model = load_tiny_decoder(rope_scaling=scaling, max_len=2048)
    assert model.config.max_len == 2048 and model.info == plain.info
    inv_freq, mscale = scaled_inv_freq(16, 10000.0, scaling)
    torch.testing.assert_close(model.rope.inv_freq, inv_freq)
    assert model.rope.attention_scaling == mscale == pytest.approx(0.1 * math.log(4) + 1)
    for name, p in plain.state_dict().items():                       # the same weights
        torch.testing.assert_close(model.state_dict()[name], p, atol=0, rtol=0)
    ids = torch.randint(0, 62, (1, 600))
    with pytest.raises(ValueError, match="exceed max_len=512"):
        plain(ids)
    assert model(ids).shape == (1, 600, 62)
    longer = load_tiny_decoder(max_len=1024)                         # no scaling: identical logits within 512
    torch.testing.assert_close(longer(ids[:, :100]), plain(ids[:, :100]), atol=0, rtol=0)


# ---------------------------------------------------------------- context_eval
def test_eval_windows_and_buckets():
    ids = torch.arange(100)
    w = context_eval.eval_windows(ids, 9)                            # windows of 10
    assert w.shape == (10, 10) and torch.equal(w[1], torch.arange(10, 20))
    with pytest.raises(ValueError, match="hold 10 windows"):
        context_eval.eval_windows(ids, 9, 11)
    torch.testing.assert_close(context_eval.bucket_means(torch.arange(8.0), 4), torch.tensor([1.5, 5.5]))
    with pytest.raises(ValueError, match="not a multiple"):
        context_eval.bucket_means(torch.arange(6.0), 4)
    with pytest.raises(ValueError, match="unknown method"):
        context_eval.load_method("rope2")


def test_loss_per_position_is_cross_entropy():
    model = load_tiny_decoder()
    windows = torch.randint(0, 62, (2, 33), generator=torch.Generator().manual_seed(0))
    got = context_eval.loss_per_position(model, windows)
    with torch.no_grad():
        logits = model(windows[:, :-1])
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")
    torch.testing.assert_close(got.float(), expected, atol=1e-5, rtol=1e-5)


def test_loss_with_context_cut_reads_each_target_from_at_most_context_tokens():
    model = tiny_model(max_len=64)
    windows = torch.randint(0, 11, (2, 49), generator=torch.Generator().manual_seed(0))   # T = 48
    cut = context_eval.loss_with_context_cut(model, windows, context=16, stride=8)      # (2, 32)
    assert cut.shape == (2, 32)
    for col in range(32):                                                     # target of column 16 + col
        t = 16 + col
        end = 16 + 8 * (col // 8 + 1)                                         # its group ends at column end - 1
        start = end - 16                                                      # read from tokens start .. t
        alone = context_eval.loss_per_position(model, windows[:, start:t + 2])[:, -1]
        torch.testing.assert_close(cut[:, col], alone)
        assert 16 - 8 < t - start + 1 <= 16                                   # between context - stride + 1 and 16
    with pytest.raises(ValueError, match="multiple of stride"):
        context_eval.loss_with_context_cut(model, windows, context=16, stride=5)


def test_attention_entropy_of_uniform_rows_is_log_of_the_row_length():
    model = tiny_model(2, max_len=64)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.zero_()                         # every score 0: uniform causal rows
    T, last = 40, 8
    got = context_eval.attention_entropy(model, torch.randint(0, 11, (2, T)), last=last)
    expected = sum(math.log(i + 1) for i in range(T - last, T)) / last
    assert got == pytest.approx(expected, rel=1e-6)                 # float32 weights


def test_shipped_fine_tuned_models_and_their_records():
    base_sha = hashlib.sha256(WEIGHTS_FILE.read_bytes()).hexdigest()
    data_sha = json.loads(CONFIG_FILE.read_text())["data"]["sha256"]
    assert hashlib.sha256(load_text().encode()).hexdigest() == data_sha
    for method, stem in context_eval.FINE_TUNED.items():
        info = json.loads((DATA_DIR / f"{stem}.json").read_text())
        assert info["init_from"] == {"file": WEIGHTS_FILE.name, "sha256": base_sha}
        assert info["data"]["sha256"] == data_sha
        assert info["model"]["max_len"] == info["training"]["seq_len"] == 2048
        assert info["model"]["rope_scaling"] == context_eval.scalings()[method.removesuffix("_ft")] | (
            {"beta_fast": 32.0, "beta_slow": 1.0} if method == "yarn_ft" else {})
        assert info["training"]["seconds"] > 0 and info["training"]["history"]
        model = context_eval.load_method(method)
        assert model.config.rope_scaling == info["model"]["rope_scaling"]


def test_saved_measurements_agree_with_the_shipped_models():
    results = json.loads(context_eval.RESULTS_FILE.read_text())
    tokenizer = load_tiny_decoder().tokenizer
    windows = context_eval.eval_windows(context_eval.held_out_ids(tokenizer))
    assert results["n_windows"] == len(windows) >= 10
    assert set(results["loss"]) == (set(context_eval.ZERO_SHOT) | {context_eval.NO_TEMPERATURE}
                                    | set(context_eval.FINE_TUNED) | set(context_eval.ALIBI))
    last = windows[-1:]                                              # the notebook re-measures window 0
    for method, saved in results["loss"].items():
        got = context_eval.bucket_means(context_eval.loss_per_position(context_eval.load_method(method), last))[0]
        torch.testing.assert_close(got, torch.tensor(saved["per_window_bucket"][-1], dtype=torch.float64),
                                   atol=2e-4, rtol=0)
        per_window = torch.tensor(saved["per_window_bucket"])
        torch.testing.assert_close(per_window.mean(0), torch.tensor(saved["bucket"], dtype=per_window.dtype),
                                   atol=1e-4, rtol=0)
    n = 512
    w = context_eval.eval_windows(context_eval.held_out_ids(tokenizer), 2048, 4)[:, :n]   # nested prefixes
    k = results["entropy"]["lengths"].index(n)
    got = context_eval.attention_entropy(load_tiny_decoder(max_len=n), w)
    assert got == pytest.approx(results["entropy"]["none"][k], abs=1e-4)


def test_no_temperature_is_yarns_frequencies_with_cos_and_sin_not_scaled():
    plain, yarn = context_eval.load_method(context_eval.NO_TEMPERATURE), context_eval.load_method("yarn")
    assert plain.rope.attention_scaling == 1.0 and yarn.rope.attention_scaling > 1.0
    torch.testing.assert_close(plain.rope.inv_freq, yarn.rope.inv_freq, atol=0, rtol=0)


def test_shipped_alibi_model_has_the_rope_models_recipe():
    rope = json.loads(CONFIG_FILE.read_text())
    alibi = json.loads((DATA_DIR / "tiny_decoder_alibi.json").read_text())
    assert alibi["model"] == {**rope["model"], "position": "alibi"}
    assert alibi["data"] == rope["data"] and alibi["n_params"] == rope["n_params"]
    for key in ("steps", "batch", "seq_len", "tokens", "lr", "warmup", "weight_decay", "seed", "threads", "torch"):
        assert alibi["training"][key] == rope["training"][key], key
    model = context_eval.load_method("alibi")
    assert model.rope is None and model.config.max_len == 2048
    assert model.info["val_loss"] == alibi["val_loss"] < 2.0


# ---------------------------------------------------------------- train_tiny's options
def test_train_tiny_alibi_and_fine_tune_options(tmp_path, capsys):
    from selfattn_lite.course import train_tiny

    train_tiny.main(["--steps", "2", "--batch", "1", "--seq-len", "64", "--position", "alibi",
                     "--out", str(tmp_path), "--name", "a"])
    info = json.loads((tmp_path / "a.json").read_text())
    assert info["model"]["position"] == "alibi" and info["training"]["seq_len"] == 64
    model = load_tiny_decoder(tmp_path / "a.safetensors", tmp_path / "a.json")
    assert model.rope is None and model.config.max_len == 64

    train_tiny.main(["--steps", "1", "--batch", "1", "--seq-len", "128", "--warmup", "1",
                     "--init-from", str(WEIGHTS_FILE), "--rope-scaling", '{"kind": "linear", "factor": 2}',
                     "--out", str(tmp_path), "--name", "b"])
    info = json.loads((tmp_path / "b.json").read_text())
    assert info["model"]["rope_scaling"] == {"kind": "linear", "factor": 2.0}
    assert info["init_from"]["sha256"] == hashlib.sha256(WEIGHTS_FILE.read_bytes()).hexdigest()
    tuned = load_tiny_decoder(tmp_path / "b.safetensors", tmp_path / "b.json")
    torch.testing.assert_close(tuned.rope.inv_freq, scaled_inv_freq(16, 10000.0, {"kind": "linear", "factor": 2})[0])
    assert "saved" in capsys.readouterr().out


# ---------------------------------------------------------------- the widget
def test_context_extension_widget_measures_what_it_shows():
    from selfattn_lite import viz

    tokenizer = load_tiny_decoder().tokenizer
    windows = context_eval.eval_windows(context_eval.held_out_ids(tokenizer), 256, 1)     # (1, 257)
    w = viz.ContextExtensionWidget(load_tiny_decoder, windows, 128, context_eval.loss_per_position,
                                   bucket=64, kind="none", factor=2.0)
    expected = context_eval.bucket_means(context_eval.loss_per_position(load_tiny_decoder(max_len=256), windows),
                                         64)[0]
    torch.testing.assert_close(torch.from_numpy(w.baseline), expected)
    assert w.scaling is None and w.renders == 1
    w.kind.value = "yarn"
    assert w.scaling == {"kind": "yarn", "factor": 2.0, "original_max_len": 128} and w.renders == 2
    model = load_tiny_decoder(rope_scaling=w.scaling, max_len=256)
    torch.testing.assert_close(torch.from_numpy(w.losses),
                               context_eval.bucket_means(context_eval.loss_per_position(model, windows), 64)[0])
    assert w.image.value[:4] == b"\x89PNG"
    titles = [ax.get_title() for ax in w.figure.axes]                    # the title says the range it plots
    assert titles[0] == "Mean loss per 64-position bucket, positions 0-256, 1 window"
    assert "past the trained length" not in " ".join(titles)
    with pytest.raises(ValueError, match="unknown method"):
        viz.ContextExtensionWidget(load_tiny_decoder, windows, 128, context_eval.loss_per_position, kind="alibi")
