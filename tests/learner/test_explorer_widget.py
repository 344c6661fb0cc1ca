"""The attention explorer widget: each control changes what is drawn, in place, correctly."""

import io

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from selfattn_lite.explore import AttentionMaps, explore, explore_decoder
from selfattn_lite.models import CharTokenizer, DecoderConfig, TinyDecoder
from selfattn_lite.viz import AttentionExplorer, HeatmapWidget, draw_explorer, top_keys

TEXT = "The cat sat on the mat because it was tired"


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture
def widget():
    return AttentionExplorer(TEXT)


def test_builds_with_every_control(widget):
    assert isinstance(widget, HeatmapWidget)
    assert widget.image.value[:8] == b"\x89PNG\r\n\x1a\n" and widget.renders == 1
    assert list(widget.layer.options) == list(range(6)) and list(widget.head.options) == list(range(12))
    assert [label for label, _ in widget.query.options][:3] == ["(none)", "0: [CLS]", "1: the"]
    assert widget.maps.tokens[-1] == "[SEP]"
    assert torch.equal(widget.weights, widget.maps.weights[0, 0])


def test_layer_and_head_change_the_image_and_the_data(widget):
    maps, first = widget.maps, widget.image.value
    widget.layer.value = 5
    assert torch.equal(widget.weights, maps.weights[5, 0]) and widget.image.value != first
    for h, image in enumerate(widget.view.thumb_images):              # the thumbnails show layer 5
        np.testing.assert_array_equal(image.get_array(), maps.weights[5, h].numpy())
    second = widget.image.value
    widget.head.value = 11
    assert torch.equal(widget.weights, maps.weights[5, 11]) and widget.image.value != second
    assert [f.get_visible() for f in widget.view.frames] == [h == 11 for h in range(12)]
    assert "layer 5" in widget.header.value and "head 11" in widget.header.value
    assert widget.renders == 3


def test_head_average(widget):
    widget.layer.value = 2
    widget.average.value = True
    torch.testing.assert_close(widget.weights, widget.maps.weights[2].mean(0))
    assert all(f.get_visible() for f in widget.view.frames) and "mean of its 12 heads" in widget.header.value


def test_query_focus_outlines_the_row_and_lists_the_top_keys(widget):
    widget.layer.value, widget.head.value = 5, 11
    it = widget.maps.tokens.index("it")
    widget.query.value = it
    assert widget.view.row_box.get_visible() and widget.view.row_box.get_y() == it - 0.5
    values, keys = widget.maps.weights[5, 11, it].topk(3)
    assert [j for j, _, _ in top_keys(widget.weights[it], widget.maps.tokens)] == keys.tolist()
    assert widget.maps.tokens[keys[0]] == "cat"
    assert f"cat ({keys[0]}) {values[0]:.2f}" in widget.status.value
    shown = [t for t in widget.view.cell_texts if t.get_visible()]
    assert [t.get_position() for t in shown] == [(int(j), it) for j in keys[: len(shown)]]
    widget.query.value = None
    assert not widget.view.row_box.get_visible() and "Pick a query token" in widget.status.value


def test_redraws_in_place_and_match_a_fresh_full_draw(widget):
    """Blitting only the changed artists gives exactly the pixels of a figure drawn from scratch."""
    view, image, ui = widget.view, widget.image, widget.ui
    widget.layer.value, widget.head.value, widget.query.value = 4, 7, 3
    assert widget.view is view and widget.image is image and widget.ui is ui   # nothing rebuilt or added
    fresh = AttentionExplorer(TEXT, layer=4, head=7, query=3)
    np.testing.assert_array_equal(pixels(widget.image.value), pixels(fresh.image.value))
    assert widget.last_ms > 0


def test_redraws_through_the_base_class_and_its_static_copy(widget):
    """HeatmapWidget.update blits ExplorerView's changing artists; static_figure draws a full copy."""
    assert type(widget).png is HeatmapWidget.png and type(widget).update is not HeatmapWidget.update
    assert widget.dynamic_artists() == widget.view.dynamic and widget._background is not None
    background = widget._background
    widget.head.value = 3
    assert widget._background is background                     # the static rest is not redrawn
    widget.text.value = "The dog barked"
    assert widget._background is not background and widget.view.fig is widget.figure
    fig = widget.static_figure()                                 # a pyplot copy with titles in the figure
    assert widget.view.fig is widget.figure and fig is not widget.figure
    assert "head 3" in fig._suptitle.get_text() and fig._suptitle.get_text().startswith("all-MiniLM")
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_own_sentence_reruns_the_model_and_keeps_the_query_token(widget):
    widget.query.value = widget.maps.tokens.index("cat")
    widget.text.value = "Unbelievably, the cat ignored the dog"
    assert widget.maps.tokens[:4] == ["[CLS]", "un", "##bel", "##ie"]
    assert widget.maps is explore("Unbelievably, the cat ignored the dog")
    assert widget.query.value == widget.maps.tokens.index("cat")
    assert len(widget.query.options) == len(widget.maps.tokens) + 1
    assert widget.weights.shape == (len(widget.maps.tokens),) * 2
    widget.text.value = "   "                                           # bad text: a message, no exception
    assert "non-empty string" in widget.status.value and widget.maps.tokens[1] == "un"


def test_works_with_the_tiny_decoder():
    torch.manual_seed(0)
    model = TinyDecoder(DecoderConfig(vocab_size=28, d_model=32, n_layers=2, n_heads=4, max_len=64)).eval()
    model.tokenizer = CharTokenizer(" abcdefghijklmnopqrstuvwxyz.")
    w = AttentionExplorer("to be or not", run=lambda text: explore_decoder(text, model=model))
    assert list(w.head.options) == [0, 1, 2, 3] and w.maps.tokens[2] == "\u2423"
    w.layer.value = 1
    assert torch.equal(w.weights, w.maps.weights[1, 0])
    assert torch.all(w.weights.triu(1) == 0)


def test_static_figure_and_bad_input():
    maps = explore(TEXT)
    fig = draw_explorer(maps, layer=5, head=11, query=8)
    assert isinstance(fig, Figure)
    assert "layer 5" in fig._suptitle.get_text() and "'it' (8) attends most to: cat" in fig.texts[-1].get_text()
    with pytest.raises(ValueError, match=r"query must be a token index in 0\.\.11 or None, got 12"):
        draw_explorer(maps, query=12)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 5\], got 7"):
        draw_explorer(maps, layer=7)
    tiny = AttentionMaps(["a", "b"], torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]]))
    assert top_keys(tiny.weights[0, 0, 1], tiny.tokens, k=5) == [(1, "b", 0.75), (0, "a", 0.25)]
