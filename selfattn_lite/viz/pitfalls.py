"""Notebook 09's widget: flip a pitfall between its broken and its fixed code and watch the weights.

The weights come from ``selfattn_lite.pitfalls.pitfall_weights`` (the pitfalls that register a
picture); this module only draws them.
"""

from __future__ import annotations

from torch import Tensor

from ..pitfalls import HEATMAP_PITFALLS, pitfall_weights
from .core import HeatmapWidget, attention_heatmap

__all__ = ["PitfallWidget"]


class PitfallWidget(HeatmapWidget):
    """Pick a pitfall, flip between the broken and the fixed code, and watch the weights change.

    ``weights`` is the (L, S) matrix on display.
    """

    def __init__(self, name: str = "mask_polarity", fixed: bool = False):
        import ipywidgets as widgets

        self.choice = widgets.Dropdown(options=[(title, key) for key, title in HEATMAP_PITFALLS.items()],
                                       value=name, description="pitfall", layout={"width": "420px"})
        self.fixed = widgets.ToggleButtons(options=[("broken", False), ("fixed", True)], value=fixed)
        super().__init__([self.choice, self.fixed], figsize=(6.0, 4.2))
        self.update()

    @property
    def weights(self) -> Tensor:
        return pitfall_weights(self.choice.value, self.fixed.value)[0]

    def draw(self, fig) -> None:
        weights, masked = pitfall_weights(self.choice.value, self.fixed.value)
        ax = fig.add_subplot()
        state = "fixed" if self.fixed.value else "broken"
        sums = ", ".join(f"{x:.2f}" for x in weights.sum(-1).tolist())
        attention_heatmap(weights, ax=ax, masked=masked,
                          title=f"{HEATMAP_PITFALLS[self.choice.value]}: {state}\nrow sums: {sums}")
        ax.title.set_fontsize(9)
        fig.tight_layout()
