"""The checkers of notebook 10 accept right answers and diagnose typical wrong ones."""

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError, nb10


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- previous-token score


def good_previous(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def loop_previous(weights):
    T = weights.shape[-1]
    return sum(weights[..., i, i - 1] for i in range(1, T)) / (T - 1)


RIGHT["previous_token_score"] = nb10.check_previous_token_score, good_previous
RIGHT["previous_token_score_loop"] = nb10.check_previous_token_score, loop_previous


@pytest.mark.parametrize("wrong, match", [
    (lambda w: w.diagonal(dim1=-2, dim2=-1).mean(-1), "main diagonal"),
    (lambda w: w.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1), "next"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / w.shape[-1], "query 0 has no previous token"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1), "take the mean"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1), "one score per head"),
    (lambda w: w.diagonal(offset=-1, dim1=-1, dim2=-2).mean(-1).T, r"shape \(2, 3\)"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1).tolist(), "torch.Tensor"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).amax(-1), "differ from mean_i"),
])
def test_previous_token_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_previous_token_score(wrong)


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


# ----------------------------------------------------------------------------- patchify


def good_patchify(image, p):
    C, H, W = image.shape
    x = image.reshape(C, H // p, p, W // p, p).permute(1, 3, 0, 2, 4)     # (H/p, W/p, C, p, p)
    return x.reshape(-1, C * p * p)


def unfold_patchify(image, p):
    return torch.nn.functional.unfold(image[None], kernel_size=p, stride=p)[0].T


def loop_patchify(image, p):
    C, H, W = image.shape
    return torch.stack([image[:, r * p:(r + 1) * p, c * p:(c + 1) * p].flatten()
                        for r in range(H // p) for c in range(W // p)])


RIGHT["patchify"] = nb10.check_patchify, good_patchify
RIGHT["patchify_unfold"] = nb10.check_patchify, unfold_patchify
RIGHT["patchify_loop"] = nb10.check_patchify, loop_patchify


def column_major(image, p):
    C, H, W = image.shape
    return torch.stack([image[:, r * p:(r + 1) * p, c * p:(c + 1) * p].flatten()
                        for c in range(W // p) for r in range(H // p)])


def channels_last(image, p):
    C, H, W = image.shape
    return torch.stack([image[:, r * p:(r + 1) * p, c * p:(c + 1) * p].permute(1, 2, 0).flatten()
                        for r in range(H // p) for c in range(W // p)])


def rows_flipped(image, p):
    return good_patchify(image, p).flip(0)


@pytest.mark.parametrize("wrong, match", [
    (lambda image, p: image.reshape(-1, image.shape[0] * p * p), "plain reshape"),
    (column_major, "column-major"),
    (channels_last, r"\(p, p, C\)"),
    (rows_flipped, "differ from the reference"),
    (lambda image, p: good_patchify(image, p)[:, :16], r"shape \(6, 48\)"),
])
def test_patchify_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb10.check_patchify(wrong)


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
