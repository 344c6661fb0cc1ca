"""Figure of notebook 13: four cache policies as masks, and a packed batch's document mask."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ...masks import document_mask
from ...viz.serving import draw_policy

__all__ = ["draw_cache_policies", "FIGURES"]


def draw_cache_policies() -> Figure:
    """Full cache, sliding window, sinks + window (16 tokens, window 5, 2 sinks), and a packed document mask."""
    fig = Figure(figsize=(13, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    for ax, policy in zip(axes[:3], ("full", "window", "sinks + window")):
        draw_policy(policy, 16, window=5, n_sink=2, ax=ax)
    docs = [0] * 5 + [1] * 7 + [2] * 4
    axes[3].imshow(document_mask(docs, is_causal=True).float().numpy() * 2, cmap="Blues", vmin=0, vmax=2.5,
                   interpolation="nearest")
    axes[3].set_xlabel("key position")
    axes[3].set_ylabel("query position")
    axes[3].set_title("packed: 3 documents, causal", fontsize=9)
    fig.suptitle("Which keys a token may see: blue seen, orange sinks, grey evicted from the cache, "
                 "pale blue masked but still stored", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


FIGURES = {"serving_cache_policies.png": draw_cache_policies}
