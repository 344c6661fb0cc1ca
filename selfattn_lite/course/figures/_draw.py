"""Drawing helpers shared by the diagram modules: labelled boxes and arrows."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

# Okabe-Ito colour-blind-safe palette
BLUE, ORANGE, GREEN, PURPLE, GREY = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#999999"


def diagram(figsize, xlim, ylim):
    """A figure with one frameless axes spanning xlim x ylim, to draw boxes and arrows on."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def box(ax, x, y, text, color, w=1.7, h=0.75, fontsize=10.0):
    """A rounded box of width w and height h centred on (x, y), with text in it."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                facecolor=color, edgecolor="black", alpha=0.85))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color="black")


def arrow(ax, start, end, color="#333333", size=14, label=None):
    """An arrow from start to end (data coordinates), optionally labelled at its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=size, color=color))
    if label:
        ax.text((start[0] + end[0]) / 2 + 0.08, (start[1] + end[1]) / 2, label, fontsize=9, color=color)
