"""Graph attention (GAT, Veličković et al., 2018): additive scores over a graph's edges.

A GAT head scores the edge i <- j *additively*, not with a scaled dot product:

    e_ij = LeakyReLU(a^T [W h_i || W h_j]) = LeakyReLU(att_dst . W h_i + att_src . W h_j).

This is not Bahdanau et al.'s additive score v^T tanh(W s_i + U h_j), which applies the nonlinearity
before the last projection v; GAT applies it after a, so every node ranks its neighbours in the same
order (static attention, Brody et al. 2022, whose GATv2 restores Bahdanau's order). Here
a = [att_dst || att_src] splits into the part that reads the receiving node i and the part
that reads the neighbour j. The scores are normalised with a softmax over the neighbours j of i
(adj[i, j] True), and node i's output is the weighted sum of its neighbours' W h_j.

Conventions shared with the rest of the package: adj is a boolean mask, True = may attend; a row
with no allowed neighbour gets zero weights and a zero output (as ``scaled_dot_product_attention``
does for a fully masked row), never NaN. Self-loops are not added for you: set adj[i, i] yourself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_module_dtype, check_positive_int, check_real, check_same_dtype, check_tensor

__all__ = ["gat_attention", "GATLayer"]


def _check(h, adj, weight, att_src, att_dst) -> None:
    for name, t in (("h", h), ("adj", adj), ("weight", weight), ("att_src", att_src), ("att_dst", att_dst)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shapes = (f"h {tuple(h.shape)}, adj {tuple(adj.shape)}, weight {tuple(weight.shape)}, "
              f"att_src {tuple(att_src.shape)}, att_dst {tuple(att_dst.shape)}")
    if h.dim() != 2:
        raise ValueError(f"h must be (N, F_in), got {shapes}")
    n, f_in = h.shape
    if adj.dtype != torch.bool:
        raise ValueError(f"adj must be a bool mask (True = may attend), got dtype {adj.dtype}")
    if tuple(adj.shape) != (n, n):
        raise ValueError(f"adj must be (N, N) = ({n}, {n}) for h of N = {n} nodes; got {shapes}")
    if weight.dim() != 2 or weight.shape[1] != f_in:
        raise ValueError(f"weight must be (F_out, F_in) with F_in = {f_in}; got {shapes}")
    f_out = weight.shape[0]
    if tuple(att_src.shape) != (f_out,) or tuple(att_dst.shape) != (f_out,):
        raise ValueError(f"att_src and att_dst must be (F_out,) = ({f_out},); got {shapes}")
    if not (h.is_floating_point() and weight.is_floating_point()):
        raise ValueError(f"h and weight must be floating point, got {h.dtype} and {weight.dtype}")
    check_same_dtype(h=h, weight=weight, att_src=att_src, att_dst=att_dst)


def gat_attention(h: torch.Tensor, adj: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor,
                  att_dst: torch.Tensor, *, negative_slope: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """One GAT attention head.

    Args:
        h: (N, F_in) node features.
        adj: (N, N) bool; adj[i, j] True when node i may attend to node j (include self-loops yourself).
        weight: (F_out, F_in), the shared linear map W.
        att_src: (F_out,), the half of a that reads the neighbour j.
        att_dst: (F_out,), the half of a that reads the receiving node i.
        negative_slope: LeakyReLU's slope for negative scores (0.2 in the paper).

    Returns:
        out: (N, F_out), out_i = sum_j weights_ij W h_j (no nonlinearity: the paper applies ELU after).
        weights: (N, N), softmax over j of e_ij = LeakyReLU(att_dst . W h_i + att_src . W h_j) where
        adj is True, 0 elsewhere; a row with no allowed neighbour is all zeros (and its out row is 0).

    Raises:
        ValueError: naming the shapes when they do not fit, or when adj is not bool.

    Taught in notebook 10, "5. Graphs: attention restricted to neighbours (GAT and graph transformers)".
    """
    _check(h, adj, weight, att_src, att_dst)
    check_real("negative_slope", negative_slope)
    wh = h @ weight.T                                           # (N, F_out): W h_j for every node
    score_dst = wh @ att_dst                                    # (N,): att_dst . W h_i
    score_src = wh @ att_src                                    # (N,): att_src . W h_j
    e = F.leaky_relu(score_dst[:, None] + score_src[None, :], negative_slope)   # (N, N): e_ij
    e = e.masked_fill(~adj, float("-inf"))
    weights = torch.softmax(e, dim=-1)                          # NaN on rows with no neighbour...
    has_neighbour = adj.any(dim=-1, keepdim=True)               # (N, 1)
    weights = torch.where(has_neighbour, weights, torch.zeros_like(weights))   # ...which become 0
    return weights @ wh, weights                                # (N, F_out), (N, N)


class GATLayer(nn.Module):
    """A multi-head GAT layer: ``heads`` independent ``gat_attention`` heads, concatenated or averaged.

    Args:
        in_features: F_in.
        out_features: F_out per head.
        heads: number of heads K.
        concat: True: output (N, K * F_out), the heads side by side (the paper's hidden layers);
            False: (N, F_out), their mean (the paper's output layer).
        negative_slope: LeakyReLU slope of the scores.

    ``forward(h, adj) -> (out, weights)`` with h (N, F_in), adj (N, N) bool, weights (K, N, N).
    No nonlinearity, dropout or bias: apply ELU (hidden) or softmax (output) yourself, as the paper does.

    Taught in notebook 10, "5. Graphs: attention restricted to neighbours (GAT and graph transformers)".
    """

    def __init__(self, in_features: int, out_features: int, heads: int = 1, *, concat: bool = True,
                 negative_slope: float = 0.2):
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features), ("heads", heads)):
            check_positive_int(name, n)
        check_bool("concat", concat)
        check_real("negative_slope", negative_slope)
        self.heads, self.out_features, self.concat = heads, out_features, concat
        self.negative_slope = negative_slope
        self.weight = nn.Parameter(torch.empty(heads, out_features, in_features))    # one W per head
        self.att_src = nn.Parameter(torch.empty(heads, out_features))
        self.att_dst = nn.Parameter(torch.empty(heads, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot (Xavier) uniform initialisation, as in the paper."""
        for w in self.weight:
            nn.init.xavier_uniform_(w)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_tensor("h", h, dim=2, layout="(N, F_in)", floating=True)
        check_module_dtype("h", h, self.weight.dtype)
        outs, weights = zip(*(gat_attention(h, adj, self.weight[k], self.att_src[k], self.att_dst[k],
                                            negative_slope=self.negative_slope) for k in range(self.heads)))
        out = torch.stack(outs)                                 # (K, N, F_out)
        if self.concat:
            out = out.transpose(0, 1).reshape(h.shape[0], self.heads * self.out_features)   # (N, K * F_out)
        else:
            out = out.mean(0)                                   # (N, F_out)
        return out, torch.stack(weights)                        # (K, N, N)

    def extra_repr(self) -> str:
        return (f"in_features={self.weight.shape[2]}, out_features={self.out_features}, heads={self.heads}, "
                f"concat={self.concat}, negative_slope={self.negative_slope}")
