"""DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-all from sequence shards to head shards and back.

Taught in notebook 14, "Ulysses: all-to-all, heads instead of keys".

Every rank holds all h heads of its rows; an all-to-all gives rank j heads [j h/W, (j+1) h/W) of
*all* rows; each rank runs ordinary attention on its heads; a second all-to-all returns the rows.
With grouped-query attention and fewer K/V heads than ranks (h_kv < W), each K/V head is first
replicated R times (``kv_replication``) so that every rank receives the K/V head its query heads
use: the degree is capped by the query heads, and the K/V all-to-all moves R times more bytes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_bool, check_positive_int
from .comm import check_floats, exchange, exchange_shapes, group_rank_size, wait_all

__all__ = ["ulysses_attention", "kv_replication"]


def kv_replication(heads: int, kv_heads: int, world_size: int) -> int:
    """How many copies R of each K/V head Ulysses needs on ``world_size`` ranks.

    Rank j gets query heads [j h/W, (j+1) h/W), so W must divide h. Its K/V heads must be a whole
    share too: W must divide R h_kv, and the smallest such R is W / gcd(h_kv, W) (1 when W divides
    h_kv). Then R h_kv = lcm(h_kv, W), which divides h (both W and h_kv do), so copies made by
    ``repeat_interleave`` keep grouped-query attention's groups: query head i still reads a copy of
    K/V head i // (h / h_kv). The query heads, not the K/V heads, cap Ulysses' degree.

    Returns:
        R >= 1.

    Raises:
        ValueError: h not divisible by W or by h_kv.
    """
    for name, n in (("heads", heads), ("kv_heads", kv_heads), ("world_size", world_size)):
        check_positive_int(name, n)
    if heads % world_size or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads are split over {world_size} ranks: q has {heads} heads, k/v {kv_heads}; h must be "
                         f"divisible by {world_size} and by h_kv")
    return world_size // math.gcd(kv_heads, world_size)


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, group=None) -> Tensor:
    """Exact attention with heads, not keys, split across ranks (DeepSpeed-Ulysses).

    Every rank holds all h heads of its contiguous rows. An all-to-all sends heads
    [j h/W, (j+1) h/W) of those rows to rank j, so rank j ends with h/W heads of the *whole*
    sequence; it runs ordinary attention (torch SDPA) on them; a second all-to-all returns each
    rank's rows. When W does not divide h_kv, every K/V head is first repeated R =
    ``kv_replication(h, h_kv, W)`` times (its gradient sums over the copies). Differentiable (the
    backward runs the all-to-alls in reverse).

    Args:
        q: (..., h, n_r, E), k: (..., h_kv, n_r, E), v: (..., h_kv, n_r, Ev): this rank's contiguous shard
            (``shard(x, rank, W)``; lengths need not divide). h must be divisible by W and by h_kv
            (h_kv < h is grouped-query attention).
        is_causal: global causal mask.
        group: the process group (default: the whole world).

    Returns:
        (..., h, n_r, Ev): this rank's rows of the output.

    Raises:
        ValueError: head counts that cannot be split over the group, or shapes that do not fit.
    """
    rank, world = group_rank_size(group)
    check_floats(q, k, v, "ulysses_attention", min_dim=3)
    check_bool("is_causal", is_causal)
    h, h_kv = q.shape[-3], k.shape[-3]
    problem, copies = None, 1
    try:
        if v.shape[-3] != h_kv:
            raise ValueError(f"k has {h_kv} heads but v has {v.shape[-3]}")
        copies = kv_replication(h, h_kv, world)
    except ValueError as error:
        problem = str(error)
    if problem is None and not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3] and q.shape[-1] == k.shape[-1]
                                and k.shape[-2] == v.shape[-2] and q.dtype == k.dtype == v.dtype):
        problem = (f"q (..., h, n, E), k (..., h_kv, n, E), v (..., h_kv, n, Ev) must share the leading dims, E "
                   f"and dtype; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    lengths = exchange_shapes(q, k, v, "contiguous", is_causal, group, "ulysses_attention", problem)
    if copies > 1:                                                   # (..., R h_kv, n_r, E): copies side by side
        k, v = k.repeat_interleave(copies, dim=-3), v.repeat_interleave(copies, dim=-3)
    heads = [h // world] * world
    heads_kv = [h_kv * copies // world] * world
    q_h = _AllToAll.apply(q, -3, -2, heads, lengths, group, "q")         # (..., h/W, L, E): all rows, some heads
    k_h = _AllToAll.apply(k, -3, -2, heads_kv, lengths, group, "k")      # (..., R h_kv/W, L, E)
    v_h = _AllToAll.apply(v, -3, -2, heads_kv, lengths, group, "v")
    out_h = F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=is_causal,
                                           enable_gqa=q_h.shape[-3] != k_h.shape[-3])
    return _AllToAll.apply(out_h, -2, -3, lengths, heads, group, "out")    # (..., h, n_r, Ev): own rows, all heads


# ---------------------------------------------------------------------------------------------
# The all-to-all, built from point-to-point sends, and its autograd function
# ---------------------------------------------------------------------------------------------

def _all_to_all(x: Tensor, split_dim: int, cat_dim: int, send_sizes: list[int], recv_sizes: list[int],
                group, name: str) -> Tensor:
    """Send piece j of x (cut along split_dim into send_sizes) to rank j; glue the pieces received
    from every rank along cat_dim (rank j's piece has recv_sizes[j] there). Built from
    point-to-point sends, which (unlike gloo's list-form all_to_all) allow unequal pieces. The bytes sent count
    under "all_to_all" and, per tensor, under ``name`` ("q", "k", "v", "out"; "dq", ... backward)."""
    rank, world = group_rank_size(group)
    pieces = [p.contiguous() for p in torch.split(x, send_sizes, dim=split_dim)]
    received = []
    for j in range(world):
        shape = list(x.shape)
        shape[split_dim], shape[cat_dim] = send_sizes[rank], recv_sizes[j]
        received.append(pieces[j] if j == rank else x.new_empty(shape))
    others = [j for j in range(world) if j != rank]
    wait_all(exchange([(pieces[j], j) for j in others], [(received[j], j) for j in others], "all_to_all", group,
                      tensor=name))
    return torch.cat(received, dim=cat_dim)


class _AllToAll(torch.autograd.Function):
    """The all-to-all, differentiable: its backward is the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, send_sizes, recv_sizes, group, name):
        ctx.setup = (split_dim, cat_dim, send_sizes, recv_sizes, group, name)
        return _all_to_all(x, split_dim, cat_dim, send_sizes, recv_sizes, group, name)

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim, send_sizes, recv_sizes, group, name = ctx.setup
        return _all_to_all(grad.contiguous(), cat_dim, split_dim, recv_sizes, send_sizes, group, "d" + name), \
            None, None, None, None, None, None

