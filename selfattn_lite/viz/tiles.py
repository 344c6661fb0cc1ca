"""Which tiles of the n x n score matrix a tiled (FlashAttention-style) kernel computes.

``draw_tile_plan`` is the static picture; ``TileWidget`` adds sliders for n and the block
size, switches for causal and a sliding window, and a play button that walks through the
tiles in the kernel's loop order (query block by query block, key tiles left to right).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..efficient import TileKind, sliding_window_mask, tile_plan
from .core import HeatmapWidget

__all__ = ["TILE_COLORS", "draw_tile_plan", "TileWidget"]

# Okabe-Ito: computed without mask, computed with mask, masked element, current tile
TILE_COLORS = {TileKind.FULL: "#0072B2", TileKind.PARTIAL: "#56B4E9", "masked": "#d9d9d9", "current": "#E69F00"}


def draw_tile_plan(n: int, block_size: int, *, is_causal: bool = True, window: int | None = None,
                   step: int | None = None, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Draw the (n, n) score matrix cut into tiles: computed, masked inside, or skipped.

    Args:
        n: queries = keys. block_size: tile side. is_causal, window: the mask (see
            ``efficient.tile_plan``).
        step: draw only the first ``step`` tiles in loop order as done, the next one as
            current (None: all done).

    Returns:
        The Axes.
    """
    plan = tile_plan(n, block_size=block_size, is_causal=is_causal, window=window)
    allowed = sliding_window_mask(n, window, is_causal=is_causal) if window else (
        torch.ones(n, n, dtype=torch.bool).tril() if is_causal else torch.ones(n, n, dtype=torch.bool))
    Tq, Tk = plan.shape
    total = Tq * Tk
    step = total if step is None else max(0, min(step, total))
    if ax is None:
        fig = Figure(figsize=(5, 5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()

    # element colours: white (not visited yet / skipped), tile colour (computed), grey (masked inside a tile)
    image = np.ones((n, n, 3))
    rgb = {key: np.array([int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]) for key, c in TILE_COLORS.items()}
    for t in range(min(step + 1, total)):
        i, j = divmod(t, Tk)
        kind = int(plan[i, j])
        if kind == TileKind.SKIP:
            continue
        rows, cols = slice(i * block_size, (i + 1) * block_size), slice(j * block_size, (j + 1) * block_size)
        tile = np.where(allowed[rows, cols].numpy()[..., None], rgb[kind], rgb["masked"])
        image[rows, cols] = tile
    ax.imshow(image, extent=(0, n, n, 0), interpolation="nearest")
    for t in range(total):
        i, j = divmod(t, Tk)
        x0, y0 = j * block_size, i * block_size
        w, h = min(block_size, n - x0), min(block_size, n - y0)
        if int(plan[i, j]) == TileKind.SKIP and t < step:
            ax.add_patch(Rectangle((x0, y0), w, h, fill=False, hatch="//", edgecolor="#999999", linewidth=0))
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="#333333", linewidth=0.6))
    if step < total:
        i, j = divmod(step, Tk)
        ax.add_patch(Rectangle((j * block_size, i * block_size), min(block_size, n - j * block_size),
                               min(block_size, n - i * block_size), fill=False,
                               edgecolor=TILE_COLORS["current"], linewidth=3))
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    every = max(1, math.ceil(Tk / 8))                    # at most ~8 labelled tile boundaries
    ticks = list(range(0, n, block_size * every))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xlabel("key position j (key tiles)")
    ax.set_ylabel("query position i (query tiles)")
    computed = int((plan != TileKind.SKIP).sum())
    ax.set_title(title or f"n={n}, block={block_size}: {computed} of {total} tiles computed, "
                          f"{total - computed} skipped", fontsize=9)
    handles = [Patch(color=TILE_COLORS[TileKind.FULL], label="computed, no mask"),
               Patch(color=TILE_COLORS[TileKind.PARTIAL], label="computed, masked inside"),
               Patch(facecolor="white", edgecolor="#999999", hatch="//", label="skipped"),
               Patch(color=TILE_COLORS["masked"], label="masked element")]
    if step < total:                                     # mid-loop: the current tile, and the tiles still ahead
        handles += [Patch(facecolor="white", edgecolor=TILE_COLORS["current"], linewidth=2, label="current tile"),
                    Patch(facecolor="white", edgecolor="#333333", linewidth=0.6, label="not visited yet")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8, frameon=False)
    return ax


