"""The attention explorer: every head of a real model, one layer at a time.

Left, a thumbnail of each head of the chosen layer (the selected one framed); right,
the selected head enlarged with its tokens, or the mean over the layer's heads. Focus
on one query token and its row is outlined, its strongest keys written in the cells
and listed under the figure.

``draw_explorer`` makes the static figure (for GitHub/nbviewer); ``AttentionExplorer``
is the widget. Through ``HeatmapWidget``'s blitting (``refresh`` + ``dynamic_artists``) it
builds the figure once per sentence and afterwards only swaps image data, frames and
labels, so a control change costs one render of those artists and one PNG encode.
"""

from __future__ import annotations

import html
import math
import time

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .core import CMAP, HeatmapWidget

__all__ = ["ExplorerView", "draw_explorer", "top_keys", "AttentionExplorer"]

SELECTED = "#D55E00"   # vermillion (Okabe-Ito), visible on every viridis colour
TOP_K = 3


def top_keys(row: torch.Tensor, tokens: list[str], k: int = TOP_K) -> list[tuple[int, str, float]]:
    """The k largest weights of one query row (S,): [(key index, key token, weight)], largest first."""
    k = min(k, row.numel())
    values, indices = row.topk(k)
    return [(int(j), tokens[int(j)], float(w)) for w, j in zip(values, indices)]


def _label_size(T: int) -> float:
    return 9.0 if T <= 16 else 8.0 if T <= 24 else 7.0 if T <= 40 else 5.5


