"""Figures of notebooks 01-03: the data flow of scaled dot-product attention and the
illustrative causal weight grid for "The cat sat on it"."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ...viz.core import attention_heatmap
from ._draw import BLUE, GREEN, GREY, ORANGE, PURPLE, diagram
from ._draw import arrow as _arrow
from ._draw import box as _box

__all__ = ["CAT_SAT_TOKENS", "CAT_SAT_WEIGHTS", "draw_sdpa_dataflow", "draw_causal_cat_sat", "FIGURES"]

# Illustrative weights, made up (not from a real model).
# Rows = queries, columns = keys; 0.0 above the diagonal is where the causal mask puts -inf.
CAT_SAT_TOKENS = ["The", "cat", "sat", "on", "it"]
CAT_SAT_WEIGHTS = [
    [1.00, 0.00, 0.00, 0.00, 0.00],
    [0.35, 0.65, 0.00, 0.00, 0.00],
    [0.10, 0.60, 0.30, 0.00, 0.00],
    [0.05, 0.20, 0.45, 0.30, 0.00],
    [0.05, 0.70, 0.10, 0.05, 0.10],
]


def draw_sdpa_dataflow() -> Figure:
    """X -> Q, K, V -> scores QK^T/sqrt(dk) -> + M, softmax -> weights @ V."""
    fig, ax = diagram((10, 3.2), (-0.3, 11.8), (-0.4, 3.4))
    _box(ax, 0.7, 1.5, "X\n(n x d)", GREY)
    for y, name, col in ((2.8, "Q = X Wq\n(n x dk)", BLUE), (1.5, "K = X Wk\n(n x dk)", BLUE),
                         (0.2, "V = X Wv\n(n x dv)", ORANGE)):
        _box(ax, 3.1, y, name, col)
        _arrow(ax, (1.55, 1.5), (2.25, y))
    _box(ax, 5.6, 2.15, "S = Q K^T / sqrt(dk)\n(n x n scores)", GREEN, w=2.3)
    _arrow(ax, (3.95, 2.8), (4.45, 2.3))
    _arrow(ax, (3.95, 1.5), (4.45, 2.0))
    _box(ax, 8.1, 2.15, "A = softmax(S + M)\nrow-wise (n x n)", PURPLE, w=2.2)
    _arrow(ax, (6.75, 2.15), (7.0, 2.15))
    _box(ax, 10.6, 1.2, "A V\n(n x dv)", ORANGE, w=1.7)
    _arrow(ax, (9.2, 2.0), (9.75, 1.4))
    _arrow(ax, (3.95, 0.2), (9.75, 1.0))
    ax.text(8.1, 3.05, "M: 0 = allowed, -inf = masked", ha="center", fontsize=9)
    ax.set_title("Scaled dot-product attention: every output row is a convex combination of the value rows",
                 fontsize=11)
    return fig


def draw_causal_cat_sat() -> Figure:
    """The illustrative causal weights as a heatmap, masked cells marked -inf."""
    import torch

    weights = torch.tensor(CAT_SAT_WEIGHTS)
    masked = ~torch.ones(5, 5, dtype=torch.bool).tril()
    fig = Figure(figsize=(5.6, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    attention_heatmap(weights, CAT_SAT_TOKENS, CAT_SAT_TOKENS, ax=ax, masked=masked,
                      title='An illustrative causal table (made-up weights)\n'
                            'grey: the masked future; each row sums to 1')
    return fig


FIGURES = {
    "sdpa_dataflow.png": draw_sdpa_dataflow,
    "causal_cat_sat.png": draw_causal_cat_sat,
}
