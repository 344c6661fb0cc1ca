"""KV-cache pictures and widgets (notebooks 06 and 07).

Static: ``draw_cache_memory`` (cache next to weights for a real model), ``draw_head_sharing``
(which K/V head each query head reads), ``draw_block_table`` (a paged cache's pool).
Widgets: ``KVCalculatorWidget`` (preset, length, batch, dtype, K/V heads -> memory) and
``HeadSharingWidget`` (K/V heads -> grouping and the measured cache size).
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..kv_cache import PRESETS, KVCache, PagedKVCache, format_bytes, get_preset
from .core import HeatmapWidget

__all__ = [
    "KV_COLORS",
    "GROUP_COLORS",
    "DTYPE_BYTES",
    "draw_cache_memory",
    "draw_head_sharing",
    "draw_block_table",
    "KVCalculatorWidget",
    "HeadSharingWidget",
]

# Okabe-Ito, colour-blind safe
KV_COLORS = {"computed": "#D55E00", "recomputed": "#E69F00", "read": "#56B4E9",
             "weights": "#999999", "cache": "#0072B2", "free": "#ffffff"}
GROUP_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999"]
DTYPE_BYTES = {"fp32": 4, "bf16 / fp16": 2, "fp8 / int8": 1}
GPU_BYTES = 80 * 2**30  # one "80 GB" accelerator, for scale: nvidia-smi reports 81,920 MiB on an A100 80GB
#                         (81,559 MiB on an H100), so the "80 GB" of the name is about 80 GiB


def _new_axes(figsize) -> Axes:
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def draw_cache_memory(preset, seq_len: int, batch: int = 1, bytes_per_value: float = 2,
                      n_kv_heads: int | None = None, weight_bytes_per_value: float = 2,
                      ax: Axes | None = None) -> Axes:
    """Two bars: the model's weights and its KV cache for ``batch`` sequences of ``seq_len`` tokens.

    Args:
        preset: a ``ModelPreset`` or its name (see ``kv_cache.PRESETS``).
        bytes_per_value: of the cache (2 = bf16). n_kv_heads: override the preset's.
        weight_bytes_per_value: of the weights (2 = bf16).
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    kv = p.n_kv_heads if n_kv_heads is None else n_kv_heads
    cache = p.kv_bytes(seq_len, batch, bytes_per_value, n_kv_heads=kv)
    weights = p.weight_bytes(weight_bytes_per_value)
    ax = ax if ax is not None else _new_axes((7, 2.6))
    gib = [weights / 2**30, cache / 2**30]
    bars = ax.barh(["weights", "KV cache"], gib, color=[KV_COLORS["weights"], KV_COLORS["cache"]])
    for bar, n in zip(bars, (weights, cache)):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {format_bytes(n)}", va="center", fontsize=9)
    gpu = GPU_BYTES / 2**30
    ax.axvline(gpu, color="#333333", linestyle="--", linewidth=1)
    ax.text(gpu, 1.45, f" one 80 GB GPU (about {gpu:.0f} GiB)", fontsize=8, va="bottom")
    ax.set_xlim(0, max(gib + [gpu]) * 1.3)
    ax.set_ylim(-0.6, 1.8)
    ax.set_xlabel("memory (GiB)")
    share = "larger than" if cache > weights else "smaller than"
    heads = "latent cache (MLA)" if p.attention == "MLA" else f"{kv} K/V heads"
    ax.set_title(f"{p.name}, {heads}, batch {batch} x {seq_len:,} tokens: cache {share} the weights",
                 fontsize=10)
    return ax


