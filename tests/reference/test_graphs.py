"""GAT (Veličković et al., 2018) against an independent implementation written from the paper's formula.

The reference below loops over nodes and neighbours, builds a = [a_1 || a_2] and the concatenation
[W h_i || W h_j] explicitly, and normalises exp(e_ij) over the neighbourhood by hand: no masks, no
softmax call, nothing shared with ``selfattn_lite.graphs``. Graphs are drawn by hypothesis.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite.graphs import GATLayer, gat_attention


def reference_gat(h, adj, weight, att_src, att_dst, negative_slope=0.2):
    """out_i = sum_{j in N(i)} alpha_ij W h_j, alpha_ij = exp(e_ij) / sum_{k in N(i)} exp(e_ik)."""
    n = h.shape[0]
    wh = [weight @ h[j] for j in range(n)]                           # W h_j, each (F_out,)
    a = torch.cat([att_dst, att_src])                                 # a = [a_1 || a_2], (2 F_out,)
    out = torch.zeros(n, weight.shape[0], dtype=h.dtype)
    alpha = torch.zeros(n, n, dtype=h.dtype)
    for i in range(n):
        neighbours = [j for j in range(n) if adj[i, j]]
        if not neighbours:
            continue                                                  # documented: zeros
        e = {}
        for j in neighbours:
            x = float(a @ torch.cat([wh[i], wh[j]]))                  # a^T [W h_i || W h_j]
            e[j] = x if x > 0 else negative_slope * x                 # LeakyReLU
        top = max(e.values())
        total = sum(math.exp(e[j] - top) for j in neighbours)
        for j in neighbours:
            alpha[i, j] = math.exp(e[j] - top) / total
            out[i] += alpha[i, j] * wh[j]
    return out, alpha


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 7))
    f_in, f_out = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(n, n, generator=g) < draw(st.floats(0.0, 1.0))   # directed, maybe empty rows
    if draw(st.booleans()):
        adj |= torch.eye(n, dtype=torch.bool)                         # self-loops, usually
    h = torch.randn(n, f_in, generator=g, dtype=torch.float64)
    weight = torch.randn(f_out, f_in, generator=g, dtype=torch.float64)
    att_src = torch.randn(f_out, generator=g, dtype=torch.float64)
    att_dst = torch.randn(f_out, generator=g, dtype=torch.float64)
    slope = draw(st.sampled_from([0.2, 0.01, 0.5]))
    return h, adj, weight, att_src, att_dst, slope


@given(graphs())
def test_gat_attention_matches_the_formula(graph):
    h, adj, weight, att_src, att_dst, slope = graph
    out, weights = gat_attention(h, adj, weight, att_src, att_dst, negative_slope=slope)
    want_out, want_weights = reference_gat(h, adj, weight, att_src, att_dst, slope)
    torch.testing.assert_close(weights, want_weights)
    torch.testing.assert_close(out, want_out)
    assert torch.all(weights[~adj] == 0) and not torch.isnan(out).any()
    rows = adj.any(-1)
    torch.testing.assert_close(weights.sum(-1)[rows], torch.ones(int(rows.sum()), dtype=h.dtype))


@given(graphs(), st.integers(0, 2**31 - 1))
def test_gat_attention_is_permutation_equivariant(graph, seed):
    h, adj, weight, att_src, att_dst, slope = graph
    perm = torch.randperm(h.shape[0], generator=torch.Generator().manual_seed(seed))
    out, weights = gat_attention(h, adj, weight, att_src, att_dst, negative_slope=slope)
    out_p, weights_p = gat_attention(h[perm], adj[perm][:, perm], weight, att_src, att_dst, negative_slope=slope)
    torch.testing.assert_close(out_p, out[perm])
    torch.testing.assert_close(weights_p, weights[perm][:, perm])


def test_scores_are_additive_not_dot_product():
    # With att_dst = 0 the score of the edge i <- j depends on j alone, so every node ranks its
    # neighbours the same way whatever its own features. A dot product h_i . h_j cannot do that:
    # node 2 (x_1 = -1) would rank them in the opposite order from node 0 (x_1 = 1).
    h = torch.tensor([[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0]])
    adj = torch.ones(3, 3, dtype=torch.bool)
    _, weights = gat_attention(h, adj, torch.eye(2), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert torch.equal(weights.argmax(-1), torch.tensor([1, 1, 1]))   # every node ranks its keys the same way
    torch.testing.assert_close(weights[0], weights[2])                 # and the query's own features do not matter


def test_row_without_neighbours_gives_zeros():
    h = torch.randn(3, 4)
    adj = torch.tensor([[True, True, False], [False, False, False], [False, True, True]])
    out, weights = gat_attention(h, adj, torch.randn(2, 4), torch.randn(2), torch.randn(2))
    assert torch.all(weights[1] == 0) and torch.all(out[1] == 0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("concat", [True, False])
def test_gat_layer_is_its_heads(concat):
    torch.manual_seed(0)
    layer = GATLayer(5, 3, heads=4, concat=concat).double()
    h = torch.randn(6, 5, dtype=torch.float64)
    adj = (torch.rand(6, 6) < 0.5) | torch.eye(6, dtype=torch.bool)
    out, weights = layer(h, adj)
    heads = [reference_gat(h, adj, layer.weight[k].detach(), layer.att_src[k].detach(), layer.att_dst[k].detach())
             for k in range(4)]
    torch.testing.assert_close(weights, torch.stack([w for _, w in heads]))
    want = torch.cat([o for o, _ in heads], dim=-1) if concat else torch.stack([o for o, _ in heads]).mean(0)
    torch.testing.assert_close(out, want)
    assert out.shape == ((6, 12) if concat else (6, 3))
    out.sum().backward()                                               # trainable end to end
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("args, message", [
    ((torch.randn(3), torch.ones(3, 3, dtype=torch.bool), torch.randn(2, 3), torch.randn(2), torch.randn(2)),
     r"h must be \(N, F_in\)"),
    ((torch.randn(3, 4), torch.ones(3, 3), torch.randn(2, 4), torch.randn(2), torch.randn(2)), "bool"),
    ((torch.randn(3, 4), torch.ones(3, 4, dtype=torch.bool), torch.randn(2, 4), torch.randn(2), torch.randn(2)),
     r"adj must be \(N, N\) = \(3, 3\).*adj \(3, 4\)"),
    ((torch.randn(3, 4), torch.ones(3, 3, dtype=torch.bool), torch.randn(2, 5), torch.randn(2), torch.randn(2)),
     r"weight must be \(F_out, F_in\) with F_in = 4.*weight \(2, 5\)"),
    ((torch.randn(3, 4), torch.ones(3, 3, dtype=torch.bool), torch.randn(2, 4), torch.randn(3), torch.randn(2)),
     r"att_src and att_dst must be \(F_out,\) = \(2,\).*att_src \(3,\)"),
    ((torch.randn(3, 4), torch.ones(3, 3, dtype=torch.bool), torch.randn(2, 4), torch.randn(2), [0.0, 1.0]),
     "att_dst must be a torch.Tensor"),
])
def test_bad_inputs_name_the_shapes(args, message):
    with pytest.raises(ValueError, match=message):
        gat_attention(*args)


def test_bad_layer_sizes():
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        GATLayer(4, 2, heads=0)
