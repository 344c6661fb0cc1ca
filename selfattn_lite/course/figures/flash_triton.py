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
    """Left: the one-dimensional launch grid the kernel uses, ceil(L / block_m) * B * H programs; program pid takes
    query block pid % ceil(L / block_m) of head pid // ceil(L / block_m). Right: what the programs of one head do
    over a causal 128 x 128 score matrix, blocks of 32 queries and 16 keys (sizes the kernel accepts: powers of
    2, at least 16)."""
    fig = Figure(figsize=(11.5, 4.6))
    FigureCanvasAgg(fig)
    ax_grid, ax_map = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1, 1.25]))
    n_m, n_bh = 4, 3                                  # query blocks per head, heads (B * H)
    for pid in range(n_m * n_bh):
        m, head = pid % n_m, pid // n_m
        row, col = divmod(pid, 4)
        ax_grid.add_patch(Rectangle((col, row), 0.92, 0.92, facecolor=ORANGE if head == 0 else "#F5D79E",
                                    edgecolor="#333333"))
        ax_grid.text(col + 0.46, row + 0.3, f"pid {pid}", ha="center", va="center", fontsize=9, weight="bold")
        ax_grid.text(col + 0.46, row + 0.62, f"block {m}, head {head}", ha="center", va="center", fontsize=7.5)
    ax_grid.set_xlim(-0.1, 4)
    ax_grid.set_ylim(n_m * n_bh / 4, -0.1)
    ax_grid.set_aspect("equal")
    ax_grid.set_xticks([])
    ax_grid.set_yticks([])
    ax_grid.set_xlabel("tl.program_id(0) = pid, one grid axis (drawn in rows of 4), the order without a mask;\n"
                       "causal, a head's order is reversed (block 3 - pid % 4): its busiest, last block runs first",
                       fontsize=9)
    ax_grid.set_title("grid = (ceil(L / block_m) * B * H,) = (12,): query block pid % 4 of head pid // 4;\n"
                      "one head's programs are neighbours, all run the same code at once", fontsize=9)
    draw_block_map(ax_map, 128, 128, 32, 16, True)
    ax_map.set_title("the four programs of head 0, causal, L = S = 128, block_m = 32, block_n = 16:\n"
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
    box(ax, 7.45, 3.05, "s = q k^T scale log2(e)\n(block_m, block_n)\np = 2^(s - m_new)", "#ffffff",
        w=2.3, h=1.0, fontsize=9)
    box(ax, 9.8, 3.05, "m, l  (block_m,)\nacc (block_m, D)\nfloat32", "#d9ead3", w=1.6, h=1.0, fontsize=9)
    box(ax, 7.45, 1.45, "out = acc / l\nlse = (m + log2 l) ln 2", "#d9ead3", w=2.2, h=0.75, fontsize=9)
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
