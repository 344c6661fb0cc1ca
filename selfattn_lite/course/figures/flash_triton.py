"""Figures of notebook 15: the grid of Triton programs over the score matrix, and one program's loop
over the key blocks (what stays on chip, what travels from HBM)."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ...viz.triton_blocks import LIGHT_BLUE, block_map, draw_block_map
from ._draw import BLUE, ORANGE, arrow, box, diagram

# block_map and draw_block_map are the widget's (viz.triton_blocks); the figures draw with them too
__all__ = ["block_map", "draw_block_map", "draw_program_grid", "draw_program_loop", "FIGURES"]

def draw_program_grid() -> Figure:
    """Left: the launch grid, one program per (query block, batch * head). Right: what the programs of
    one head do over a causal 64 x 64 score matrix, blocks of 16 queries and 8 keys."""
    fig = Figure(figsize=(11.5, 4.6))
    FigureCanvasAgg(fig)
    ax_grid, ax_map = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1, 1.25]))
    n_m, n_bh = 4, 3
    for m in range(n_m):
        for bh in range(n_bh):
            ax_grid.add_patch(Rectangle((m, bh), 0.92, 0.92, facecolor=ORANGE if bh == 0 else "#F5D79E",
                                        edgecolor="#333333"))
            ax_grid.text(m + 0.46, bh + 0.46, f"({m}, {bh})", ha="center", va="center", fontsize=9)
    ax_grid.set_xlim(-0.1, n_m)
    ax_grid.set_ylim(n_bh, -0.1)
    ax_grid.set_aspect("equal")
    ax_grid.set_xticks([m + 0.46 for m in range(n_m)], [f"{m}" for m in range(n_m)])
    ax_grid.set_yticks([bh + 0.46 for bh in range(n_bh)], [f"{bh}" for bh in range(n_bh)])
    ax_grid.set_xlabel("tl.program_id(0): query block (L / block_m of them)")
    ax_grid.set_ylabel("tl.program_id(1): batch x head")
    ax_grid.set_title("grid = (ceil(L / block_m), B * H): every program runs the same code\n"
                      "on its own block of queries, all at once on a GPU", fontsize=9)
    draw_block_map(ax_map, 64, 64, 16, 8, True)
    ax_map.set_title("the four programs of head 0, causal, L = S = 64, block_m = 16, block_n = 8:\n"
                     "each walks its row of key blocks, left to right", fontsize=9)
    fig.tight_layout()
    return fig


def draw_program_loop() -> Figure:
    """One program: Q block loaded once, K and V blocks streamed through the loop, m, l, acc kept on chip,
    O and the log-sum-exp written once. The scores never go back to HBM."""
    fig, ax = diagram((11, 4.4), (0, 11), (0, 4.6))
    ax.add_patch(Rectangle((0.2, 0.3), 2.6, 4.0, facecolor="#eeeeee", edgecolor="#333333"))
    ax.text(1.5, 4.45, "HBM (GPU memory: large, slow)", ha="center", fontsize=10)
    ax.add_patch(Rectangle((4.2, 0.3), 6.5, 4.0, facecolor="#e8f1fa", edgecolor=BLUE))
    ax.text(7.45, 4.45, "on chip: registers and shared memory (small, fast), one program", ha="center",
            fontsize=10, color=BLUE)
    box(ax, 1.5, 3.7, "Q  (N, L, D)", ORANGE, w=2.2, h=0.55)
    box(ax, 1.5, 2.8, "K  (N, S, D)", LIGHT_BLUE, w=2.2, h=0.55)
    box(ax, 1.5, 2.0, "V  (N, S, D)", LIGHT_BLUE, w=2.2, h=0.55)
    box(ax, 1.5, 1.0, "O (N, L, D), lse (N, L)", "#bbbbbb", w=2.4, h=0.55, fontsize=9)
    box(ax, 5.3, 3.7, "q block\n(block_m, D)", ORANGE, w=1.6, h=0.7, fontsize=9)
    box(ax, 5.3, 2.4, "k, v block\n(block_n, D)", LIGHT_BLUE, w=1.6, h=0.7, fontsize=9)
    box(ax, 7.45, 3.05, "s = q k^T\n(block_m, block_n)\np = 2^(s - m_new)", "#ffffff", w=2.3, h=1.0, fontsize=9)
    box(ax, 9.8, 3.05, "m, l  (block_m,)\nacc (block_m, D)\nfloat32", "#d9ead3", w=1.6, h=1.0, fontsize=9)
    box(ax, 7.45, 1.45, "out = acc / l\nlse = m + log l", "#d9ead3", w=2.2, h=0.75, fontsize=9)
    arrow(ax, (2.6, 3.7), (4.5, 3.7))
    ax.text(3.55, 3.82, "load once", ha="center", fontsize=9)
    arrow(ax, (2.6, 2.6), (4.5, 2.45), color=BLUE)
    arrow(ax, (2.6, 2.0), (4.5, 2.35), color=BLUE)
    ax.text(5.3, 1.6, "one block per loop step,\nceil(end / block_n) steps", ha="center", fontsize=8, color=BLUE)
    arrow(ax, (6.1, 3.55), (6.3, 3.2))
    arrow(ax, (6.1, 2.5), (6.3, 2.85))
    arrow(ax, (8.65, 3.05), (8.95, 3.05))
    ax.text(7.45, 2.1, "update m, l, acc (online softmax),\nthen the next k, v block", ha="center", fontsize=8)
    arrow(ax, (9.8, 2.5), (8.4, 1.75))
    arrow(ax, (6.3, 1.4), (2.75, 1.05))
    ax.text(4.5, 1.32, "store once", ha="center", fontsize=9)
    ax.text(7.45, 0.5, "the block_m x block_n scores never leave the chip:\nthe L x S matrix is never in HBM",
            ha="center", fontsize=8.5, color=BLUE)
    return fig


FIGURES = {"triton_program_grid.png": draw_program_grid, "triton_program_loop.png": draw_program_loop}
