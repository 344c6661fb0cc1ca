"""Notebook 16's pictures: where each mixer of a trained recall model looks when it answers a query.

``follow_query`` runs a shipped model on one MQAR row and returns one layer's implicit attention
matrix (``RecallModel.mixer_weights``, averaged over heads, or over channels for s6: by default the layer
that puts the most weight on the value asked for), the query's position and that of the value.
``draw_mixer_weights`` draws the matrices side by side; ``RecallWidget`` lets a learner pick the mixer,
the number of pairs and the query to follow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..recall import IGNORE_INDEX, STYLES, mqar, query_distances
from .core import HeatmapWidget

__all__ = ["FollowedQuery", "follow_query", "draw_mixer_weights", "RecallWidget"]


@dataclass
class FollowedQuery:
    """One query of one row, seen through one model's last mixer."""

    mixer: str
    layer: int                # which of the model's layers (0-based)
    weights: torch.Tensor     # (T, T) mean over heads (channels for s6)
    query: int                # its position
    value: int                # where the value it asks for sits
    target: int               # that value
    prediction: int           # the model's answer (argmax)

    @property
    def correct(self) -> bool:
        return self.prediction == self.target


def follow_query(model, inputs: torch.Tensor, targets: torch.Tensor, which: int = 0,
                 layer: int | None = None) -> FollowedQuery:
    """Follow the ``which``-th query (in position order) of a single row (1, T) through ``model``.

    ``layer``: a layer's index, or None for the layer whose weight on the value asked for is largest (the layer
    that retrieves it, when the model has learned to).
    """
    if inputs.dim() != 2 or inputs.shape[0] != 1 or targets.shape != inputs.shape:
        raise ValueError(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must be one row (1, T)")
    queries = (targets[0] != IGNORE_INDEX).nonzero().flatten().tolist()
    if not 0 <= which < len(queries):
        raise ValueError(f"which={which} but the row has {len(queries)} queries")
    t = queries[which]
    value = t - query_distances(inputs, targets)[0, t].item()
    with torch.no_grad():
        per_layer = [model.mixer_weights(inputs, layer=i)[0].mean(dim=0) for i in range(len(model.blocks))]
        prediction = model(inputs)[0, t].argmax().item()
    if layer is None:
        layer = max(range(len(per_layer)), key=lambda i: per_layer[i][t, value].item())
    name = model.config.mixer
    if name.startswith("hybrid"):
        name = f"{name} ({model.config.layer_mixers[layer]})"
    return FollowedQuery(name, layer, per_layer[layer], t, value, targets[0, t].item(), prediction)


def draw_mixer_weights(followed: list[FollowedQuery], axes: list[Axes] | None = None) -> list[Axes]:
    """One panel per model: one layer's implicit attention matrix, the followed query's row boxed, the value
    circled."""
    if axes is None:
        fig = Figure(figsize=(3.2 * len(followed), 3.4))
        FigureCanvasAgg(fig)
        axes = list(fig.subplots(1, len(followed), squeeze=False)[0])
    for ax, f in zip(axes, followed):
        w = f.weights
        limit = w.abs().max().item() or 1.0
        ax.imshow(w.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        ax.axhline(f.query - 0.5, color="black", linewidth=0.8)
        ax.axhline(f.query + 0.5, color="black", linewidth=0.8)
        ax.plot([f.value], [f.query], marker="o", markersize=8, markerfacecolor="none", color="#E69F00",
                markeredgewidth=1.8)
        verdict = "right" if f.correct else "wrong"
        ax.set_title(f"{f.mixer}, layer {f.layer + 1}: answer {verdict}", fontsize=9)
        ax.set_xlabel("position mixed in (value read)")
    axes[0].set_ylabel("output position")
    return axes


class RecallWidget(HeatmapWidget):
    """Pick a mixer, the number of pairs and a query; see the implicit attention on that row of the layer that
    weighs the value asked for most.

    Args:
        models: {name: shipped RecallModel}. seq_len: row length. seed: the row's generator seed.
        style: the rows' form, as given to ``recall.mqar`` ("notebook" or "zoology": the rows the models
            were trained on).

    Attributes:
        mixer, n_pairs, query: the controls. followed: the ``FollowedQuery`` drawn now.
    """

    def __init__(self, models: dict, seq_len: int = 64, seed: int = 0, n_pairs: int = 8, style: str = "notebook"):
        import ipywidgets as widgets

        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        self.models, self.seq_len, self.seed, self.style = models, seq_len, seed, style
        style = {"description_width": "initial"}
        self.mixer = widgets.Dropdown(options=list(models), description="mixer", style=style)
        self.n_pairs = widgets.IntSlider(value=n_pairs, min=1, max=seq_len // 4, description="pairs", style=style)
        self.query = widgets.IntSlider(value=0, min=0, max=n_pairs - 1, description="query to follow", style=style)
        self.n_pairs.observe(self._limit_query, names="value")
        super().__init__([self.mixer, self.n_pairs, self.query], figsize=(8.5, 3.8))
        self.update()

    def _limit_query(self, change) -> None:
        self.query.max = change["new"] - 1

    def row(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The MQAR row shown: one row of ``n_pairs`` pairs from the widget's seed, in the widget's style."""
        model = self.models[self.mixer.value]
        return mqar(1, self.seq_len, self.n_pairs.value, model.config.vocab_size,
                    generator=torch.Generator().manual_seed(self.seed), style=self.style)

    @property
    def followed(self) -> FollowedQuery:
        inputs, targets = self.row()
        which = min(self.query.value, self.n_pairs.value - 1)
        return follow_query(self.models[self.mixer.value], inputs, targets, which)

    def draw(self, fig: Figure) -> None:
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
        f = self.followed
        draw_mixer_weights([f], [left])
        row = f.weights[f.query, : f.query + 1]
        right.bar(range(len(row)), row.numpy(), color="#0072B2", width=1.0)
        right.bar([f.value], [row[f.value].item()], color="#E69F00", width=1.0, label="the value asked for")
        right.axhline(0, color="black", linewidth=0.5)
        right.set_xlabel("position mixed in")
        right.set_ylabel("weight")
        right.legend(fontsize=7)
        right.set_title(f"query at {f.query}: wants {f.target} (at {f.value}), predicts {f.prediction}", fontsize=9)
        fig.tight_layout()
