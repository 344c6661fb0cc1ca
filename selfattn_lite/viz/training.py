"""What attention keeps for its backward pass: explicit attention vs FlashAttention, by formula.

``saved_for_backward`` counts the bytes each method must keep between the forward and the
backward pass (beyond q, k, v themselves); ``draw_saved_memory`` plots them against n and
``BackwardMemoryWidget`` lets a learner pick n, the heads and the head width.

    explicit:  the weights P, (B, h, n, n) (its autograd keeps Q, K, P and V, not O)
    tiled:     the output O, (B, h, n, dv), and one log-sum-exp per query row, (B, h, n), in float32
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .._checks import check_int
from .core import HeatmapWidget

__all__ = ["saved_for_backward", "draw_saved_memory", "BackwardMemoryWidget"]

LSE_BYTES = 4                                          # the log-sum-exp is float32 in both kernels
COLORS = {"explicit": "#D55E00", "tiled": "#0072B2"}   # Okabe-Ito, as bench_efficient


def saved_for_backward(n: int, *, B: int = 1, h: int = 8, dv: int = 64, bytes_per_value: int = 4) -> dict:
    """Bytes kept for the backward pass by each method, q, k, v not counted (both keep them).

    Explicit attention's autograd keeps Q, K, P and V (notebook 11, "What SDPA keeps"); the tiled
    kernel keeps Q, K, V, O and one log-sum-exp per query row. The log-sum-exp stays float32 whatever
    the input dtype (SDPA's ``logsumexp`` has the accumulate dtype, ``attention.cpp``; the tiled
    kernel computes its row statistics in float32), so it costs 4 bytes a row also under bf16.

    Returns:
        {"explicit": B h n^2 bytes_per_value (P), "tiled": B h (n dv bytes_per_value + 4 n) (O and lse)}.
    """
    for name, x in (("n", n), ("B", B), ("h", h), ("dv", dv), ("bytes_per_value", bytes_per_value)):
        check_int(name, x, low=1)
    return {"explicit": B * h * n * n * bytes_per_value,
            "tiled": B * h * (n * dv * bytes_per_value + n * LSE_BYTES)}


def draw_saved_memory(n: int, *, h: int = 8, dv: int = 64, bytes_per_value: int = 4, ax: Axes | None = None,
                      max_n: int = 131072) -> Axes:
    """Log-log lines of the bytes kept for the backward pass against sequence length, n marked."""
    if ax is None:
        ax = Figure(figsize=(6, 4)).add_subplot()
    ns = np.unique(np.geomspace(256, max_n, 30).astype(int))
    for method in ("explicit", "tiled"):
        mib = [saved_for_backward(int(m), h=h, dv=dv, bytes_per_value=bytes_per_value)[method] / 2**20 for m in ns]
        ax.plot(ns, mib, color=COLORS[method], label=f"{method}: " + ("P" if method == "explicit" else
                                                                      "O and the log-sum-exp"))
        here = saved_for_backward(n, h=h, dv=dv, bytes_per_value=bytes_per_value)[method] / 2**20
        ax.plot([n], [here], "o", color=COLORS[method])
        ax.annotate(f"{here:,.1f} MiB", (n, here), textcoords="offset points", xytext=(6, -12 if method == "tiled"
                                                                                        else 6), fontsize=8)
    saved = saved_for_backward(n, h=h, dv=dv, bytes_per_value=bytes_per_value)
    ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="kept for the backward pass (MiB)",
           title=f"One layer, B=1, h={h}, dv={dv}, {bytes_per_value} bytes/value, n={n}:\n"
                 f"explicit keeps {saved['explicit'] / saved['tiled']:,.0f}x what the tiled kernel keeps")
    ax.title.set_fontsize(9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return ax


class BackwardMemoryWidget(HeatmapWidget):
    """Pick n, the number of heads and the head width; see what each method keeps for the backward pass.

    Attributes (for asserts): ``saved`` (the dict of ``saved_for_backward`` for the current settings).
    """

    def __init__(self, n: int = 4096, h: int = 8, dv: int = 64, bytes_per_value: int = 4):
        import ipywidgets as widgets

        style = {"description_width": "initial"}
        self.n_slider = widgets.SelectionSlider(options=[2**p for p in range(8, 18)], value=n, description="n",
                                                style=style)
        self.h_slider = widgets.IntSlider(value=h, min=1, max=64, description="heads h", style=style)
        self.dv_slider = widgets.SelectionSlider(options=[32, 64, 128, 256], value=dv, description="dv",
                                                 style=style)
        self.bytes_choice = widgets.Dropdown(options=[("float32", 4), ("bf16", 2)], value=bytes_per_value,
                                             description="dtype", style=style)
        super().__init__([self.n_slider, self.h_slider, self.dv_slider, self.bytes_choice], figsize=(6.2, 4.4))
        self.update()

    @property
    def saved(self) -> dict:
        return saved_for_backward(self.n_slider.value, h=self.h_slider.value, dv=self.dv_slider.value,
                                  bytes_per_value=self.bytes_choice.value)

    def draw(self, fig: Figure) -> None:
        ax = fig.add_subplot()
        draw_saved_memory(self.n_slider.value, h=self.h_slider.value, dv=self.dv_slider.value,
                          bytes_per_value=self.bytes_choice.value, ax=ax)
        fig.tight_layout()
