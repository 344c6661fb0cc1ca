"""Notebook 04's views of multi-head attention: a grid with one heatmap per head, and a
widget that picks a head (or all of them) and an example."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from matplotlib.figure import Figure

from .core import HeatmapWidget, attention_heatmap

__all__ = ["head_grid", "HeadWidget"]


def _check_heads(weights: torch.Tensor, head_names: Sequence[str] | None) -> None:
    if not isinstance(weights, torch.Tensor) or weights.dim() != 3:
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(f"expected per-head weights (h, L, S), got {shape}")
    if head_names is not None and len(head_names) != weights.shape[0]:
        raise ValueError(f"{len(head_names)} head names for {weights.shape[0]} heads")


def head_grid(weights: torch.Tensor, query_labels=None, key_labels=None, *, head_names=None,
              ncols: int = 4, fig: Figure | None = None, title: str | None = None) -> Figure:
    """One heatmap per head, side by side (rows = queries, columns = keys).

    Args:
        weights: (h, L, S) weights of one example.
        query_labels, key_labels: tokens of the rows and columns.
        head_names: a title per head (default "head 0", "head 1", ...).
        fig: draw into this figure (default: a new pyplot figure, shown inline).

    Returns:
        The figure.
    """
    _check_heads(weights, head_names)
    h, L, S = weights.shape
    ncols = min(ncols, h)
    nrows = math.ceil(h / ncols)
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(0.4 + ncols * (0.9 + 0.32 * S), 0.6 + nrows * (0.8 + 0.3 * L)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        name = head_names[i] if head_names is not None else f"head {i}"
        attention_heatmap(weights[i], query_labels, key_labels, ax=ax, title=name, annotate=False,
                          colorbar=False)
        ax.title.set_fontsize(10)
        ax.tick_params(labelsize=7)
        if i % ncols:
            ax.set_ylabel("")
        if i < h - ncols:
            ax.set_xlabel("")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


class HeadWidget(HeatmapWidget):
    """Pick a head (or "all heads") and an example; the heatmap redraws in place.

    Args:
        weights: (B, h, L, S) per-head weights, as ``MultiHeadAttention(need_weights=True)``
            returns them, or (h, L, S) for one example.
        tokens: labels of the positions (L == S), one list per example or one shared list.
        head_names: a name per head (default "head 0", ...).
    """

    def __init__(self, weights: torch.Tensor, tokens=None, head_names=None):
        import ipywidgets as widgets

        if isinstance(weights, torch.Tensor) and weights.dim() == 3:
            weights = weights[None]
        if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
            shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise ValueError(f"weights must be (B, h, L, S) or (h, L, S), got {shape}")
        B, h, L, S = weights.shape
        _check_heads(weights[0], head_names)
        if tokens is not None and len(tokens) and isinstance(tokens[0], str):
            tokens = [list(tokens)] * B
        if tokens is not None and (len(tokens) != B or any(len(t) != S for t in tokens)):
            raise ValueError(f"tokens must be one list of {S} labels, or {B} such lists")
        self.all_weights = weights.detach().to(torch.float32).cpu()
        self.tokens, self.head_names = tokens, head_names or [f"head {i}" for i in range(h)]
        self.head = widgets.Dropdown(options=["all heads", *self.head_names], value="all heads", description="head")
        self.example = widgets.IntSlider(value=0, min=0, max=B - 1, description="example")
        controls = [self.head] + ([self.example] if B > 1 else [])
        super().__init__(controls, figsize=(max(5.5, 2.2 * min(h, 4)), 4.2 if h <= 4 else 7.0))
        self.update()

    @property
    def weights(self) -> torch.Tensor:
        """(L, S) weights of the selected head, or (h, L, S) for "all heads"."""
        w = self.all_weights[self.example.value]                            # (h, L, S)
        if self.head.value == "all heads":
            return w
        return w[self.head_names.index(self.head.value)]

    def draw(self, fig: Figure) -> None:
        labels = self.tokens[self.example.value] if self.tokens is not None else None
        w = self.weights
        if w.dim() == 3:
            head_grid(w, labels, labels, head_names=self.head_names, fig=fig,
                      title=f"example {self.example.value}: every head's weights")
            return
        ax = fig.add_subplot()
        attention_heatmap(w, labels, labels, ax=ax, annotate=False,
                          title=f"example {self.example.value}, {self.head.value}")
