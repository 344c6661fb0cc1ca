import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from selfattn_lite import viz  # noqa: E402


def test_heatmap_labels_values_and_masked_cells():
    w = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    ax = viz.attention_heatmap(w, ["a", "b"], ["x", "y"], masked=torch.tensor([[False, True], [False, False]]))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert sorted(t.get_text() for t in ax.texts) == ["-inf", "0.30", "0.70", "1.00"]
    assert ax.images[0].get_cmap().name.startswith(viz.CMAP)


def test_heatmap_bad_input():
    with pytest.raises(ValueError, match=r"\(L, S\) matrix, got shape \(2, 2, 2\)"):
        viz.attention_heatmap(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="query_labels has 3 labels for 2 rows"):
        viz.attention_heatmap(torch.zeros(2, 2), ["a", "b", "c"])


def test_temperature_widget_slider_changes_the_plotted_data():
    scores = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    w = viz.TemperatureWidget(scores, list("abcd"), list("abcd"))
    png_before, data_before = w.image.value, w.figure.axes[0].images[0].get_array().copy()
    torch.testing.assert_close(w.weights, torch.softmax(scores, -1))
    w.slider.value = 0.1
    data_after = torch.tensor(w.figure.axes[0].images[0].get_array().data)
    torch.testing.assert_close(data_after, torch.softmax(scores / 0.1, -1))
    assert not torch.allclose(torch.tensor(data_before.data), data_after)
    assert w.image.value != png_before and w.image.value[:4] == b"\x89PNG"
    assert "τ = 0.10" in w.figure.axes[0].get_title()
    cell_texts = [t.get_text() for t in w.figure.axes[0].texts]
    assert cell_texts == [format(x, ".2f") for x in data_after.flatten().tolist()]
    assert w.renders == 2


def test_temperature_widget_does_not_grow_figure_or_outputs():
    w = viz.TemperatureWidget(torch.randn(3, 3))
    n_axes, n_texts = len(w.figure.axes), len(w.figure.axes[0].texts)
    for t in (0.2, 0.5, 2.0, 5.0):
        w.slider.value = t
    assert len(w.figure.axes) == n_axes and len(w.figure.axes[0].texts) == n_texts
    assert len(w.ui.children) == 2                       # controls + one image, replaced in place


def test_query_widget():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    w = viz.QueryWidget(keys, values, [1.0, 0.0])
    assert [round(x, 2) for x in w.weights.tolist()] == [0.40, 0.20, 0.40]
    png = w.image.value
    w.sliders[1].value = 1.0
    torch.testing.assert_close(w.weights, torch.softmax(keys @ torch.tensor([1.0, 1.0]) / 2**0.5, -1))
    torch.testing.assert_close(w.output, w.weights @ values)
    assert w.image.value != png
    fig = w.static_figure()
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match=r"keys must be \(S, 2\).*\(3, 3\)"):
        viz.QueryWidget(torch.zeros(3, 3), values, [1.0, 0.0])
