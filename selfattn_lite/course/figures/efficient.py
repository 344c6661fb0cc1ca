"""Figures of notebook 08: online softmax over two chunks, explicit vs tiled attention, and the
attention patterns (causal, sliding window) with the number of scores each computes."""

from __future__ import annotations

import math

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ...efficient import sliding_window_mask
from ...viz.tiles import TILE_COLORS, draw_tile_plan

__all__ = ["ONLINE_SOFTMAX_SCORES", "draw_online_softmax", "draw_explicit_vs_tiled", "draw_patterns", "FIGURES"]

# Okabe-Ito colour-blind-safe palette
BLUE, ORANGE, GREEN, VERMILION, GREY = "#0072B2", "#E69F00", "#009E73", "#D55E00", "#999999"

# One row of six scores, read as two chunks of three (the notebook's hand example).
ONLINE_SOFTMAX_SCORES = [1.0, 3.0, 2.0, 0.5, 4.0, 1.5]


def _figure(figsize) -> Figure:
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def draw_online_softmax() -> Figure:
    """Chunk 1 is summed against its own max m1; chunk 2 raises the max to m; the first sum is
    rescaled by exp(m1 - m) and the result is the softmax of the whole row."""
    x = torch.tensor(ONLINE_SOFTMAX_SCORES)
    c1, c2 = x[:3], x[3:]
    m1, m = c1.max().item(), x.max().item()
    fig = _figure((11, 3.4))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    idx = list(range(6))
    ax1.bar(idx[:3], c1.tolist(), color=BLUE, label="chunk 1")
    ax1.bar(idx[3:], c2.tolist(), color=ORANGE, label="chunk 2")
    ax1.axhline(m1, xmax=0.5, color=BLUE, linestyle="--")
    ax1.axhline(m, xmin=0.5, color=ORANGE, linestyle="--")
    ax1.text(0.1, m1 + 0.1, f"m1 = {m1:g}", color=BLUE)
    ax1.text(3.2, m + 0.1, f"m = max(m1, m2) = {m:g}", color=ORANGE)
    ax1.set(title="1. scores of one query, in two chunks", xlabel="key j", ylabel="score", ylim=(0, 5))
    ax1.legend(loc="upper left", fontsize=8)

    e1, e2 = torch.exp(c1 - m1), torch.exp(c2 - m)
    l1 = e1.sum().item()
    ax2.bar(idx[:3], e1.tolist(), color=BLUE)
    ax2.bar(idx[3:], e2.tolist(), color=ORANGE)
    ax2.set(title=f"2. exp(x − running max): l1 = {l1:.3f}", xlabel="key j", ylabel="exp(x − m_running)",
            ylim=(0, 1.15))
    alpha = math.exp(m1 - m)
    ax2.text(0.0, 1.05, f"chunk 1 used m1 = {m1:g}; rescale by exp(m1 − m) = {alpha:.3f}", fontsize=8)

    l = l1 * alpha + e2.sum().item()
    w = torch.cat([e1 * alpha, e2]) / l
    ax3.bar(idx[:3], w[:3].tolist(), color=BLUE)
    ax3.bar(idx[3:], w[3:].tolist(), color=ORANGE)
    ax3.plot(idx, torch.softmax(x, 0).tolist(), "k_", markersize=18, label="softmax of the whole row")
    ax3.set(title=f"3. l = l1·exp(m1 − m) + l2 = {l:.3f}: exact softmax", xlabel="key j", ylabel="weight",
            ylim=(0, 0.75))
    ax3.legend(loc="upper left", fontsize=8)
    for ax in (ax1, ax2, ax3):
        ax.title.set_fontsize(9)
    fig.suptitle("Online softmax: a later chunk with a larger max only rescales what was summed before",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


def draw_explicit_vs_tiled() -> Figure:
    """Explicit attention holds all n x n scores; the tiled kernel holds one tile and skips the
    tiles above the causal diagonal."""
    n, block = 24, 6
    fig = _figure((10, 5.2))
    ax1, ax2 = fig.subplots(1, 2)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    image = torch.where(mask[..., None], torch.tensor([0.835, 0.369, 0.0]), torch.tensor([0.85, 0.85, 0.85]))
    ax1.imshow(image.numpy(), extent=(0, n, n, 0), interpolation="nearest")
    ax1.set(xlabel="key position j", ylabel="query position i", xlim=(0, n), ylim=(n, 0))
    ax1.set_title(f"explicit: all n² = {n * n} scores computed and stored,\nthen the mask sets half to −inf",
                  fontsize=9)
    draw_tile_plan(n, block, is_causal=True, step=9, ax=ax2,
                   title=f"tiled: one {block}×{block} tile of scores at a time (orange: the current one);\n"
                         "tiles above the diagonal are never computed")
    ax2.title.set_fontsize(9)
    fig.suptitle("Same output, different memory: explicit O(n²) scores vs one tile plus O(n) running statistics",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


def draw_patterns() -> Figure:
    """Full, causal and sliding-window (causal and two-sided) masks, with the pairs each computes."""
    n, w = 16, 4
    masks = [("full", torch.ones(n, n, dtype=torch.bool)),
             ("causal", torch.ones(n, n, dtype=torch.bool).tril()),
             (f"causal sliding window w={w}", sliding_window_mask(n, w)),
             (f"two-sided window w={w} (w/2 keys each side)",   # Longformer's convention:
              sliding_window_mask(n, w // 2 + 1, is_causal=False))]     # the package's window - 1 each side
    fig = _figure((12, 3.6))
    axes = fig.subplots(1, 4)
    colour = torch.tensor([int(TILE_COLORS[2][i:i + 2], 16) / 255 for i in (1, 3, 5)])
    for ax, (name, mask) in zip(axes, masks, strict=True):
        image = torch.where(mask[..., None], colour, torch.tensor([0.85, 0.85, 0.85]))
        ax.imshow(image.numpy(), interpolation="nearest")
        ax.set_title(f"{name}\n{int(mask.sum())} of {n * n} pairs", fontsize=9)
        ax.set(xlabel="key j", ylabel="query i", xticks=[], yticks=[])
    fig.suptitle(f"Who attends to whom (n = {n}): a window keeps about n·w pairs, linear in n", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


FIGURES = {
    "efficient_online_softmax.png": draw_online_softmax,
    "efficient_explicit_vs_tiled.png": draw_explicit_vs_tiled,
    "efficient_patterns.png": draw_patterns,
}
