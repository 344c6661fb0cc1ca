"""Notebook 12's widget: pick a context-extension method and a factor, see the tiny
decoder's held-out loss, averaged over buckets of positions, and what the method does to each RoPE pair.

* ``context_loss_chart``: loss per position bucket for several methods, and the per-pair
  slow-down theta_i / theta'_i, side by side.
* ``ContextExtensionWidget``: the same for one method and factor, re-measured on every change.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure

from ..positions import scaled_inv_freq
from ..rope_scaling import SCALING_KINDS
from .core import HeatmapWidget
from .positions import SCALING_COLORS, SCALING_LABELS, SCALING_STYLES

__all__ = ["context_loss_chart", "ContextExtensionWidget"]


def context_loss_chart(curves: dict, *, trained_len: int, head_dim: int | None = None, base: float = 10000.0,
                       scalings: dict | None = None, axes=None):
    """Loss against position (left) and, optionally, each pair's slow-down (right).

    Args:
        curves: label -> (positions, losses) 1-D arrays (bucket centres, mean loss per bucket), or
            (positions, losses, spread): a band of +- spread is drawn around the curve (for example
            the standard deviation over the evaluation windows).
        trained_len: the training window, drawn as a vertical line.
        head_dim, base, scalings: label -> scaling dict for the right panel (skipped if None).
        axes: one or two Axes.
    """
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, 2 if scalings else 1, figsize=(11, 3.8) if scalings else (7, 3.8))
    axes = list(np.atleast_1d(axes))
    ax = axes[0]
    for i, (label, (x, y, *spread)) in enumerate(curves.items()):
        ax.plot(x, y, marker="o", markersize=3, label=label, color=f"C{i}")
        if spread:
            low, high = np.asarray(y) - np.asarray(spread[0]), np.asarray(y) + np.asarray(spread[0])
            ax.fill_between(x, low, high, color=f"C{i}", alpha=0.15, lw=0)
    ax.axvline(trained_len, color="#777777", lw=0.8)
    ax.text(trained_len * 1.02, ax.get_ylim()[1] * 0.97, f"trained length {trained_len}", fontsize=8,
            color="#555555", va="top")
    ax.set(xlabel="position in the window (characters of context)", ylabel="held-out loss (nats / char)",
           title="Mean loss per position bucket")
    ax.legend(fontsize=8, loc="upper left")
    if scalings and len(axes) > 1:
        plain, _ = scaled_inv_freq(head_dim, base, None)
        pairs = np.arange(head_dim // 2)
        for label, scaling in scalings.items():
            kind = None if scaling is None else scaling["kind"]
            inv_freq, _ = scaled_inv_freq(head_dim, base, scaling)
            axes[1].plot(pairs, (plain / inv_freq).numpy(), label=label, color=SCALING_COLORS[kind],
                         ls=SCALING_STYLES[kind], lw=2 if kind else 1.5, marker="o", markersize=3)
        axes[1].set(yscale="log", xlabel="pair i (0 = fastest)", ylabel="theta_i / theta'_i (slow-down)",
                    title=f"Each pair's slow-down (head_dim {head_dim})")
        top = max(line.get_ydata().max() for line in axes[1].get_lines())
        ticks = [2.0 ** e for e in range(int(np.log2(top)) + 2)]
        axes[1].set_yticks(ticks, [f"{t:g}x" for t in ticks])
        axes[1].minorticks_off()
        axes[1].legend(fontsize=8, loc="upper left")
    ax.figure.tight_layout()
    return axes


class ContextExtensionWidget(HeatmapWidget):
    """Choose a method and a factor s: the decoder is reloaded with that scaling and measured.

    Args:
        load: ``load(rope_scaling, max_len) -> model`` (e.g. ``models.load_tiny_decoder``).
        windows: (n, T + 1) held-out token ids; the model reads T tokens.
        trained_len: the model's training window L.
        loss_fn: ``loss_fn(model, windows) -> (n, T)`` losses (``context_eval.loss_per_position``).
        bucket: positions per plotted point.
        kind, factor: initial method ("none" or a scaling kind) and factor.

    Attributes:
        kind: dropdown. factor: slider. scaling: the current dict (None for "none").
        losses: (T // bucket,) the last measured loss per bucket. baseline: the same without scaling.
    """

    def __init__(self, load, windows: torch.Tensor, trained_len: int, loss_fn, *, head_dim: int = 16,
                 base: float = 10000.0, bucket: int = 128, kind: str = "yarn", factor: float = 4.0):
        import ipywidgets as widgets

        if kind != "none" and kind not in SCALING_KINDS:
            raise ValueError(f"unknown method {kind!r}; expected 'none' or one of {list(SCALING_KINDS)}")
        self.load, self.windows, self.trained_len, self.loss_fn = load, windows, trained_len, loss_fn
        self.head_dim, self.base, self.bucket = head_dim, base, bucket
        self.T = windows.shape[1] - 1
        self.positions = np.arange(self.T).reshape(-1, bucket).mean(1) + 1
        style = {"description_width": "initial"}
        options = [("no scaling", "none")] + [(SCALING_LABELS[k], k) for k in SCALING_KINDS]
        self.kind = widgets.Dropdown(options=options, value=kind, description="method", style=style)
        self.factor = widgets.FloatLogSlider(value=factor, base=2, min=0, max=4, step=0.5, description="factor s",
                                             readout_format=".1f", style=style, continuous_update=False)
        self.baseline = self._measure(None)
        super().__init__([self.kind, self.factor], figsize=(11.0, 3.8))
        self.update()

    @property
    def scaling(self) -> dict | None:
        if self.kind.value == "none":
            return None
        scaling = {"kind": self.kind.value, "factor": float(self.factor.value)}
        if self.kind.value in ("yarn", "llama3"):
            scaling["original_max_len"] = self.trained_len
        return scaling

    def _measure(self, scaling) -> np.ndarray:
        model = self.load(rope_scaling=scaling, max_len=self.T)
        losses = self.loss_fn(model, self.windows).mean(0)                  # (T,)
        return losses.reshape(-1, self.bucket).mean(1).numpy()

    def draw(self, fig: Figure) -> None:
        self.losses = self._measure(self.scaling)
        label = "no scaling" if self.scaling is None else \
            f"{SCALING_LABELS[self.kind.value]}, s = {self.factor.value:.1f}"
        curves = {"no scaling": (self.positions, self.baseline)}
        if self.scaling is not None:
            curves[label] = (self.positions, self.losses)
        axes = context_loss_chart(curves, trained_len=self.trained_len, head_dim=self.head_dim, base=self.base,
                                  scalings={"original": None, label: self.scaling}, axes=fig.subplots(1, 2))
        n = self.windows.shape[0]
        axes[0].set_title(f"Mean loss per {self.bucket}-position bucket, positions 0-{self.T}, "
                          f"{n} window{'s' if n > 1 else ''}", fontsize=10)
        fig.tight_layout()
