"""The checkers of notebook 10 accept right answers and diagnose typical wrong ones."""

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError, nb10


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- value-weighted norms


def good_norms(weights, v, w_o):
    h, T, _ = weights.shape
    dk = v.shape[-1] // h
    moved = torch.stack([v[:, i * dk:(i + 1) * dk] @ w_o[:, i * dk:(i + 1) * dk].T for i in range(h)])   # (h, T, d)
    return weights * moved.norm(dim=-1)[:, None, :]


def loop_norms(weights, v, w_o):
    h, T, _ = weights.shape
    dk = v.shape[-1] // h
    out = torch.zeros(h, T, T)
    for head in range(h):
        for i in range(T):
            for j in range(T):
                out[head, i, j] = (weights[head, i, j] * w_o[:, head * dk:(head + 1) * dk]
                                   @ v[j, head * dk:(head + 1) * dk]).norm()
    return out


RIGHT["weighted_norms"] = nb10.check_weighted_norms, good_norms
RIGHT["weighted_norms_loop"] = nb10.check_weighted_norms, loop_norms


def norms_by_query(weights, v, w_o):
    moved = good_norms(torch.ones_like(weights), v, w_o)[:, 0, :]       # (h, T): ||W_o^h v_j^h|| per key j
    return weights * moved[:, :, None]                                   # wrongly broadcast over the queries


def _per_head(v, h):
    return v.reshape(v.shape[0], h, -1).transpose(0, 1)                  # (h, T, dk)


@pytest.mark.parametrize("wrong, match", [
    (lambda w, v, w_o: w, "weight alone"),
    (lambda w, v, w_o: w * _per_head(v, w.shape[0]).norm(dim=-1)[:, None, :], "before the output projection"),
    (lambda w, v, w_o: w * (_per_head(v, w.shape[0]) @ w_o.reshape(w.shape[0], -1, w_o.shape[0]))
     .norm(dim=-1)[:, None, :], "rows"),
    (lambda w, v, w_o: w * (v @ w_o.T).norm(dim=-1)[None, None, :], "whole of v_j"),
    (lambda w, v, w_o: good_norms(w, v, w_o).sum(-1), "do not sum over the keys"),
    (norms_by_query, "indexed by the query"),
    (lambda w, v, w_o: good_norms(w, v, w_o) ** 2, "differ from"),
    (lambda w, v, w_o: good_norms(w, v, w_o).tolist(), "torch.Tensor"),
])
def test_weighted_norms_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_weighted_norms(wrong)


# ----------------------------------------------------------------------------- graph mask


def good_graph_mask(n, edges):
    mask = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        mask[u, v] = mask[v, u] = True
    return mask


def adjacency_graph_mask(n, edges):
    adj = torch.zeros(n, n)
    u, v = torch.tensor(edges).T
    adj[u, v] = adj[v, u] = 1
    return (adj + torch.eye(n)) > 0


RIGHT["graph_mask"] = nb10.check_graph_mask, good_graph_mask
RIGHT["graph_mask_adjacency"] = nb10.check_graph_mask, adjacency_graph_mask


def no_self_loops(n, edges):
    return good_graph_mask(n, edges) & ~torch.eye(n, dtype=torch.bool)


def one_direction(n, edges):
    mask = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        mask[u, v] = True
    return mask


def missing_edge(n, edges):
    return good_graph_mask(n, edges[:-1])


@pytest.mark.parametrize("wrong, match", [
    (lambda n, e: ~good_graph_mask(n, e), "polarity is flipped"),
    (no_self_loops, "self-loops"),
    (one_direction, "only one direction"),
    (lambda n, e: one_direction(n, e).T, "only one direction"),
    (lambda n, e: good_graph_mask(n, e).float(), "bool mask"),
    (lambda n, e: good_graph_mask(n, e)[:-1], r"shape \(6, 6\)"),
    (missing_edge, r"differs at \(query, key\) = \[\[3, 4\], \[4, 3\]\]"),
])
def test_graph_mask_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_graph_mask(wrong)


# ----------------------------------------------------------------------------- unpatchify


