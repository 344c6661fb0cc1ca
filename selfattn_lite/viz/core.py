"""Static attention heatmap and the widget base class.

Static figures use matplotlib (they read on GitHub and nbviewer). Widgets draw the
same figure into an ``ipywidgets.Image`` and redraw it in place when a control moves:
one output area, replaced, so nothing flickers and the notebook does not grow.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = [
    "CMAP",
    "attention_heatmap",
    "update_heatmap",
    "HeatmapWidget",
    "TemperatureWidget",
    "QueryWidget",
]

CMAP = "viridis"  # perceptually uniform and colour-blind safe
MASKED_COLOR = "#d9d9d9"


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32).cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def attention_heatmap(weights, query_labels: Sequence[str] | None = None,
                      key_labels: Sequence[str] | None = None, *, ax: Axes | None = None,
                      title: str | None = None, masked=None, annotate: bool | None = None,
                      fmt: str = ".2f", vmin: float = 0.0, vmax: float = 1.0, cmap: str = CMAP,
                      colorbar: bool = True) -> Axes:
    """Draw an (L, S) weight matrix: rows = queries, columns = keys.

    Args:
        weights: (L, S) tensor or array.
        query_labels, key_labels: tokens for the rows and columns.
        masked: optional (L, S) bool, True = masked out; those cells are grey and read "-inf".
        annotate: write the values in the cells (default: when L and S are both <= 12).

    Returns:
        The matplotlib Axes.
    """
    w = _as_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap expects an (L, S) matrix, got shape {w.shape}")
    L, S = w.shape
    for name, labels, n in (("query_labels", query_labels, L), ("key_labels", key_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels for {n} {'rows' if n == L else 'columns'}")
    if ax is None:  # a new pyplot figure, so it shows inline in a notebook
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(1.6 + 0.6 * max(S, 4), 1.0 + 0.5 * max(L, 3)))
    shown = np.ma.masked_array(w, mask=_as_numpy(masked).astype(bool) if masked is not None else None)
    cm = ax.figure.colorbar if colorbar else None
    colormap = matplotlib.colormaps[cmap].with_extremes(bad=MASKED_COLOR)
    image = ax.imshow(shown, cmap=colormap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if annotate is None:
        annotate = L <= 12 and S <= 12
    if annotate:
        for i in range(L):
            for j in range(S):
                if np.ma.is_masked(shown[i, j]):
                    ax.text(j, i, "-inf", ha="center", va="center", fontsize=8, color="#555555")
                else:
                    val = w[i, j]
                    light = (val - vmin) / max(vmax - vmin, 1e-12) > 0.6
                    ax.text(j, i, format(val, fmt), ha="center", va="center", fontsize=8,
                            color="black" if light else "white")
    ax.set_xticks(range(S), key_labels if key_labels is not None else range(S),
                  rotation=45 if key_labels is not None and max(map(len, key_labels), default=0) > 3 else 0,
                  ha="right" if key_labels is not None and max(map(len, key_labels), default=0) > 3 else "center")
    ax.set_yticks(range(L), query_labels if query_labels is not None else range(L))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if cm is not None:
        cm(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return ax


def update_heatmap(ax: Axes, weights, title: str | None = None, fmt: str = ".2f") -> None:
    """Put new (L, S) values into a heatmap drawn by ``attention_heatmap`` (same shape), in place.

    Much faster than drawing it again: the colours, the cell texts and the title change;
    the axes, labels and colorbar stay.
    """
    w = _as_numpy(weights)
    image = ax.images[0]
    old = image.get_array()
    image.set_data(np.ma.masked_array(w, mask=np.ma.getmaskarray(old)))
    vmin, vmax = image.get_clim()
    cells = [t for t in ax.texts if t.get_text() != "-inf"]
    if cells:
        visible = [(i, j) for i in range(w.shape[0]) for j in range(w.shape[1]) if not np.ma.getmaskarray(old)[i, j]]
        for text, (i, j) in zip(cells, visible):
            text.set_text(format(w[i, j], fmt))
            text.set_color("black" if (w[i, j] - vmin) / max(vmax - vmin, 1e-12) > 0.6 else "white")
    if title is not None:
        ax.set_title(title)


class HeatmapWidget:
    """Base class: controls above a figure drawn into an ``ipywidgets.Image``.

    Subclasses implement ``draw(fig)`` (a full drawing) and may implement ``refresh(fig)``
    (change the existing artists' data and return True, much faster) together with
    ``dynamic_artists()`` (what refresh changes; the rest is rendered once and blitted).
    ``update()`` recomputes and replaces the PNG in place. ``self.figure`` is the widget's
    matplotlib figure, ``static_figure()`` a pyplot copy to show next to the widget, and
    ``self.renders`` counts redraws (handy in tests).
    """

    def __init__(self, controls, figsize=(5.5, 4.0), dpi: int = 90):
        import ipywidgets as widgets

        self.figure = Figure(figsize=figsize, dpi=dpi)
        FigureCanvasAgg(self.figure)
        # shown at its own pixel size (not stretched to the cell), shrinking only on narrow screens
        width = f"{round(figsize[0] * dpi)}px"
        self.image = widgets.Image(format="png", layout=widgets.Layout(width=width, max_width="100%"))
        self.controls = list(controls)
        self.renders = 0
        self._background = None
        for control in self.controls:
            control.observe(self._on_change, names="value")
        controls = widgets.HBox(self.controls, layout=widgets.Layout(flex_flow="row wrap"))
        self.ui = widgets.VBox([controls, self.image])

    def _on_change(self, change) -> None:
        self.update()

    def draw(self, fig: Figure) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def refresh(self, fig: Figure) -> bool:
        """Update the drawn figure in place; False means "draw it again from scratch"."""
        return False

    def static_figure(self):
        """Draw the current state into a new pyplot figure: the static copy shown next to the
        widget, so the notebook also reads where widgets do not run (GitHub, nbviewer, HTML)."""
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=self.figure.get_size_inches(), dpi=self.figure.dpi)
        self.draw(fig)
        return fig

    def dynamic_artists(self) -> list:
        """Artists that ``refresh`` changes. When a subclass lists them, everything else is
        rendered once and cached (blitting), and each update redraws only these."""
        return []

    def png(self) -> bytes:
        """The figure as PNG bytes (fast path: cached background + dynamic artists)."""
        from PIL import Image

        canvas = self.figure.canvas
        dynamic = self.dynamic_artists()
        if dynamic and self._background is not None:
            canvas.restore_region(self._background)
        else:
            for artist in dynamic:
                artist.set_animated(True)      # left out of canvas.draw(): the background
            canvas.draw()
            self._background = canvas.copy_from_bbox(self.figure.bbox) if dynamic else None
        for artist in dynamic:
            self.figure.draw_artist(artist)
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buffer, format="png", compress_level=1)
        return buffer.getvalue()

    def update(self) -> None:
        """Recompute, redraw the figure and swap the PNG shown by the widget."""
        if self.renders == 0 or not self.refresh(self.figure):
            self.figure.clear()
            self.draw(self.figure)
            self._background = None
        self.image.value = self.png()
        self.renders += 1

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.ui)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.to(torch.float32), dim=-1)


class TemperatureWidget(HeatmapWidget):
    """Attention weights softmax(scores / tau) with a slider for the temperature tau (shown as τ).

    tau = 1 is plain scaled attention; small tau sharpens each row towards one-hot
    (what happens to unscaled scores when dk is large), large tau flattens it. The title prints the mean row
    entropy -sum_j w_j ln w_j in nats (0 for one-hot rows, ln S for uniform ones).

    Args:
        scores: (L, S) scaled scores q.k / sqrt(dk).
        query_labels, key_labels: tokens.
    """

    def __init__(self, scores: torch.Tensor, query_labels=None, key_labels=None, temperature: float = 1.0):
        import ipywidgets as widgets

        if scores.dim() != 2:
            raise ValueError(f"scores must be (L, S), got shape {tuple(scores.shape)}")
        self.scores = scores.detach().to(torch.float32)
        self.query_labels, self.key_labels = query_labels, key_labels
        self.slider = widgets.FloatLogSlider(value=temperature, base=10, min=-1.3, max=1.3, step=0.05,
                                             description="temperature τ", readout_format=".2f",
                                             continuous_update=True,
                                             style={"description_width": "initial"})
        super().__init__([self.slider])
        self.update()

    @property
    def weights(self) -> torch.Tensor:
        """(L, S) current weights softmax(scores / tau)."""
        return _softmax(self.scores / self.slider.value)

    def _title(self, w: torch.Tensor) -> str:
        entropy = -(w * w.clamp_min(1e-12).log()).sum(-1).mean().item()
        return (f"τ = {self.slider.value:.2f}: mean row entropy {entropy:.2f} nats "
                f"(uniform: {math.log(w.shape[-1]):.2f})")

    def draw(self, fig: Figure) -> None:
        w = self.weights
        ax = fig.add_subplot()
        attention_heatmap(w, self.query_labels, self.key_labels, ax=ax, title=self._title(w))
        ax.title.set_fontsize(9)
        fig.tight_layout()

    def refresh(self, fig: Figure) -> bool:
        w = self.weights
        update_heatmap(fig.axes[0], w, title=self._title(w))
        return True

    def dynamic_artists(self) -> list:
        ax = self.figure.axes[0]
        return [ax.images[0], *[t for t in ax.texts if t.get_text() != "-inf"], ax.title]


class QueryWidget(HeatmapWidget):
    """Edit one query vector and watch its weights over the keys and its output move.

    Args:
        keys: (S, 2) keys, values: (S, Dv) values, query: (2,) starting query.
        key_labels: names of the keys/tokens.
        scale: multiplies q.k (default 1/sqrt(2)).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, query, key_labels=None,
                 scale: float | None = None):
        import ipywidgets as widgets

        if keys.dim() != 2 or keys.shape[1] != 2:
            raise ValueError(f"keys must be (S, 2) so the query can be edited with two sliders, "
                             f"got shape {tuple(keys.shape)}")
        if values.dim() != 2 or values.shape[0] != keys.shape[0]:
            raise ValueError(f"values must be (S, Dv) with S = {keys.shape[0]}, got shape {tuple(values.shape)}")
        self.keys, self.values = keys.to(torch.float32), values.to(torch.float32)
        self.key_labels = key_labels or [f"k{j + 1}" for j in range(keys.shape[0])]
        self.scale = 1 / math.sqrt(2) if scale is None else scale
        q = torch.as_tensor(query, dtype=torch.float32)
        self.sliders = [widgets.FloatSlider(value=float(q[i]), min=-10, max=10, step=0.1,
                                            description=f"q[{i}]", continuous_update=True)
                        for i in range(2)]
        super().__init__(self.sliders, figsize=(7.5, 2.8))
        self.update()

    @property
    def query(self) -> torch.Tensor:
        return torch.tensor([s.value for s in self.sliders], dtype=torch.float32)

    @property
    def weights(self) -> torch.Tensor:
        """(S,) softmax(q . k_j * scale)."""
        return _softmax(self.keys @ self.query * self.scale)

    @property
    def output(self) -> torch.Tensor:
        """(Dv,) sum_j weights_j v_j."""
        return self.weights @ self.values

    def draw(self, fig: Figure) -> None:
        w, out = self.weights, self.output
        ax_w, ax_o = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        bars = ax_w.bar(self.key_labels, w.numpy(), color="#0072B2")
        for bar, val in zip(bars, w.tolist()):
            ax_w.text(bar.get_x() + bar.get_width() / 2, val, f"{val:.2f}", ha="center", va="bottom")
        ax_w.set_ylim(0, 1.1)
        ax_w.set_ylabel("weight")
        q = ", ".join(f"{x:.1f}" for x in self.query.tolist())
        ax_w.set_title(f"weights of q = [{q}]", fontsize=10)
        ax_o.bar([f"out[{i}]" for i in range(out.numel())], out.numpy(), color="#E69F00")
        top = max(self.values.abs().max().item(), 1.0)
        ax_o.set_ylim(min(0.0, -top), top * 1.1)
        ax_o.set_title("output = sum_j w_j v_j", fontsize=10)
        for i, val in enumerate(out.tolist()):
            ax_o.text(i, val, f"{val:.2f}", ha="center", va="bottom")
        fig.tight_layout()
