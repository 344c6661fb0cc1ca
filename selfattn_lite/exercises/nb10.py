"""Checkers for notebook 10: a previous-token score, a graph attention mask, ViT patches, a pronoun's preference."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_previous_token_score", "check_graph_mask", "check_patchify", "check_preference"]


def _reference_previous(weights: torch.Tensor) -> torch.Tensor:
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def check_previous_token_score(fn) -> None:
    """``fn(weights)``: (n_layers, n_heads, T, T) -> (n_layers, n_heads), mean over i >= 1 of w[i, i-1]."""
    gen = torch.Generator().manual_seed(10)
    weights = torch.softmax(3 * torch.randn(2, 3, 6, 6, generator=gen), dim=-1)
    try:
        got = attempt(fn, weights.clone())
    except NotAttempted:
        return not_attempted("previous_token_score")
    if isinstance(got, torch.Tensor) and got.dim() == 3 and got.shape[:2] == (2, 3):
        raise ExerciseError(f"you returned one number per query row {tuple(got.shape)}: average over the "
                            "queries too, to get one score per head (2, 3)")
    got = require_tensor("previous_token_score(weights)", got, (2, 3))
    if close(got, weights.diagonal(dim1=-2, dim2=-1).mean(-1)):
        raise ExerciseError("that is the weight on the token itself (the main diagonal): the previous token "
                            "of query i is key i - 1, the diagonal just below it (offset=-1)")
    if close(got, weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)):
        raise ExerciseError("that is the weight on the *next* token (offset=+1, above the diagonal): "
                            "rows are queries, columns keys, so the previous token is column i - 1 (offset=-1)")
    expected = _reference_previous(weights)
    if close(got, expected * 5 / 6):
        raise ExerciseError("you averaged over all 6 queries, but query 0 has no previous token: "
                            "average over the 5 queries i = 1..T-1")
    if close(got, expected * 5):
        raise ExerciseError("you summed w[i, i-1] over the queries: take the mean, so a perfect previous-token "
                            "head scores 1")
    if not close(got, expected):
        raise ExerciseError("the scores differ from mean_i w[i, i-1]: check which dims are queries (-2) and "
                            "keys (-1)")
    shift = torch.zeros(5, 5)
    shift[0, 0] = 1.0
    shift[torch.arange(1, 5), torch.arange(4)] = 1.0
    perfect = attempt(fn, shift[None, None].clone())
    if not close(perfect, torch.ones(1, 1)):
        raise ExerciseError(f"a head that always looks one token back should score 1, yours gives {perfect}")
    return passed("mean over queries of w[i, i-1]: 1 for a perfect previous-token head, about 1/T for a uniform one")


def _reference_graph_mask(n: int, edges) -> torch.Tensor:
    mask = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        mask[u, v] = mask[v, u] = True
    return mask


def check_graph_mask(fn) -> None:
    """``fn(n, edges)``: (n, n) bool, True where i and j are neighbours (undirected) or i == j."""
    n, edges = 6, [(0, 1), (1, 2), (2, 0), (2, 3), (4, 3)]     # node 5 has no neighbours
    try:
        got = attempt(fn, n, list(edges))
    except NotAttempted:
        return not_attempted("graph_mask")
    got = require_tensor("graph_mask(n, edges)", got, (n, n))
    if got.dtype != torch.bool:
        raise ExerciseError(f"return a bool mask (True = may attend), got dtype {got.dtype}: a float mask would "
                            "be *added* to the scores")
    expected = _reference_graph_mask(n, edges)
    if torch.equal(got, ~expected):
        raise ExerciseError("the polarity is flipped: True must mean 'may attend' (a neighbour or itself)")
    if torch.equal(got, expected & ~torch.eye(n, dtype=torch.bool)):
        raise ExerciseError("no self-loops: node 5 has no neighbours, so its row is fully masked and it gets zero "
                            "weights; let every node attend to itself (set the diagonal True)")
    one_way = torch.eye(n, dtype=torch.bool)
    for u, v in edges:
        one_way[u, v] = True
    if torch.equal(got, one_way) or torch.equal(got, one_way.T):
        raise ExerciseError("the edges are undirected: (u, v) lets u attend to v *and* v attend to u; "
                            "your mask has only one direction")
    if not torch.equal(got, expected):
        wrong = (got != expected).nonzero().tolist()
        raise ExerciseError(f"the mask differs at (query, key) = {wrong[:4]}: True exactly for i == j and for "
                            "both directions of every edge")
    return passed("neighbours and self-loops may attend, everything else is masked")


def _reference_patchify(image: torch.Tensor, p: int) -> torch.Tensor:
    C, H, W = image.shape
    patches = image.reshape(C, H // p, p, W // p, p).permute(1, 3, 0, 2, 4)   # (H/p, W/p, C, p, p)
    return patches.reshape((H // p) * (W // p), C * p * p)


def check_patchify(fn) -> None:
    """``fn(image, p)``: (C, H, W) -> (N, C*p*p), patches in row-major order, each flattened as (C, p, p)."""
    gen = torch.Generator().manual_seed(11)
    image = torch.randn(3, 8, 12, generator=gen)
    p = 4
    try:
        got = attempt(fn, image.clone(), p)
    except NotAttempted:
        return not_attempted("patchify")
    n, width = (8 // p) * (12 // p), 3 * p * p
    got = require_tensor("patchify(image, 4)", got, (n, width))
    expected = _reference_patchify(image, p)
    if close(got, image.reshape(n, width)):
        raise ExerciseError("a plain reshape mixes pixels of different patches: split H and W into "
                            "(H/p, p) and (W/p, p), then permute so each patch's pixels are together")
    column_major = _reference_patchify(image.transpose(1, 2), p)
    grid = expected.reshape(2, 3, width).transpose(0, 1).reshape(n, width)
    if close(got, grid) or close(got, column_major):
        raise ExerciseError("the patches are in column-major order: number them row by row (left to right, "
                            "then top to bottom), as ViT does")
    channels_last = image.reshape(3, 2, p, 3, p).permute(1, 3, 2, 4, 0).reshape(n, width)
    if close(got, channels_last):
        raise ExerciseError("each patch is flattened as (p, p, C); flatten it as (C, p, p) (channels first, like "
                            "the image and like a Conv2d patch embedding)")
    if not close(got, expected):
        raise ExerciseError("the patches differ from the reference: patch k = image[:, r*p:(r+1)*p, c*p:(c+1)*p] "
                            "with k = r * (W/p) + c, flattened")
    return passed("ViT patches: row-major, each flattened channels-first to C*p*p numbers")


def check_preference(fn) -> None:
    """``fn(maps, query, a, b) -> (n_layers, n_heads)``: w[query -> a] - w[query -> b] in every head."""
    from ..explore import AttentionMaps, token_index

    tokens = ["[CLS]", "the", "trophy", "did", "not", "fit", "suitcase", "it", "big", "[SEP]"]
    gen = torch.Generator().manual_seed(14)
    weights = torch.softmax(2 * torch.randn(2, 3, 10, 10, generator=gen), dim=-1)
    maps = AttentionMaps(tokens, weights)
    i, a, b = token_index(tokens, "it"), token_index(tokens, "trophy"), token_index(tokens, "suitcase")
    try:
        got = attempt(fn, maps, "it", "trophy", "suitcase")
    except NotAttempted:
        return not_attempted("preference")
    want = weights[:, :, i, a] - weights[:, :, i, b]
    if isinstance(got, torch.Tensor) and got.dim() == 1 and got.shape[0] in (2, 3):
        raise ExerciseError(f"you returned shape {tuple(got.shape)}: keep one number per head, (n_layers, n_heads) "
                            "= (2, 3); do not average over heads or layers")
    got = require_tensor("preference(maps, 'it', 'trophy', 'suitcase')", got, (2, 3))
    if close(got, -want):
        raise ExerciseError("the sign is flipped: return w[it -> trophy] - w[it -> suitcase], positive when 'it' "
                            "looks more at 'trophy'")
    if close(got, weights[:, :, a, i] - weights[:, :, b, i]):
        raise ExerciseError("you read the columns of 'it' (how much 'trophy' looks at 'it'): rows are queries, "
                            "so take row 'it' and columns 'trophy' and 'suitcase': weights[:, :, it, key]")
    if close(got, weights[:, :, i, a]):
        raise ExerciseError("that is only the weight on 'trophy': subtract the weight on 'suitcase'")
    if close(got, want.abs()) and not close(got, want):
        raise ExerciseError("keep the sign (no abs): the sign says which noun 'it' prefers")
    if not close(got, want):
        raise ExerciseError("expected weights[:, :, i, j_a] - weights[:, :, i, j_b] with i, j_a, j_b the positions "
                            "of the query and the two keys (explore.token_index or explore.token_scores)")
    return passed("w[query -> a] - w[query -> b] in every head: positive where the query prefers a")
