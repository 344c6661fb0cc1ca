"""Ring attention, one step at a time: which K/V block each rank holds, which scores it computes.

``draw_ring_step`` is the static picture; ``RingWidget`` adds a step slider (and play), the
number of ranks, the layout and the causal switch.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch

from ..distributed import ring_schedule, ring_tiles, shard_segments
from .core import HeatmapWidget

__all__ = ["RANK_COLORS", "ring_work", "draw_ring_step", "RingWidget"]

# Okabe-Ito, one colour per rank (up to 8 ranks)
RANK_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]


def ring_work(L: int, world_size: int, step: int, *, layout: str = "contiguous", is_causal: bool = True) -> np.ndarray:
    """(L, L) int grid: -1 where no rank has computed the score yet (or ever: skipped), else
    ``rank + world_size * s`` for the rank that computed it and the step s <= ``step`` when it did."""
    grid = -np.ones((L, L), dtype=int)
    segs = [shard_segments(L, r, world_size, layout=layout) for r in range(world_size)]
    rows_of = [np.concatenate([np.arange(a, b) for a, b in seg]) for seg in segs]
    for s in range(min(step, world_size - 1) + 1):
        for r, src in enumerate(ring_schedule(world_size)[s]):
            for rows, cols, _, mask in ring_tiles(segs[r], segs[src], is_causal=is_causal):
                qi, kj = rows_of[r][rows], rows_of[src][cols]
                allowed = np.ones((len(qi), len(kj)), bool) if mask is None else mask.numpy()
                block = grid[np.ix_(qi, kj)]
                grid[np.ix_(qi, kj)] = np.where(allowed, r + world_size * s, block)
    return grid


def draw_ring_step(world_size: int, step: int, *, L: int | None = None, layout: str = "contiguous",
                   is_causal: bool = True, fig: Figure | None = None) -> Figure:
    """Left: the ring, each rank with the K/V block it holds at ``step``. Right: the L x L scores,
    coloured by the rank that computes them, dark for this step, light for earlier steps."""
    L = 4 * world_size if L is None else L
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(10, 4.6))
    ax_ring, ax_scores = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.15]})
    held = ring_schedule(world_size)[step]
    _draw_ring(ax_ring, world_size, held, step, layout, L)
    grid = ring_work(L, world_size, step, layout=layout, is_causal=is_causal)
    image = np.ones((L, L, 3))
    for code in np.unique(grid[grid >= 0]):
        rank, s = code % world_size, code // world_size
        rgb = np.array([int(RANK_COLORS[rank][i:i + 2], 16) / 255 for i in (1, 3, 5)])
        image[grid == code] = rgb if s == step else 0.35 * rgb + 0.65
    ax_scores.imshow(image, extent=(0, L, L, 0), interpolation="nearest")
    ticks = list(range(0, L + 1, max(1, L // 8)))
    ax_scores.set(xticks=ticks, yticks=ticks, xlabel="key position j", ylabel="query position i")
    done = int((grid >= 0).sum())
    needed = L * (L + 1) // 2 if is_causal else L * L
    ax_scores.set_title(f"needed scores computed so far: {done} of {needed} "
                        f"({'causal: masked ones not counted' if is_causal else 'full'})", fontsize=9)
    ax_scores.legend(handles=[Patch(color=RANK_COLORS[r], label=f"rank {r}") for r in range(world_size)],
                     loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(world_size, 4), fontsize=8,
                     frameon=False)
    fig.suptitle(f"Ring attention, {layout} layout, step {step} (steps 0 to {world_size - 1}): rank r holds the K/V "
                 f"block of rank (r - {step}) mod {world_size}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _draw_ring(ax: Axes, world_size: int, held: list[int], step: int, layout: str, L: int) -> None:
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-1.6, 1.6)
    ax.set_aspect("equal")
    ax.axis("off")
    angle = [math.pi / 2 - 2 * math.pi * r / world_size for r in range(world_size)]
    xy = [(1.05 * math.cos(a), 1.05 * math.sin(a)) for a in angle]
    for r in range(world_size):
        rows = ", ".join(f"{a}-{b - 1}" for a, b in shard_segments(L, r, world_size, layout=layout))
        ax.text(*xy[r], f"rank {r}\nQ rows {rows}\nholds K/V {held[r]}", ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.3", facecolor=RANK_COLORS[held[r]], alpha=0.35,
                          edgecolor=RANK_COLORS[r], linewidth=2))
        if step < world_size - 1:
            nxt = xy[(r + 1) % world_size]
            ax.add_patch(FancyArrowPatch(xy[r], nxt, arrowstyle="-|>", mutation_scale=12, color="#555555",
                                         shrinkA=28, shrinkB=28, connectionstyle="arc3,rad=-0.25"))
    ax.set_title("next: every rank sends its block to rank r + 1" if step < world_size - 1
                 else "last step: nothing left to send", fontsize=9)


class RingWidget(HeatmapWidget):
    """Step through ring attention: a step slider with play, ranks, layout and causal.

    Attributes (for asserts): ``held`` (K/V block of each rank at this step), ``grid``
    (``ring_work``), ``work`` (score entries computed per rank so far).
    """

    def __init__(self, world_size: int = 4, *, layout: str = "contiguous", is_causal: bool = True):
        import ipywidgets as widgets

        style = {"description_width": "initial"}
        self.world_slider = widgets.IntSlider(value=world_size, min=2, max=8, description="ranks W", style=style)
        self.layout_choice = widgets.Dropdown(options=["contiguous", "zigzag"], value=layout, description="layout")
        self.causal = widgets.Checkbox(value=is_causal, description="causal", indent=False)
        self.step_slider = widgets.IntSlider(value=0, min=0, max=world_size - 1, description="step", style=style)
        self.play = widgets.Play(value=0, min=0, max=world_size - 1, interval=900, description="play")
        widgets.jslink((self.play, "value"), (self.step_slider, "value"))
        super().__init__([self.world_slider, self.layout_choice, self.causal, self.play, self.step_slider],
                         figsize=(10, 4.6), dpi=80)
        self.world_slider.observe(self._on_world, names="value")
        self.update()

    def _on_world(self, change) -> None:
        self.step_slider.max = self.play.max = self.world_slider.value - 1

    @property
    def step(self) -> int:
        """The step shown (kept below the number of ranks while the sliders catch up)."""
        return min(self.step_slider.value, self.world_slider.value - 1)

    @property
    def L(self) -> int:
        return 4 * self.world_slider.value

    @property
    def held(self) -> list[int]:
        return ring_schedule(self.world_slider.value)[self.step]

    @property
    def grid(self) -> np.ndarray:
        return ring_work(self.L, self.world_slider.value, self.step, layout=self.layout_choice.value,
                         is_causal=self.causal.value)

    @property
    def work(self) -> list[int]:
        grid, w = self.grid, self.world_slider.value
        return [int(((grid >= 0) & (grid % w == r)).sum()) for r in range(w)]

    def draw(self, fig: Figure) -> None:
        draw_ring_step(self.world_slider.value, self.step, L=self.L, layout=self.layout_choice.value,
                       is_causal=self.causal.value, fig=fig)
