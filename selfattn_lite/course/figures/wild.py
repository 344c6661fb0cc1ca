"""Figure of notebook 10: the five attention patterns of the "where is attention used" table,
drawn as the masks that define them (which query may attend to which key)."""

from __future__ import annotations

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ...masks import causal_mask

__all__ = ["graph_adjacency", "pattern_masks", "draw_attention_patterns", "FIGURES"]

ALLOWED, FORBIDDEN = "#0072B2", "#EEEEEE"   # Okabe-Ito blue on light grey
GRAPH_EDGES = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 5), (5, 3)]


def graph_adjacency(n: int = 6, edges=GRAPH_EDGES) -> torch.Tensor:
    """(n, n) bool: True where i and j share an (undirected) edge, or i == j (self-loop)."""
    mask = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        mask[u, v] = mask[v, u] = True
    return mask


def pattern_masks() -> dict[str, tuple[torch.Tensor, str, str]]:
    """title -> (mask (L, S) bool True = may attend, query axis label, key axis label)."""
    return {
        "Text understanding\nbidirectional (BERT)": (torch.ones(6, 6, dtype=torch.bool), "token", "token"),
        "Text generation\ncausal (GPT) + KV cache": (causal_mask(6), "new token", "earlier token"),
        "Translation\ncross-attention (T5)": (torch.ones(4, 6, dtype=torch.bool), "target token", "source token"),
        "Images\npatches (ViT)": (torch.ones(9, 9, dtype=torch.bool), "patch", "patch"),
        "Graphs\nneighbours only (GAT)": (graph_adjacency(), "node", "node"),
    }


def draw_attention_patterns() -> Figure:
    """Five panels: the mask of each setting; blue = may attend."""
    masks = pattern_masks()
    fig = Figure(figsize=(13, 3.3))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(masks))
    cmap = ListedColormap([FORBIDDEN, ALLOWED])
    for ax, (title, (mask, rows, cols)) in zip(axes, masks.items()):
        L, S = mask.shape
        ax.imshow(mask.numpy(), cmap=cmap, vmin=0, vmax=1, aspect="equal")
        ax.set_xticks([x - 0.5 for x in range(S + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(L + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="both", length=0)
        ax.set_xticks(range(S), [str(j) for j in range(S)], fontsize=7)
        ax.set_yticks(range(L), [str(i) for i in range(L)], fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"key: {cols}", fontsize=8)
        ax.set_ylabel(f"query: {rows}", fontsize=8)
    fig.suptitle("One operation, five masks: blue = query (row) may attend to key (column)", fontsize=12)
    fig.tight_layout()
    return fig


FIGURES = {"wild_attention_patterns.png": draw_attention_patterns}
