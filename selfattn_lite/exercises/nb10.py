"""Checkers for notebook 10: value-weighted norms, a graph attention mask, ViT patches back to an image, a pronoun's
preference."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_weighted_norms", "check_graph_mask", "check_unpatchify", "check_preference"]


def _reference_weighted_norms(weights: torch.Tensor, v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    h, T, _ = weights.shape
    d = v.shape[-1]
    v_heads = v.reshape(T, h, d // h).transpose(0, 1)                # (h, T, dk): each head's slice of v
    w_heads = w_o.reshape(d, h, d // h).permute(1, 2, 0)             # (h, dk, d): W_o's columns for that head
    return weights * (v_heads @ w_heads).norm(dim=-1)[:, None, :]    # (h, T, T)


def check_weighted_norms(fn) -> None:
    """``fn(weights, v, w_o)``: (h, T, T), (T, d), (d, d) -> (h, T, T), ||w[h, i, j] * W_o^h v_j^h||."""
    gen = torch.Generator().manual_seed(10)
    h, T, d = 3, 5, 12
    weights = torch.softmax(2 * torch.randn(h, T, T, generator=gen), dim=-1)
    v, w_o = torch.randn(T, d, generator=gen), torch.randn(d, d, generator=gen)
    try:
        got = attempt(fn, weights.clone(), v.clone(), w_o.clone())
    except NotAttempted:
        return not_attempted("weighted_norms")
    if isinstance(got, torch.Tensor) and got.shape == (h, T):
        raise ExerciseError(f"you returned {tuple(got.shape)}, one number per query: keep one norm per edge "
                            f"(query i, key j), shape (h, T, T) = {(h, T, T)}; do not sum over the keys")
    got = require_tensor("weighted_norms(weights, v, w_o)", got, (h, T, T))
    expected = _reference_weighted_norms(weights, v, w_o)
    if close(got, weights):
        raise ExerciseError("that is the weight alone: multiply each weight by the length of what it moves, "
                            "||W_o^h v_j^h||")
    v_heads = v.reshape(T, h, d // h).transpose(0, 1)
    if close(got, weights * v_heads.norm(dim=-1)[:, None, :]):
        raise ExerciseError("you measured ||v_j^h|| before the output projection: what reaches the residual "
                            "stream is W_o^h v_j^h, with W_o^h = w_o[:, h*dk:(h+1)*dk] (the columns of head h)")
    rows = v_heads @ w_o.reshape(h, d // h, d)                        # (h, T, d): rows of w_o, not columns
    if close(got, weights * rows.norm(dim=-1)[:, None, :]):
        raise ExerciseError("you used rows h*dk:(h+1)*dk of w_o: nn.Linear computes x @ w_o.T, so head h's "
                            "slice of v meets the *columns* w_o[:, h*dk:(h+1)*dk]")
    whole = (v @ w_o.T).norm(dim=-1)                                  # (T,): every head's slice at once
    if close(got, weights * whole[None, None, :]):
        raise ExerciseError("you projected the whole of v_j (all heads) with all of w_o: each head moves only "
                            "its own slice, v[:, h*dk:(h+1)*dk], through its own columns of w_o")
    if close(got, weights * (v_heads @ w_o.reshape(d, h, d // h).permute(1, 2, 0)).norm(dim=-1)[:, :, None]):
        raise ExerciseError("the norms are indexed by the query: the vector moved along edge i -> j is key j's "
                            "value, so broadcast the norm over the keys' axis (the last one)")
    if not close(got, expected):
        raise ExerciseError("the norms differ from ||w[h, i, j] * W_o^h v_j^h|| with W_o^h = "
                            "w_o[:, h*dk:(h+1)*dk] and v_j^h = v[j, h*dk:(h+1)*dk]")
    return passed("||w * W_o v|| per edge: what each edge moves, not only how much weight it has")


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


def check_unpatchify(fn) -> None:
    """``fn(patches, p, H, W)``: (N, C*p*p) row-major, channels-first patches -> the image (C, H, W)."""
    gen = torch.Generator().manual_seed(11)
    image = torch.randn(3, 8, 12, generator=gen)
    p = 4
    patches = _reference_patchify(image, p)                           # (6, 48)
    try:
        got = attempt(fn, patches.clone(), p, 8, 12)
    except NotAttempted:
        return not_attempted("unpatchify")
    got = require_tensor("unpatchify(patches, 4, 8, 12)", got, (3, 8, 12))
    if close(got, patches.reshape(3, 8, 12)):
        raise ExerciseError("a plain reshape puts the numbers of one patch across several rows of the image: "
                            "undo the patching step by step, (H/p, W/p, C, p, p) first, then permute back")
    if close(got, patches.reshape(2, 3, 3, p, p).permute(2, 0, 1, 3, 4).reshape(3, 8, 12)):
        raise ExerciseError("the blocks are not interleaved with the pixels: after (H/p, W/p, C, p, p), permute "
                            "to (C, H/p, p, W/p, p), so each block row sits next to its p pixel rows, then reshape")
    column_major = patches.reshape(3, 2, 48).transpose(0, 1).reshape(6, 48)
    if close(got, _reference_unpatchify(column_major, p, 8, 12)):
        raise ExerciseError("you placed the patches column by column: patch k sits at row k // (W/p), column "
                            "k % (W/p) (numbered left to right, then top to bottom)")
    channels_last = patches.reshape(6, p, p, 3).permute(0, 3, 1, 2).reshape(6, 48)
    if close(got, _reference_unpatchify(channels_last, p, 8, 12)):
        raise ExerciseError("you read each patch as (p, p, C), the order MAE's patchify uses: these patches were "
                            "flattened channels first, (C, p, p), as PyTorch ViT implementations cut them")
    if not close(got, image):
        raise ExerciseError("the image differs from the one the patches came from: patch k = r * (W/p) + c "
                            "holds image[:, r*p:(r+1)*p, c*p:(c+1)*p], flattened as (C, p, p)")
    small = image[:1, :4, :8]
    try:
        again = attempt(fn, _reference_patchify(small, 2), 2, 4, 8)
    except RuntimeError:                                              # a fixed C no longer fits the shape
        again = None
    if not (isinstance(again, torch.Tensor) and again.shape == small.shape and close(again, small)):
        raise ExerciseError("right for a 3-channel 8 x 12 image with p = 4, wrong for 1 channel, 4 x 8, p = 2: "
                            "read C from the patches' width (C*p*p) instead of a fixed number")
    return passed("the patches go back to the image: the inverse of section 4's row-major, channels-first cut")


def _reference_unpatchify(patches: torch.Tensor, p: int, H: int, W: int) -> torch.Tensor:
    C = patches.shape[1] // (p * p)
    x = patches.reshape(H // p, W // p, C, p, p).permute(2, 0, 3, 1, 4)   # (C, H/p, p, W/p, p)
    return x.reshape(C, H, W)


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