def draw_head_sharing(n_heads: int = 8, n_kv_heads: int = 2, ax: Axes | None = None,
                      title: str | None = None) -> Axes:
    """Query heads (top) joined to the K/V head they read (bottom): head i reads K/V head i // g."""
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    ax = ax if ax is not None else _new_axes((4, 3))
    g = n_heads // n_kv_heads
    for i in range(n_heads):
        color = GROUP_COLORS[(i // g) % len(GROUP_COLORS)]
        ax.add_patch(Rectangle((i + 0.1, 2.0), 0.8, 0.7, facecolor=color, edgecolor="black", linewidth=0.6))
        ax.text(i + 0.5, 2.35, f"q{i}", ha="center", va="center", fontsize=7)
    for j in range(n_kv_heads):
        center = j * g + g / 2                           # under the middle of its group
        color = GROUP_COLORS[j % len(GROUP_COLORS)]
        ax.add_patch(Rectangle((center - 0.4, 0.0), 0.8, 0.7, facecolor=color, edgecolor="black", linewidth=1.2))
        ax.text(center, 0.35, f"kv{j}", ha="center", va="center", fontsize=7)
        for i in range(j * g, (j + 1) * g):
            ax.plot([i + 0.5, center], [2.0, 0.7], color="#555555", linewidth=0.8)
    ax.set_xlim(-0.2, n_heads + 0.2)
    ax.set_ylim(-0.5, 3.2)
    ax.axis("off")
    ax.set_title(title or f"{n_heads} query heads, {n_kv_heads} K/V heads (groups of {g})", fontsize=9)
    return ax


def draw_block_table(pool: PagedKVCache, ax: Axes | None = None, per_row: int = 16,
                     title: str | None = None) -> Axes:
    """The block pool of a ``PagedKVCache``: each block coloured by the sequence that owns it,
    filled in proportion to the slots used; white blocks are free."""
    ax = ax if ax is not None else _new_axes((8, 0.6 + 0.5 * math.ceil(pool.n_blocks / per_row)))
    owner, used = {}, {}
    for n, (seq, table) in enumerate(pool.block_tables.items()):
        for k, block in enumerate(table):
            owner[block] = n
            full = pool.lengths[seq] - k * pool.block_size
            used[block] = min(pool.block_size, full) / pool.block_size
    rows = math.ceil(pool.n_blocks / per_row)
    for b in range(pool.n_blocks):
        r, c = divmod(b, per_row)
        y = rows - 1 - r
        ax.add_patch(Rectangle((c, y), 0.9, 0.8, facecolor="white", edgecolor="#333333", linewidth=0.6))
        if b in owner:
            color = GROUP_COLORS[owner[b] % len(GROUP_COLORS)]
            ax.add_patch(Rectangle((c, y), 0.9 * used[b], 0.8, facecolor=color, edgecolor="none"))
            if used[b] < 1:
                ax.add_patch(Rectangle((c + 0.9 * used[b], y), 0.9 * (1 - used[b]), 0.8, facecolor="none",
                                       hatch="///", edgecolor="#999999", linewidth=0))
    ax.set_xlim(-0.1, per_row)
    ax.set_ylim(-0.1, rows)
    ax.axis("off")
    waste = pool.slots_reserved - pool.tokens_stored
    ax.set_title(title or f"{pool.blocks_in_use} of {pool.n_blocks} blocks in use, {pool.tokens_stored} tokens, "
                          f"{waste} empty slots (hatched)", fontsize=9)
    return ax


class KVCalculatorWidget(HeatmapWidget):
    """Pick a real model, a sequence length, a batch, a cache dtype and a number of K/V heads;
    see its KV cache next to its weights.

    Attributes:
        preset, seq_len, batch, dtype, kv_heads: the controls (ipywidgets).
    """

    SEQ_LENS = [2**k for k in range(8, 18)]     # 256 .. 131,072
    BATCHES = [2**k for k in range(0, 9)]       # 1 .. 256

    def __init__(self, preset: str = "Llama-2-7B", seq_len: int = 4096, batch: int = 1, dtype: str = "bf16 / fp16"):
        import ipywidgets as widgets

        p = get_preset(preset)
        style = {"description_width": "initial"}
        self.preset = widgets.Dropdown(options=list(PRESETS), value=p.name, description="model", style=style)
        self.seq_len = widgets.SelectionSlider(options=self.SEQ_LENS, value=seq_len, description="tokens",
                                               style=style)
        self.batch = widgets.SelectionSlider(options=self.BATCHES, value=batch, description="batch", style=style)
        self.dtype = widgets.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="cache dtype",
                                      style=style)
        self.kv_heads = widgets.Dropdown(options=self._kv_options(p), value=p.n_kv_heads,
                                         description="K/V heads", style=style)
        self._syncing = False
        super().__init__([self.preset, self.seq_len, self.batch, self.dtype, self.kv_heads], figsize=(7.5, 2.8))
        self.ui.children = (widgets.VBox([widgets.HBox([self.preset, self.kv_heads, self.dtype]),
                                          widgets.HBox([self.seq_len, self.batch])]), self.image)
        self.update()

    @staticmethod
    def _divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    @classmethod
    def _kv_options(cls, p) -> list[int]:
        """K/V head counts to offer: divisors of the query heads; MLA caches one latent, so only its own."""
        return [p.n_kv_heads] if p.attention == "MLA" else cls._divisors(p.n_heads)

    def _on_change(self, change) -> None:
        if self._syncing:
            return
        if change["owner"] is self.preset:      # a new model: reset K/V heads to its own, then redraw once
            p = get_preset(change["new"])
            self._syncing = True
            self.kv_heads.options = self._kv_options(p)
            self.kv_heads.value = p.n_kv_heads
            self._syncing = False
        self.update()

    @property
    def model(self):
        return get_preset(self.preset.value)

    @property
    def cache_bytes(self) -> int:
        """2 x layers x kv_heads x head_dim x tokens x batch x bytes (the preset's ``kv_bytes``: MLA and
        cross-layer sharing included)."""
        return self.model.kv_bytes(self.seq_len.value, self.batch.value, DTYPE_BYTES[self.dtype.value],
                                   n_kv_heads=self.kv_heads.value)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes(2)

    def draw(self, fig: Figure) -> None:
        ax = fig.add_subplot()
        draw_cache_memory(self.model, self.seq_len.value, self.batch.value, DTYPE_BYTES[self.dtype.value],
                          n_kv_heads=self.kv_heads.value, ax=ax)
        fig.tight_layout()


class HeadSharingWidget(HeatmapWidget):
    """Choose how many K/V heads 8 query heads share; see the grouping and the cache it needs.

    The cache sizes are measured: ``KVCache`` objects of ``n_layers`` layers are allocated
    for every choice and their ``nbytes`` summed.

    Args:
        n_heads, head_dim, n_layers, max_len: the shape of the model whose cache is shown.
    """

    def __init__(self, n_heads: int = 8, head_dim: int = 16, n_layers: int = 4, max_len: int = 512,
                 n_kv_heads: int = 2):
        import ipywidgets as widgets

        self.n_heads = n_heads
        options = [d for d in range(1, n_heads + 1) if n_heads % d == 0]
        self.cache_bytes = {kv: sum(KVCache(1, kv, max_len, head_dim).nbytes for _ in range(n_layers))
                            for kv in options}
        self.slider = widgets.SelectionSlider(options=options, value=n_kv_heads, description="K/V heads",
                                              style={"description_width": "initial"})
        super().__init__([self.slider], figsize=(9, 2.8))
        self.update()

    @property
    def group_size(self) -> int:
        return self.n_heads // self.slider.value

    def draw(self, fig: Figure) -> None:
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        kv = self.slider.value
        draw_head_sharing(self.n_heads, kv, ax=left)
        options = list(self.cache_bytes)
        colors = [KV_COLORS["cache"] if o == kv else "#cccccc" for o in options]
        right.bar([str(o) for o in options], [self.cache_bytes[o] / 1024 for o in options], color=colors)
        right.set_xlabel("K/V heads")
        right.set_ylabel("KVCache.nbytes (KiB)")
        full = self.cache_bytes[self.n_heads]
        right.set_title(f"cache = {self.cache_bytes[kv] / full:.3g} x the MHA cache", fontsize=9)
        fig.tight_layout()
