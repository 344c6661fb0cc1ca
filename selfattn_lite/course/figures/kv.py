"""Figures of notebooks 06 and 07: prefill/decode with and without a cache; query heads sharing K/V heads."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ...viz.kv import KV_COLORS, draw_head_sharing

__all__ = ["draw_prefill_decode", "draw_head_sharing_figure", "FIGURES"]


def _grid(ax, steps: int, prompt: int, cached: bool, title: str) -> None:
    """Rows = generation steps, columns = token positions; colour = what the step computes."""
    for s in range(steps):
        n = prompt + s                                   # tokens in the context at step s
        for j in range(n):
            if s == 0:
                kind = "computed"                        # prefill: everything is new
            elif cached:
                kind = "computed" if j == n - 1 else "read"
            else:
                kind = "recomputed" if j < n - 1 else "computed"
            ax.add_patch(Rectangle((j, steps - 1 - s), 0.92, 0.86, facecolor=KV_COLORS[kind], edgecolor="white"))
    ax.set_xlim(-0.2, prompt + steps)
    ax.set_ylim(-0.3, steps + 0.2)
    ax.set_yticks([steps - 1 - s + 0.43 for s in range(steps)],
                  ["prefill"] + [f"decode {s}" for s in range(1, steps)])
    ax.set_xticks([j + 0.46 for j in range(prompt + steps - 1)], range(prompt + steps - 1))
    ax.set_xlabel("token position")
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=10)


def draw_prefill_decode(steps: int = 6, prompt: int = 4) -> Figure:
    """Keys/values each step computes: without a cache the whole context again, with one only the newest."""
    fig = Figure(figsize=(11, 3.4))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    _grid(left, steps, prompt, cached=False, title="Without a cache: every step recomputes K, V of the context")
    _grid(right, steps, prompt, cached=True, title="With a KV cache: one new K, V per step, the rest is read")
    handles = [Rectangle((0, 0), 1, 1, facecolor=KV_COLORS[k]) for k in ("computed", "recomputed", "read")]
    fig.legend(handles, ["computed this step (new token)", "recomputed (wasted work)", "read from the cache"],
               loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle("Prefill runs the prompt once; each decode step adds one token", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def draw_head_sharing_figure() -> Figure:
    """MHA 8:8, GQA 8:2 and MQA 8:1 side by side: which K/V head each query head reads."""
    fig = Figure(figsize=(11, 3.2))
    FigureCanvasAgg(fig)
    for ax, kv, name in zip(fig.subplots(1, 3), (8, 2, 1), ("MHA", "GQA (groups of 4)", "MQA")):
        draw_head_sharing(8, kv, ax=ax, title=f"{name}: 8 query heads, {kv} K/V head{'s' if kv > 1 else ''}")
    fig.suptitle("Query heads sharing K/V heads: the KV cache shrinks 8 : 2 : 1", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


FIGURES = {
    "kv_prefill_decode.png": draw_prefill_decode,
    "kv_head_sharing.png": draw_head_sharing_figure,
}
