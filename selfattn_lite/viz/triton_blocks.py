"""Widget of notebook 15: choose the Triton kernel's block sizes, see the work per program and the
HBM traffic (``triton_attention.program_work`` and ``hbm_bytes``); and the block map it draws (which
key blocks each program loads, with or without a mask), also drawn in notebook 15's figures."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..triton_attention import hbm_bytes, key_block_bounds, program_grid, program_work
from .core import HeatmapWidget

__all__ = ["TritonBlockWidget", "block_map", "draw_block_map"]

# notebook 08's tile-plan colours (colorblind-safe)
BLUE, ORANGE, GREY = "#0072B2", "#E69F00", "#999999"
LIGHT_BLUE = "#56B4E9"
UNMASKED, MASKED, NOT_LOADED = 2, 1, 0


def block_map(L: int, S: int, block_m: int, block_n: int, is_causal: bool) -> np.ndarray:
    """(ceil(L / block_m), ceil(S / block_n)) array: 2 = loaded without a mask, 1 = loaded and masked,
    0 = never loaded, for each (program, key block) of the forward kernel (``key_block_bounds``)."""
    rows = []
    for q0 in range(0, L, block_m):
        unmasked_end, end = key_block_bounds(q0, block_m, block_n, S, is_causal)
        rows.append([UNMASKED if k0 < unmasked_end else MASKED if k0 < end else NOT_LOADED
                     for k0 in range(0, S, block_n)])
    return np.array(rows, dtype=np.int8)


def draw_block_map(ax, L: int, S: int, block_m: int, block_n: int, is_causal: bool, *, label_programs=True,
                   highlight: int | None = None) -> None:
    """Draw ``block_map`` on ax: one row of blocks per program, in the colours of notebook 08's tile plan."""
    plan = block_map(L, S, block_m, block_n, is_causal)
    for m, row in enumerate(plan):
        for b, kind in enumerate(row):
            x0, y0 = b * block_n, m * block_m
            w, h = min(block_n, S - x0), min(block_m, L - y0)
            face = {UNMASKED: BLUE, MASKED: LIGHT_BLUE, NOT_LOADED: "white"}[int(kind)]
            ax.add_patch(Rectangle((x0, y0), w, h, facecolor=face, edgecolor="#333333", linewidth=0.5,
                                   hatch="//" if kind == NOT_LOADED else None))
        if label_programs:
            ax.text(-0.02 * S, m * block_m + min(block_m, L - m * block_m) / 2, f"program {m}", ha="right",
                    va="center", fontsize=8)
    if highlight is not None:
        ax.add_patch(Rectangle((0, highlight * block_m), S, min(block_m, L - highlight * block_m), fill=False,
                               edgecolor=ORANGE, linewidth=2.5))
    ax.set_xlim(0, S)
    ax.set_ylim(L, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key position j (blocks of block_n, one loop step each)")
    if label_programs:
        ax.set_yticks([])
    else:
        ax.set_ylabel("query position i")
    ax.legend(handles=[Patch(color=BLUE, label="loaded, no mask (stage 1)"),
                       Patch(color=LIGHT_BLUE, label="loaded, masked (stage 2)"),
                       Patch(facecolor="white", edgecolor=GREY, hatch="//", label="never loaded")],
              loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)

POWERS = [16, 32, 64, 128, 256]


class TritonBlockWidget(HeatmapWidget):
    """Sliders for n, block_m, block_n and D, a causal switch: the block map of the programs (left)
    and the bytes read from and written to HBM against explicit attention's (right).

    Attributes (for tests and asserts): ``grid`` (the launch grid), ``work`` (``program_work`` of the
    last program, the busiest when causal) and ``traffic`` (``hbm_bytes``), for B = 1, H = 16, bf16.
    """

    def __init__(self, n: int = 1024, block_m: int = 128, block_n: int = 64, D: int = 128, is_causal: bool = True):
        import ipywidgets as widgets

        style = {"description_width": "initial"}
        self.n_slider = widgets.SelectionSlider(options=[256, 512, 1024, 2048, 4096], value=n, description="n",
                                                style=style)
        self.m_slider = widgets.SelectionSlider(options=POWERS, value=block_m, description="block_m", style=style)
        self.n_block_slider = widgets.SelectionSlider(options=POWERS, value=block_n, description="block_n",
                                                      style=style)
        self.d_slider = widgets.SelectionSlider(options=[16, 32, 64, 128], value=D, description="D", style=style)
        self.causal = widgets.Checkbox(value=is_causal, description="causal", indent=False)
        super().__init__([self.n_slider, self.m_slider, self.n_block_slider, self.d_slider, self.causal],
                         figsize=(10, 4.2))
        self.update()

    @property
    def grid(self) -> tuple[int, int]:
        return program_grid(1, 16, self.n_slider.value, self.m_slider.value)

    @property
    def work(self) -> dict:
        n, bm = self.n_slider.value, self.m_slider.value
        last_q0 = (self.grid[0] - 1) * bm
        return program_work(bm, self.n_block_slider.value, self.d_slider.value, n, is_causal=self.causal.value,
                            q0=last_q0)

    @property
    def traffic(self) -> dict:
        n = self.n_slider.value
        return hbm_bytes(n, n, self.d_slider.value, self.m_slider.value, self.n_block_slider.value, H=16,
                         is_causal=self.causal.value)

    def draw(self, fig: Figure) -> None:
        n, bm, bn = self.n_slider.value, self.m_slider.value, self.n_block_slider.value
        ax_map, ax_bytes = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1, 1.1]))
        draw_block_map(ax_map, n, n, bm, bn, self.causal.value, label_programs=False, highlight=self.grid[0] - 1)
        w = self.work
        ax_map.set_title(f"grid {self.grid[0]} x {self.grid[1]} programs (h = 16); the last one (orange):\n"
                         f"{w['key_blocks']} key blocks, {w['flops'] / 1e6:.0f} MFLOP, "
                         f"{w['on_chip_bytes'] / 1024:.0f} KiB on chip", fontsize=9)
        t = self.traffic
        names = ["Q", "K and V", "O + lse", "kernel total", "explicit"]
        mib = [t["q"], t["kv"], t["o"], t["total"], t["explicit"]]
        mib = [b / 2**20 for b in mib]
        colors = ["#D55E00", "#0072B2", "#999999", "#56B4E9", "#E69F00"]
        bars = ax_bytes.barh(names[::-1], mib[::-1], color=colors[::-1])
        for bar, value in zip(bars, mib[::-1]):
            ax_bytes.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:,.0f}", va="center",
                          fontsize=8)
        ax_bytes.set_xlabel("MiB moved to or from HBM (B = 1, h = 16, bf16)")
        ax_bytes.set_title(f"K and V are read ceil(n / block_m) = {self.grid[0]} times"
                           f"{' (about half, causal)' if self.causal.value else ''};\n"
                           "explicit attention writes and reads the n x n matrix", fontsize=9)
        ax_bytes.margins(x=0.25)
        fig.tight_layout()
