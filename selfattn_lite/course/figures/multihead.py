"""Figure of notebook 04: d_model split into h heads of width d/h, attended, concatenated, mixed by W_O."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ._draw import arrow, diagram

__all__ = ["draw_split_concat", "FIGURES"]

# Okabe-Ito colour-blind-safe palette, one colour per head
HEAD_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]
GREY = "#bbbbbb"


def _strip(ax, x, y, width, height, colors, label=None):
    """A matrix drawn as coloured column blocks, one block per head."""
    w = width / len(colors)
    for i, color in enumerate(colors):
        ax.add_patch(Rectangle((x + i * w, y), w, height, facecolor=color, edgecolor="black", linewidth=0.8))
    if label:
        ax.text(x + width / 2, y + height + 0.12, label, ha="center", va="bottom", fontsize=9)


def _arrow(ax, start, end):
    arrow(ax, start, end, size=12)


def draw_split_concat() -> Figure:
    """X (n x d) -> Q = X W_Q split into h blocks of d/h columns -> h attentions -> concat -> W_O."""
    h = len(HEAD_COLORS)
    fig, ax = diagram((10.5, 3.6), (0, 12.4), (-0.3, 3.9))
    _strip(ax, 0.2, 1.0, 1.2, 1.6, [GREY], "X  (n x d)")
    _arrow(ax, (1.5, 1.8), (2.2, 1.8))
    _strip(ax, 2.3, 1.0, 1.6, 1.6, HEAD_COLORS, "Q, K, V = X W\n(n x d each)")
    for i, color in enumerate(HEAD_COLORS):
        y = 3.1 - i * 0.95
        _arrow(ax, (3.95, 1.8), (4.9, y + 0.3))
        ax.add_patch(Rectangle((4.95, y), 2.5, 0.6, facecolor=color, edgecolor="black", alpha=0.55))
        ax.text(6.2, y + 0.3, f"head {i + 1}: attend on its d/h cols", ha="center", va="center", fontsize=7.5)
        _arrow(ax, (7.5, y + 0.3), (8.25, 1.8))
    _strip(ax, 8.3, 1.0, 1.6, 1.6, HEAD_COLORS, "concat\n(n x d)")
    _arrow(ax, (10.0, 1.8), (10.6, 1.8))
    _strip(ax, 10.7, 1.0, 1.2, 1.6, [GREY], "x W_O\n(n x d)")
    ax.text(6.2, -0.2, f"h = {h} heads of d/h columns each: the same multiply-adds as one head of width d",
            ha="center", fontsize=9)
    ax.set_title("Multi-head attention: split the width into heads, attend per head, concatenate, mix with W_O",
                 fontsize=11)
    return fig


FIGURES = {"multihead_split_concat.png": draw_split_concat}
