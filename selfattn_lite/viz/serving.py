"""Notebook 13's pictures: which keys each new token sees under a cache policy, and the bytes held.

``POLICIES`` maps a policy name to the cache that implements it; ``policy_mask`` gives the
equivalent (T, T) mask. ``draw_policy`` shades the keys the cache holds at every step;
``CachePolicyWidget`` lets a learner pick the policy and the step and reads the bytes off
real cache objects fed with that many tokens.
"""

from __future__ import annotations

import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..kv_cache import KVCache, RollingKVCache, SinkKVCache, format_bytes
from ..masks import causal_mask, sink_window_mask
from .core import HeatmapWidget

__all__ = ["POLICIES", "policy_mask", "policy_cache", "draw_policy", "CachePolicyWidget"]

POLICIES = ("full", "window", "sinks + window", "rolling")
_CMAP = ListedColormap(["#ffffff", "#d9d9d9", "#0072B2", "#E69F00", "#9ecae1"])
# 0 future, 1 evicted from the cache, 2 seen, 3 sink, 4 masked but still stored ("window": a mask, a growing cache)


def policy_mask(policy: str, T: int, *, window: int, n_sink: int) -> torch.Tensor:
    """(T, T) bool: key j visible to query i under ``policy`` ("window" and "rolling" are the same mask)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
    if policy == "full":
        return causal_mask(T)
    return sink_window_mask(T, n_sink if policy == "sinks + window" else 0, window)


def policy_cache(policy: str, *, window: int, n_sink: int, max_len: int, n_kv_heads: int = 1, head_dim: int = 8,
                 dtype: torch.dtype = torch.float32):
    """The cache object that implements ``policy`` for one sequence.

    "full" is a ``KVCache`` of max_len slots; "window" a plain ``KVCache`` too, the window
    applied by a mask (memory still grows); "rolling" a ``RollingKVCache`` of ``window``
    slots; "sinks + window" a ``SinkKVCache`` of n_sink + window slots.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
    if policy in ("full", "window"):
        return KVCache(1, n_kv_heads, max_len, head_dim, dtype=dtype)
    if policy == "rolling":
        return RollingKVCache(1, n_kv_heads, head_dim, window=window, dtype=dtype)
    return SinkKVCache(1, n_kv_heads, head_dim, window=window, n_sink=n_sink, dtype=dtype)


def _held_bytes(cache) -> int:
    """Bytes a cache holds for its tokens: filled slots for a growing cache, all slots for a fixed one."""
    return cache.nbytes if isinstance(cache, SinkKVCache) else cache.used_bytes   # a SinkKVCache is allocated whole


def draw_policy(policy: str, T: int, *, window: int, n_sink: int, step: int | None = None,
                ax: Axes | None = None) -> Axes:
    """Rows = the token being decoded, columns = key positions: blue seen, orange sink, grey evicted
    from the cache, pale blue masked but still stored (the "window" policy, a mask over a growing cache)."""
    mask = policy_mask(policy, T, window=window, n_sink=n_sink)
    grid = torch.zeros(T, T)
    stored = not isinstance(policy_cache(policy, window=window, n_sink=n_sink, max_len=T), SinkKVCache)  # grows
    grid[causal_mask(T)] = 4 if stored else 1        # written before, not visible: still stored, or evicted
    grid[mask] = 2
    if policy == "sinks + window":
        sinks = torch.zeros(T, T, dtype=torch.bool)
        sinks[:, :n_sink] = True
        grid[mask & sinks & causal_mask(T)] = 3
    if ax is None:
        fig = Figure(figsize=(4.2, 4.0))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
    ax.imshow(grid.numpy(), cmap=_CMAP, vmin=0, vmax=4, interpolation="nearest")
    if step is not None:
        ax.axhline(step - 0.5, color="black", linewidth=1)
        ax.axhline(step + 0.5, color="black", linewidth=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("token being decoded")
    ax.set_title(f"{policy}: {int(mask[-1].sum())} keys seen by the last token", fontsize=9)
    return ax


class CachePolicyWidget(HeatmapWidget):
    """Pick a cache policy and a decoding step; see which keys that token attends to and the bytes held.

    The bytes come from a real cache object of the policy (``policy_cache``) fed one
    token at a time up to the chosen step (n_kv_heads x head_dim values per key, float32).

    Args:
        T: tokens shown. window, n_sink: the policy's sizes. n_kv_heads, head_dim: of the cache.

    Attributes:
        policy, step: the controls. held_bytes, kept: bytes held and keys kept after ``step + 1`` tokens.
    """

    def __init__(self, T: int = 24, window: int = 6, n_sink: int = 2, n_kv_heads: int = 2, head_dim: int = 8,
                 policy: str = "sinks + window"):
        import ipywidgets as widgets

        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
        self.T, self.window, self.n_sink = T, window, n_sink
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        style = {"description_width": "initial"}
        self.policy = widgets.Dropdown(options=list(POLICIES), value=policy, description="cache policy", style=style)
        self.step = widgets.IntSlider(value=T - 1, min=0, max=T - 1, description="decoding token", style=style)
        super().__init__([self.policy, self.step], figsize=(8.5, 3.8))
        self.update()

    def _feed(self):
        cache = policy_cache(self.policy.value, window=self.window, n_sink=self.n_sink, max_len=self.T,
                             n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)
        gen = torch.Generator().manual_seed(0)
        for _ in range(self.step.value + 1):
            k = torch.randn(1, self.n_kv_heads, 1, self.head_dim, generator=gen)
            cache.update(k, k.clone())
        return cache

    @property
    def held_bytes(self) -> int:
        return _held_bytes(self._feed())

    @property
    def kept(self) -> int:
        mask = policy_mask(self.policy.value, self.T, window=self.window, n_sink=self.n_sink)
        return int(mask[self.step.value].sum())

    def draw(self, fig: Figure) -> None:
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        draw_policy(self.policy.value, self.T, window=self.window, n_sink=self.n_sink, step=self.step.value, ax=left)
        steps = list(range(self.T))
        held = []
        for policy in POLICIES:
            cache = policy_cache(policy, window=self.window, n_sink=self.n_sink, max_len=self.T,
                                 n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)
            row = []
            for _ in steps:
                k = torch.zeros(1, self.n_kv_heads, 1, self.head_dim)
                cache.update(k, k)
                row.append(_held_bytes(cache))
            held.append(row)
        for policy, row in zip(POLICIES, held):      # "full" and "window" hold the same bytes: full dashed, on top
            width = 2.5 if policy == self.policy.value else 1.0
            full = policy == "full"
            right.plot(steps, row, linewidth=width, label=policy, linestyle=(0, (4, 4)) if full else "-",
                       color="black" if full else None, zorder=3 if full else 2)
        right.axvline(self.step.value, color="black", linewidth=0.8, linestyle=":")
        right.set_xlabel("tokens decoded")
        right.set_ylabel("bytes held by the cache")
        right.legend(fontsize=7)
        right.set_title(f"now: {self.kept} keys seen, {format_bytes(self.held_bytes)} held", fontsize=9)
        fig.tight_layout()
