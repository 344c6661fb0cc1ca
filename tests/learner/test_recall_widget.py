"""Notebook 16's widget: the controls change what is drawn, and what it reports matches the model."""

import pytest
import torch

from selfattn_lite import viz
from selfattn_lite.recall import mqar
from selfattn_lite.recall_models import RecallConfig, RecallModel


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {m: RecallModel(RecallConfig(mixer=m)).eval() for m in ("attention", "delta", "s6")}


def test_follow_query_reads_the_model(models):
    inputs, targets = mqar(1, 32, 4, 64, generator=torch.Generator().manual_seed(3))
    f = viz.follow_query(models["attention"], inputs, targets, which=2, layer=1)
    assert f.layer == 1
    asked = (targets[0] != -100).nonzero().flatten().tolist()
    assert f.query == asked[2] and f.target == targets[0, f.query].item()
    assert inputs[0, f.value].item() == f.target and inputs[0, f.value - 1].item() == inputs[0, f.query].item()
    assert f.weights.shape == (32, 32)
    torch.testing.assert_close(f.weights.sum(-1), torch.ones(32))               # softmax rows sum to 1
    assert f.prediction == models["attention"](inputs)[0, f.query].argmax().item()
    auto = viz.follow_query(models["attention"], inputs, targets, which=2)             # the layer that weighs it most
    other = viz.follow_query(models["attention"], inputs, targets, which=2, layer=1 - auto.layer)
    assert auto.weights[auto.query, auto.value] >= other.weights[other.query, other.value]
    with pytest.raises(ValueError, match="which=4 but the row has 4 queries"):
        viz.follow_query(models["attention"], inputs, targets, which=4)
    with pytest.raises(ValueError, match="one row"):
        viz.follow_query(models["attention"], inputs.repeat(2, 1), targets.repeat(2, 1))


def test_widget_controls(models):
    w = viz.RecallWidget(models, seq_len=32, n_pairs=4)
    assert w.renders == 1 and w.followed.mixer == "attention"
    w.mixer.value = "delta"
    assert w.renders == 2 and w.followed.mixer == "delta" and w.followed.layer in (0, 1)
    assert (w.followed.weights.triu(1) == 0).all()                              # causal: nothing from the future
    w.n_pairs.value = 6
    assert w.query.max == 5
    w.query.value = 5
    f = w.followed
    inputs, targets = w.row()
    assert f.query == (targets[0] != -100).nonzero().flatten().tolist()[5]
    w.mixer.value = "s6"
    assert w.followed.weights.shape == (32, 32)
    assert len(w.image.value) > 1000 and w.renders == 5
    axes = viz.draw_mixer_weights([viz.follow_query(models[m], inputs, targets) for m in models])
    assert len(axes) == 3


def test_widget_draws_rows_of_the_given_style(models):
    w = viz.RecallWidget(models, seq_len=32, n_pairs=4, seed=2, style="zoology")
    inputs, targets = w.row()
    want = mqar(1, 32, 4, 64, generator=torch.Generator().manual_seed(2), style="zoology")
    assert torch.equal(inputs, want[0]) and torch.equal(targets, want[1])
    assert len(set(inputs[0, 1:8:2].tolist())) == 4                           # Zoology's values: distinct
    assert w.followed.query == (targets[0] != -100).nonzero().flatten().tolist()[0]
    with pytest.raises(ValueError, match="style must be one of"):
        viz.RecallWidget(models, style="zoo")
