"""What attention keeps for its backward pass: explicit attention vs FlashAttention, by formula.

``saved_for_backward`` counts the bytes each method must keep between the forward and the
backward pass, Q, K and V included; ``draw_saved_memory`` plots them against n and
``BackwardMemoryWidget`` lets a learner pick n, the heads, the head width and the dtype.

    explicit:  Q, K, V and the weights P, (B, h, n, n), in the compute dtype (float32 for half inputs:
               ``selfattn_lite.attention`` upcasts them); its autograd keeps no O
    tiled:     Q, K, V and the output O in the input dtype, and one log-sum-exp per query row,
               (B, h, n), in float32
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .._checks import check_int
from .core import HeatmapWidget

__all__ = ["saved_for_backward", "draw_saved_memory", "BackwardMemoryWidget"]

LSE_BYTES = 4                                          # the log-sum-exp is float32 in both kernels
UPCAST_BYTES = 4                                       # explicit attention computes half inputs in float32
COLORS = {"explicit": "#D55E00", "tiled": "#0072B2"}   # Okabe-Ito, as bench_efficient


def saved_for_backward(n: int, *, B: int = 1, h: int = 8, dv: int = 64, bytes_per_value: int = 4) -> dict:
    """Bytes kept for the backward pass by each method, Q, K and V included (head width dk = dv).

    Explicit attention's autograd keeps Q, K, P and V (notebook 11, "What SDPA keeps"), all in the
    dtype it computes in: ``selfattn_lite.attention`` upcasts half-precision inputs to float32
    (``upcast_dtype``), so under bf16 it keeps float32 copies of Q, K and V and a float32 P. The tiled
    kernel keeps Q, K, V and O in the input dtype and one log-sum-exp per query row, which stays float32
    whatever the input dtype (SDPA's ``logsumexp`` has the accumulate dtype, ``attention.cpp``; the tiled
    kernel computes its row statistics in float32), so it costs 4 bytes a row also under bf16.

    Returns:
        {"explicit": B h (3 n dv + n^2) c, "tiled": B h (4 n dv bytes_per_value + 4 n)}, where c, the
        explicit path's bytes per value, is 4 for 2-byte (half) inputs and bytes_per_value otherwise.
    """
    for name, x in (("n", n), ("B", B), ("h", h), ("dv", dv), ("bytes_per_value", bytes_per_value)):
        check_int(name, x, low=1)
    compute_bytes = UPCAST_BYTES if bytes_per_value == 2 else bytes_per_value
    return {"explicit": B * h * (3 * n * dv + n * n) * compute_bytes,
            "tiled": B * h * (4 * n * dv * bytes_per_value + n * LSE_BYTES)}


def draw_saved_memory(n: int, *, h: int = 8, dv: int = 64, bytes_per_value: int = 4, ax: Axes | None = None,
                      max_n: int = 131072) -> Axes:
    """Log-log lines of the bytes kept for the backward pass against sequence length, n marked."""
    if ax is None:
        ax = Figure(figsize=(6, 4)).add_subplot()
    ns = np.unique(np.geomspace(256, max_n, 30).astype(int))
    for method in ("explicit", "tiled"):
        mib = [saved_for_backward(int(m), h=h, dv=dv, bytes_per_value=bytes_per_value)[method] / 2**20 for m in ns]
        ax.plot(ns, mib, color=COLORS[method], label=f"{method}: " + ("Q, K, V and P" if method == "explicit" else
                                                                      "Q, K, V, O and the log-sum-exp"))
        here = saved_for_backward(n, h=h, dv=dv, bytes_per_value=bytes_per_value)[method] / 2**20
        ax.plot([n], [here], "o", color=COLORS[method])
        ax.annotate(f"{here:,.1f} MiB", (n, here), textcoords="offset points", xytext=(6, -12 if method == "tiled"
                                                                                        else 6), fontsize=8)
    saved = saved_for_backward(n, h=h, dv=dv, bytes_per_value=bytes_per_value)
    ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="kept for the backward pass (MiB)",
           title=f"One layer, B=1, h={h}, dk = dv = {dv}, {bytes_per_value}-byte inputs"
                 + (" (explicit: float32)" if bytes_per_value == 2 else "") + f", n={n}:\n"
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
