"""Figures of notebook 05: where each kind of position information enters attention, and
the two ways RoPE pairs the dimensions of a head."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ._draw import arrow, box, diagram

__all__ = ["draw_where_positions_enter", "draw_rope_pairings", "FIGURES"]

# Okabe-Ito colour-blind-safe palette
BLUE, ORANGE, GREEN, PURPLE, SKY, YELLOW, VERMILION, GREY = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#D55E00", "#bbbbbb")
PAIR_COLORS = [BLUE, ORANGE, GREEN, PURPLE]


def _box(ax, x, y, text, color, w=1.9, h=0.7):
    box(ax, x, y, text, color, w=w, h=h, fontsize=9.5)


def _arrow(ax, start, end, color="#333333"):
    arrow(ax, start, end, color=color, size=13)


def _note(ax, x, y, text, color):
    ax.text(x, y, text, ha="center", va="center", fontsize=9, color="black",
            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=color, linewidth=2))


def draw_where_positions_enter() -> Figure:
    """token embedding -> (+ PE) -> q, k -> (rotate) -> scores -> (+ bias) -> softmax."""
    fig, ax = diagram((11, 3.3), (-0.4, 12.4), (-0.2, 3.3))
    y = 1.5
    _box(ax, 0.8, y, "token\nembedding", GREY, w=1.5)
    _box(ax, 3.1, y, "x_m = e + p_m", SKY, w=1.8)
    _box(ax, 5.6, y, "q_m = W_q x_m\nk_n = W_k x_n", GREY, w=2.0)
    _box(ax, 8.1, y, "q_m . k_n / sqrt(dk)", GREY, w=2.1)
    _box(ax, 10.9, y, "softmax,\nweights @ V", GREY, w=1.8)
    for a, b in ((1.55, 2.2), (4.0, 4.6), (6.6, 7.05), (9.15, 10.0)):
        _arrow(ax, (a, y), (b, y))
    _note(ax, 3.1, 2.85, "1. add a position vector p_m\nsinusoidal (2017), learned (BERT, GPT-2)", SKY)
    _arrow(ax, (3.1, 2.45), (3.1, 1.88), SKY)
    _note(ax, 6.85, 0.25, "2. rotate q_m by m, k_n by n (RoPE)\nq.k then depends on m - n only", GREEN)
    _arrow(ax, (6.85, 0.62), (6.85, 1.42), GREEN)
    _note(ax, 9.45, 2.85, "3. add -slope * |m - n| to the score\nALiBi", ORANGE)
    _arrow(ax, (9.45, 2.45), (8.9, 1.88), ORANGE)
    ax.set_title("Three places to inject order: the input (absolute), q and k (relative, RoPE), "
                 "the scores (relative, ALiBi)", fontsize=11)
    return fig


def _dims(ax, y, d, colors, label):
    for j in range(d):
        ax.add_patch(Rectangle((j, y), 0.9, 0.7, facecolor=colors[j], edgecolor="black", linewidth=0.8))
        ax.text(j + 0.45, y + 0.35, str(j), ha="center", va="center", fontsize=9)
    ax.text(-0.3, y + 0.35, label, ha="right", va="center", fontsize=10)


def _link(ax, y, a, b, color, above):
    sign = 1 if above else -1
    start, end = (a + 0.45, y + (0.7 if above else 0.0)), (b + 0.45, y + (0.7 if above else 0.0))
    ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={-0.35 * sign}", arrowstyle="<->",
                                 mutation_scale=8, color=color, linewidth=1.5))


def draw_rope_pairings() -> Figure:
    """d = 8: half-split pairs (i, i + 4) versus interleaved pairs (2i, 2i + 1), coloured by pair i."""
    d, half = 8, 4
    fig, ax = diagram((9, 3.6), (-4.2, 9.2), (-1.0, 4.6))
    _dims(ax, 2.6, d, [PAIR_COLORS[j % half] for j in range(d)], "half-split\n(GPT-NeoX, HF Llama)")
    for i in range(half):
        _link(ax, 2.6, i, i + half, PAIR_COLORS[i], above=True)
    _dims(ax, 0.3, d, [PAIR_COLORS[j // 2] for j in range(d)], "interleaved\n(RoFormer, Meta Llama)")
    for i in range(half):
        _link(ax, 0.3, 2 * i, 2 * i + 1, PAIR_COLORS[i], above=False)
    ax.text(4.45, 1.85, "same colour = same pair i, rotated by the angle m * theta_i", ha="center", fontsize=9)
    ax.set_title("Which dimensions RoPE rotates together: reorder the rows of W_q and W_k to switch", fontsize=11)
    return fig


FIGURES = {
    "positions_where.png": draw_where_positions_enter,
    "rope_pairings.png": draw_rope_pairings,
}
