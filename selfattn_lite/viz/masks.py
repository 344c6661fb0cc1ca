"""Notebook 03's widget: switch masks on and off and watch the attention weights.

Grey cells are masked (their weight is exactly 0); a query row with no visible key at
all gets zero weights everywhere (what torch SDPA and ``selfattn_lite`` do).
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from .._checks import check_int
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, padding_mask
from .core import HeatmapWidget, attention_heatmap

__all__ = ["MaskWidget"]


class MaskWidget(HeatmapWidget):
    """Causal / padding / cross-attention toggles over one fixed set of random queries and keys.

    Self-attention: L tokens attend to the same L tokens (S = L). Cross-attention: L
    queries attend to S keys from another sequence. The last ``n_keys - real keys`` keys
    are padding (right padding). With causal on and L != S, the alignment control picks
    top-left (torch ``is_causal=True``) or bottom-right (queries are the last L positions).

    Args:
        max_len: largest L and S the sliders allow.
        d: width of the random queries and keys.
        seed: seed of the queries and keys.

    Attributes:
        mask: (L, S) bool, True = may attend. weights: (L, S) attention weights.
    """

    def __init__(self, max_len: int = 8, d: int = 4, seed: int = 0):
        import ipywidgets as widgets

        max_len = check_int("max_len", max_len, low=2)
        gen = torch.Generator().manual_seed(seed)
        self.x_self = torch.randn(max_len, d, generator=gen)     # the sequence attending to itself
        self.x_other = torch.randn(max_len, d, generator=gen)    # the other sequence (cross-attention)
        self.w_q = torch.randn(d, d, generator=gen) / d ** 0.5              # scores of order 1
        self.w_k = torch.randn(d, d, generator=gen) / d ** 0.5
        style = {"description_width": "initial"}
        self.causal = widgets.Checkbox(value=True, description="causal", indent=False)
        self.cross = widgets.Checkbox(value=False, description="cross-attention", indent=False)
        self.n_queries = widgets.IntSlider(value=5, min=1, max=max_len, description="queries L", style=style)
        self.n_keys = widgets.IntSlider(value=5, min=1, max=max_len, description="keys S (cross)", style=style)
        self.real_keys = widgets.IntSlider(value=5, min=0, max=max_len, description="real keys", style=style)
        self.alignment = widgets.Dropdown(options=["top-left", "bottom-right"], value="top-left",
                                          description="causal alignment", style=style)
        super().__init__([self.causal, self.cross, self.n_queries, self.n_keys, self.real_keys, self.alignment],
                         figsize=(6.0, 4.6))
        self.ui = widgets.VBox([widgets.HBox(self.controls[:2] + [self.alignment]),
                                widgets.HBox([self.n_queries, self.n_keys, self.real_keys]), self.image])
        self.update()

    @property
    def L(self) -> int:
        return self.n_queries.value

    @property
    def S(self) -> int:
        return self.n_keys.value if self.cross.value else self.n_queries.value

    @property
    def mask(self) -> torch.Tensor:
        """(L, S) bool: causal (if on) AND key is a real token."""
        L, S = self.L, self.S
        allowed = torch.ones(L, S, dtype=torch.bool)
        if self.causal.value:
            allowed = causal_mask(L, S, bottom_right=self.alignment.value == "bottom-right")
        real = padding_mask([min(self.real_keys.value, S)], S)[0]       # (S,) True = real key
        return allowed & real[None, :]

    @property
    def weights(self) -> torch.Tensor:
        """(L, S) softmax(q k^T / sqrt(d) + M), zero rows where no key is visible."""
        q = self.x_self[:self.L] @ self.w_q                              # (L, d)
        keys_from = self.x_other if self.cross.value else self.x_self
        k = keys_from[:self.S] @ self.w_k                                # (S, d)
        return scaled_dot_product_attention(q, k, k, attn_mask=self.mask)[1]

    def draw(self, fig: Figure) -> None:
        L, S = self.L, self.S
        mask, w = self.mask, self.weights
        real = min(self.real_keys.value, S)
        key_labels = [f"k{j}" if j < real else "<pad>" for j in range(S)]
        query_labels = [f"q{i}" for i in range(L)]
        if not self.cross.value:                     # self-attention: padded tokens are queries too
            query_labels = [f"q{i}" if i < real else "<pad>" for i in range(L)]
        kind = "cross-attention" if self.cross.value else "self-attention"
        causal = f"causal ({self.alignment.value})" if self.causal.value else "bidirectional"
        empty = int((~mask.any(-1)).sum())
        note = f"; {empty} query row(s) see no key: all-zero weights" if empty else ""
        ax = fig.add_subplot()
        attention_heatmap(w, query_labels, key_labels, ax=ax, masked=~mask,
                          title=f"{kind}, {causal}, {S - real} padded key(s)\n"
                                f"grey = masked, weight exactly 0{note}")
        ax.title.set_fontsize(9)