def good_unpatchify(patches, p, H, W):
    C = patches.shape[1] // (p * p)
    x = patches.reshape(H // p, W // p, C, p, p).permute(2, 0, 3, 1, 4)     # (C, H/p, p, W/p, p)
    return x.reshape(C, H, W)


def fold_unpatchify(patches, p, H, W):
    return torch.nn.functional.fold(patches.T[None], (H, W), kernel_size=p, stride=p)[0]


def loop_unpatchify(patches, p, H, W):
    C = patches.shape[1] // (p * p)
    image = torch.zeros(C, H, W)
    for k, patch in enumerate(patches):
        r, c = divmod(k, W // p)
        image[:, r * p:(r + 1) * p, c * p:(c + 1) * p] = patch.reshape(C, p, p)
    return image


RIGHT["unpatchify"] = nb10.check_unpatchify, good_unpatchify
RIGHT["unpatchify_fold"] = nb10.check_unpatchify, fold_unpatchify
RIGHT["unpatchify_loop"] = nb10.check_unpatchify, loop_unpatchify


def column_major_unpatchify(patches, p, H, W):
    C = patches.shape[1] // (p * p)
    image = torch.zeros(C, H, W)
    for k, patch in enumerate(patches):
        c, r = divmod(k, H // p)
        image[:, r * p:(r + 1) * p, c * p:(c + 1) * p] = patch.reshape(C, p, p)
    return image


def channels_last_unpatchify(patches, p, H, W):
    C = patches.shape[1] // (p * p)
    image = torch.zeros(C, H, W)
    for k, patch in enumerate(patches):
        r, c = divmod(k, W // p)
        image[:, r * p:(r + 1) * p, c * p:(c + 1) * p] = patch.reshape(p, p, C).permute(2, 0, 1)
    return image


def fixed_channels(patches, p, H, W):
    return patches.reshape(H // p, W // p, 3, p, p).permute(2, 0, 3, 1, 4).reshape(3, H, W)


@pytest.mark.parametrize("wrong, match", [
    (lambda patches, p, H, W: patches.reshape(-1, H, W), "plain reshape"),
    (lambda patches, p, H, W: patches.reshape(H // p, W // p, -1, p, p).permute(2, 0, 1, 3, 4).reshape(-1, H, W),
     "not interleaved"),
    (column_major_unpatchify, "column by column"),
    (channels_last_unpatchify, r"\(p, p, C\)"),
    (lambda patches, p, H, W: good_unpatchify(patches, p, H, W).flip(-1), "differs from the one"),
    (fixed_channels, "read C from"),
    (lambda patches, p, H, W: good_unpatchify(patches, p, H, W)[0], r"shape \(3, 8, 12\)"),
])
def test_unpatchify_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_unpatchify(wrong)


# ----------------------------------------------------------------------------- preference (exercise 4)

def good_preference(maps, query, a, b):
    i = maps.tokens.index(query)
    return maps.weights[:, :, i, maps.tokens.index(a)] - maps.weights[:, :, i, maps.tokens.index(b)]


def scores_preference(maps, query, a, b):
    from selfattn_lite import explore
    return explore.token_scores(maps, query, a) - explore.token_scores(maps, query, b)


RIGHT["preference"] = nb10.check_preference, good_preference
RIGHT["preference_scores"] = nb10.check_preference, scores_preference


def _columns(maps, query, a, b):
    i = maps.tokens.index(query)
    return maps.weights[:, :, maps.tokens.index(a), i] - maps.weights[:, :, maps.tokens.index(b), i]


@pytest.mark.parametrize("wrong, match", [
    (lambda m, q, a, b: -good_preference(m, q, a, b), "sign is flipped"),
    (_columns, "columns of 'it'"),
    (lambda m, q, a, b: m.weights[:, :, m.tokens.index(q), m.tokens.index(a)], "only the weight on 'trophy'"),
    (lambda m, q, a, b: good_preference(m, q, a, b).abs(), "no abs"),
    (lambda m, q, a, b: good_preference(m, q, a, b).mean(-1), "do not average"),
    (lambda m, q, a, b: good_preference(m, q, a, b) * 2, "expected weights"),
    (lambda m, q, a, b: good_preference(m, q, a, b)[None], "shape"),
])
def test_preference_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_preference(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