class TileWidget(HeatmapWidget):
    """Sliders for n and the block size; press play to watch the kernel visit the tiles.

    Attributes (for tests and asserts): ``plan`` (the tile plan), ``computed``, ``skipped``,
    ``current`` (the (query tile, key tile) at the current step, None when finished),
    ``score_memory`` (floats of scores held at once: block^2 tiled vs n^2 explicit).
    """

    def __init__(self, n: int = 64, block_size: int = 8, *, is_causal: bool = True, window: int = 0):
        import ipywidgets as widgets

        style = {"description_width": "initial"}
        self.n_slider = widgets.IntSlider(value=n, min=8, max=128, step=8, description="n", style=style)
        self.block_slider = widgets.IntSlider(value=block_size, min=2, max=64, step=2, description="block size",
                                              style=style)
        self.causal = widgets.Checkbox(value=is_causal, description="causal", indent=False)
        self.window_slider = widgets.IntSlider(value=window, min=0, max=128, step=4,
                                               description="window (0 = none)", style=style)
        self.step_slider = widgets.IntSlider(value=0, min=0, max=1, description="step", style=style)
        self.play = widgets.Play(value=0, min=0, max=1, interval=250, description="play")
        widgets.jslink((self.play, "value"), (self.step_slider, "value"))
        self._syncing = False
        super().__init__([self.step_slider], figsize=(5.2, 5.6))   # base class: redraw when the step moves
        for control in (self.n_slider, self.block_slider, self.causal, self.window_slider):
            control.observe(self._on_shape_change, names="value")
        self.ui = widgets.VBox([widgets.HBox([self.n_slider, self.block_slider, self.causal]),
                                widgets.HBox([self.window_slider, self.play, self.step_slider]), self.image])
        self._on_shape_change(None)

    @property
    def window(self) -> int | None:
        return self.window_slider.value or None

    @property
    def plan(self) -> torch.Tensor:
        return tile_plan(self.n_slider.value, block_size=self.block_slider.value, is_causal=self.causal.value,
                         window=self.window)

    @property
    def total(self) -> int:
        return math.ceil(self.n_slider.value / self.block_slider.value) ** 2

    @property
    def computed(self) -> int:
        return int((self.plan != TileKind.SKIP).sum())

    @property
    def skipped(self) -> int:
        return self.total - self.computed

    @property
    def current(self) -> tuple[int, int] | None:
        step = self.step_slider.value
        return None if step >= self.total else divmod(step, self.plan.shape[1])

    @property
    def score_memory(self) -> tuple[int, int]:
        """(scores held at once by the tiled kernel, by explicit attention), per head."""
        return min(self.block_slider.value, self.n_slider.value) ** 2, self.n_slider.value ** 2

    def _on_change(self, change) -> None:
        if not self._syncing:
            self.update()

    def _on_shape_change(self, change) -> None:
        """New n, block, mask: show the whole plan (press play to replay it), redraw once."""
        self._syncing = True
        try:
            self.step_slider.max = self.play.max = self.total
            self.step_slider.value = self.play.value = self.total
        finally:
            self._syncing = False
        self.update()

    def draw(self, fig: Figure) -> None:
        ax = fig.add_subplot()
        n, block = self.n_slider.value, self.block_slider.value
        tiled, explicit = self.score_memory
        where = "done" if self.current is None else f"now: query tile {self.current[0]}, key tile {self.current[1]}"
        title = (f"n={n}, block={block}: {self.computed} of {self.total} tiles computed, "
                 f"{self.skipped} skipped\n({where}); "
                 f"scores held: {tiled:,} (a tile) vs {explicit:,} (n x n)")
        draw_tile_plan(n, block, is_causal=self.causal.value, window=self.window, step=self.step_slider.value,
                       ax=ax, title=title)
        fig.tight_layout()