class ExplorerView:
    """The explorer's figure for one sentence; ``show(...)`` changes what it displays in place.

    Args:
        fig: an empty matplotlib Figure.
        maps: ``selfattn_lite.explore.AttentionMaps`` with tokens and (n_layers, n_heads, T, T) weights.
        animated: mark the artists that ``show`` changes as animated (listed in ``dynamic``), so a
            widget can draw the static rest once and afterwards re-draw only those (blitting).
            The titles and the caption are then left out of the figure (text is the slowest
            thing to render); the widget shows ``header`` and ``caption`` as HTML instead.
    """

    def __init__(self, fig: Figure, maps, animated: bool = False):
        self.fig, self.maps = fig, maps
        n_heads, T = maps.n_heads, len(maps.tokens)
        cols = math.ceil(math.sqrt(n_heads * 4 / 3))
        rows = math.ceil(n_heads / cols)
        height = fig.get_size_inches()[1]
        size = _label_size(T)
        below = max(map(len, maps.tokens)) * size * 0.6 / 72 + 0.35 + (0 if animated else 0.3)  # inches
        top = 1 - (0.45 if not animated else 0.15) / height
        outer = fig.add_gridspec(1, 2, width_ratios=[1.0, 1.3], left=0.02, right=0.93, top=top,
                                 bottom=below / height, wspace=0.22)
        grid = outer[0].subgridspec(rows, cols, wspace=0.08, hspace=0.3)
        blank = torch.zeros(T, T).numpy()
        self.thumbs, self.thumb_images, self.frames = [], [], []
        for h in range(rows * cols):
            ax = fig.add_subplot(grid[h // cols, h % cols])
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_axis_off() if h >= n_heads else ax.set_title(f"head {h}", fontsize=7, pad=2)
            if h >= n_heads:
                continue
            self.thumb_images.append(ax.imshow(blank, cmap=CMAP, vmin=0, vmax=1, interpolation="nearest"))
            self.frames.append(ax.add_patch(Rectangle((0, 0), 1, 1, transform=ax.transAxes, fill=False,
                                                      clip_on=False, ec=SELECTED, lw=3, visible=False)))
            self.thumbs.append(ax)

        self.ax = ax = fig.add_subplot(outer[1])
        self.image = ax.imshow(blank, cmap=CMAP, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(T), maps.tokens, rotation=90, fontsize=size)
        ax.set_yticks(range(T), maps.tokens, fontsize=size)
        ax.set_xlabel("key (attended to)", fontsize=9)
        ax.set_ylabel("query (attending)", fontsize=9)
        fig.colorbar(self.image, ax=ax, fraction=0.04, pad=0.02).ax.tick_params(labelsize=7)
        self.row_box = ax.add_patch(Rectangle((-0.5, -0.5), T, 1, fill=False, ec=SELECTED, lw=2.2,
                                              visible=False))
        self.row_marker, = ax.plot([-0.5], [0], marker=">", markersize=8, color=SELECTED, clip_on=False,
                                   visible=False)
        self.cell_texts = [ax.text(0, 0, "", ha="center", va="center", fontsize=max(size - 1, 5),
                                   fontweight="bold", visible=False) for _ in range(TOP_K)]
        self.dynamic = [*self.thumb_images, *self.frames, self.image, self.row_box, self.row_marker,
                        *self.cell_texts]
        for artist in self.dynamic:
            artist.set_animated(animated)
        self.texts_in_figure = not animated
        if self.texts_in_figure:
            self.suptitle = fig.suptitle("", fontsize=10, x=0.02, ha="left")
            self.caption_text = fig.text(0.02, 0.02, "", fontsize=9, ha="left", va="bottom")
        self.header = self.caption = ""
        self.layer = self.head = self.query = None
        self.average = False

    def weights(self) -> torch.Tensor:
        """(T, T) weights on display: the selected head, or the layer's mean over heads."""
        return self.maps.head(self.layer, None if self.average else self.head)

    def show(self, layer: int, head: int, query: int | None = None, average: bool = False) -> None:
        """Display layer/head (or the head average) with the optional query row in focus."""
        maps, T = self.maps, len(self.maps.tokens)
        if query is not None and not 0 <= query < T:
            raise ValueError(f"query must be a token index in 0..{T - 1} or None, got {query}")
        w_head = maps.head(layer, head)                                    # validates layer and head
        if layer != self.layer:
            for h, image in enumerate(self.thumb_images):
                image.set_data(maps.weights[layer, h].numpy())
        for h, frame in enumerate(self.frames):
            frame.set_visible(average or h == head)
        self.layer, self.head, self.query, self.average = layer, head, query, average
        w = maps.head(layer, None) if average else w_head                 # (T, T)
        self.image.set_data(w.numpy())
        what = f"the mean of its {maps.n_heads} heads" if average else f"head {head}"
        self.header = (f"{maps.model}: the {maps.n_heads} heads of layer {layer} (framed: shown enlarged); "
                       f"right: {what}, each row sums to 1")
        for artist in (self.row_box, self.row_marker, *self.cell_texts):
            artist.set_visible(False)
        if query is None:
            self.caption = ("" if self.texts_in_figure else
                            "Pick a query token to outline its row and list the keys it attends to most.")
        else:
            self._focus(w, query)
        if self.texts_in_figure:
            self.suptitle.set_text(self.header)
            self.caption_text.set_text(self.caption)

    def _focus(self, w: torch.Tensor, query: int) -> None:
        """Outline the query's row, write its top weights in their cells, list them in the caption."""
        maps = self.maps
        self.row_box.set_y(query - 0.5)
        self.row_marker.set_ydata([query])
        self.row_box.set_visible(True)
        self.row_marker.set_visible(True)
        best = top_keys(w[query], maps.tokens)
        for text, (j, _, value) in zip(self.cell_texts, best):
            if value < 0.01:
                continue                                   # nothing worth writing in the cell
            label = f"{value:.2f}"
            text.set_text(label[1:] if label.startswith("0") else label)   # ".42" fits a small cell
            text.set_position((j, query))
            text.set_color("black" if value > 0.6 else "white")
            text.set_visible(True)
        keys = ", ".join(f"{tok} ({j}) {value:.2f}" for j, tok, value in best)
        self.caption = f"Query {maps.tokens[query]!r} ({query}) attends most to: {keys}"


def _figsize(T: int) -> tuple[float, float]:
    return (11.0, max(4.6, 1.6 + 0.14 * T))


def draw_explorer(maps, layer: int = 0, head: int = 0, query: int | None = None, average: bool = False,
                  fig: Figure | None = None) -> Figure:
    """The explorer as a static figure (what the widget shows for these settings).

    Args:
        maps: ``AttentionMaps`` (tokens, weights (n_layers, n_heads, T, T)).
        layer, head: which head to enlarge. query: token index whose row to outline, or None.
        average: enlarge the mean over the layer's heads instead of one head.
        fig: draw into this (empty) figure, e.g. ``plt.figure(figsize=...)``; default a new one.
    """
    if fig is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        fig = Figure(figsize=_figsize(len(maps.tokens)), dpi=80)
        FigureCanvasAgg(fig)
    ExplorerView(fig, maps).show(layer, head, query, average)
    return fig


class AttentionExplorer(HeatmapWidget):
    """Explore every head of a model: layer and head buttons, head averaging, a query focus, your own text.

    Args:
        text: the sentence to start with.
        run: text -> ``AttentionMaps`` (default ``selfattn_lite.explore.explore``, the pretrained
            encoder, cached per sentence); pass ``explore_decoder`` for the tiny decoder.
        layer, head, query: the starting selection (query: a token index or None).

    Attributes:
        maps: the current ``AttentionMaps``; ``weights`` the (T, T) matrix on display;
        ``last_ms`` how long the last re-draw took (compute + render + PNG).
    """

    def __init__(self, text: str = "The cat sat on the mat because it was tired", run=None,
                 layer: int = 0, head: int = 0, query: int | None = None):
        import ipywidgets as widgets

        if run is None:
            from ..explore import explore as run
        self.run = run
        self.maps = run(text)
        self.view: ExplorerView | None = None      # None: the figure is (re)built at the next update
        self._quiet = False
        self.last_ms = float("nan")
        maps = self.maps
        buttons = dict(style={"button_width": "42px", "description_width": "50px"})
        self.text = widgets.Text(value=text, description="sentence", continuous_update=False,
                                 layout=widgets.Layout(width="640px"),
                                 style={"description_width": "70px"})
        self.layer = widgets.ToggleButtons(options=list(range(maps.n_layers)), value=layer,
                                           description="layer", **buttons)
        self.head = widgets.ToggleButtons(options=list(range(maps.n_heads)), value=head,
                                          description="head", **buttons)
        self.average = widgets.Checkbox(value=False, description="average all heads", indent=False)
        self.query = widgets.Dropdown(options=self._query_options(), value=query, description="query",
                                      style={"description_width": "70px"})
        self.header = widgets.HTML()
        self.status = widgets.HTML()
        super().__init__([self.text, self.layer, self.head, self.average, self.query],
                         figsize=_figsize(len(maps.tokens)), dpi=80)
        self.ui = widgets.VBox([self.text, widgets.HBox([self.query, self.average]), self.layer, self.head,
                                self.header, self.image, self.status])
        self.ui.add_class("selfattn-explorer")
        self.layer.add_class("selfattn-layer")
        self.head.add_class("selfattn-head")
        self.image.add_class("selfattn-heatmap")
        self.update()

    def _query_options(self) -> list:
        return [("(none)", None)] + [(f"{i}: {tok}", i) for i, tok in enumerate(self.maps.tokens)]

    @property
    def weights(self) -> torch.Tensor:
        """(T, T) weights on display."""
        return self.view.weights()

    def _on_change(self, change) -> None:
        if self._quiet:
            return
        if change["owner"] is self.text:
            self.set_text(change["new"])
        else:
            self.update()

    def set_text(self, text: str) -> None:
        """Run a new text through the model and show it (keeps layer, head, and the query token if present)."""
        try:
            maps = self.run(text)
        except ValueError as error:
            self.status.value = f"<span style='color:{SELECTED}'>{html.escape(str(error))}</span>"
            return
        old = self.maps.tokens[self.query.value] if self.query.value is not None else None
        self.maps, self.view = maps, None
        self._quiet = True
        try:
            if self.text.value != text:
                self.text.value = text
            self.query.options = self._query_options()
            self.query.value = maps.tokens.index(old) if old in maps.tokens else None
        finally:
            self._quiet = False
        self.figure.set_size_inches(*_figsize(len(maps.tokens)))
        self.update()

    def _show(self, view: ExplorerView) -> None:
        view.show(self.layer.value, self.head.value, self.query.value, self.average.value)

    def draw(self, fig: Figure) -> None:
        """Build the view for the current text; in the widget's own figure it is kept and blitted."""
        view = ExplorerView(fig, self.maps, animated=fig is self.figure)
        self._show(view)
        if fig is self.figure:
            self.view = view

    def refresh(self, fig: Figure) -> bool:
        """The same text: only the data, frames and labels change (False: a new text, draw it again)."""
        if self.view is None:
            return False
        self._show(self.view)
        return True

    def dynamic_artists(self) -> list:
        return self.view.dynamic

    def update(self) -> None:
        """Re-draw through ``HeatmapWidget.update``, then the header and caption under the controls."""
        start = time.perf_counter()
        super().update()
        self.header.value = f"<b>{html.escape(self.view.header)}</b>"
        self.status.value = html.escape(self.view.caption)
        self.last_ms = (time.perf_counter() - start) * 1e3
