"""Checkers of notebook 14: right answers pass, typical wrong answers get the right diagnosis."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite.distributed import (
    block_attention_backward,
    merge_partials,
    shard,
    shard_indices,
    shard_segments,
)
from selfattn_lite.exercises import nb14


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- add_sink

def sink_right(out, lse, sink):
    new = torch.logaddexp(lse, sink[:, None])
    return out * torch.exp(lse - new).unsqueeze(-1), new


RIGHT["add_sink"] = nb14.check_add_sink, sink_right
RIGHT["add_sink_sigmoid"] = nb14.check_add_sink, lambda out, lse, sink: (   # the keys' share, sigmoid(lse - s)
    out * torch.sigmoid(lse - sink[:, None]).unsqueeze(-1), torch.logaddexp(lse, sink[:, None]))
RIGHT["add_sink_merge"] = nb14.check_add_sink, lambda out, lse, sink: merge_partials(    # a block with no value
    out, lse, torch.zeros_like(out), sink[:, None].expand_as(lse))


def _lse(out, lse, sink):
    return torch.logaddexp(lse, sink[:, None])


def _scaled(factor):
    return lambda out, lse, sink: (out * factor(out, lse, sink), _lse(out, lse, sink))


@pytest.mark.parametrize("wrong,fragment", [
    (lambda out, lse, sink: (out, lse), "nothing changed"),
    (lambda out, lse, sink: (sink_right(out, lse, sink)[0], lse), "lse is still the keys'"),
    (lambda out, lse, sink: (out, _lse(out, lse, sink)), "out is unchanged"),
    (lambda out, lse, sink: (sink_right(out, lse, sink)[0], lse + sink[:, None]), "multiplies the two sums"),
    (lambda out, lse, sink: (sink_right(out, lse, sink)[0], torch.log(torch.exp(lse) + torch.exp(sink[:, None]))),
     "overflows float32"),
    (lambda out, lse, sink: (out * torch.exp(lse - torch.logaddexp(lse, sink)).unsqueeze(-1),
                             torch.logaddexp(lse, sink)), "torch refused"),          # sink against the rows: 3 vs 5
    (_scaled(lambda out, lse, sink: torch.sigmoid(-sink)[:, None, None]), "depends on the row"),
    (_scaled(lambda out, lse, sink: torch.exp(sink[:, None] - _lse(out, lse, sink)).unsqueeze(-1)), "sink's share"),
    (_scaled(lambda out, lse, sink: torch.exp(_lse(out, lse, sink) - lse).unsqueeze(-1).clamp_max(1e30)),
     "upside down"),
    (lambda out, lse, sink: (out * torch.exp(lse - _lse(out, lse, sink)).unsqueeze(-1) + lse.isneginf()[..., None]
                             * float("nan"), _lse(out, lse, sink)), "NaN or inf in out"),   # a 0 * inf in row 0
    (lambda out, lse, sink: sink_right(out, lse, sink)[0], "pair (out, lse)"),
    (lambda out, lse, sink: (sink_right(out, lse, sink)[0][0], _lse(out, lse, sink)), "shape"),
    (_scaled(lambda out, lse, sink: 0.5), "gpt-oss's attention"),
])
def test_add_sink_diagnoses(wrong, fragment):
    expect_error(nb14.check_add_sink, wrong, fragment)


def test_add_sink_names_a_sink_broadcast_over_the_rows():
    """With as many heads as rows the wrong broadcast runs: the second case of the checker names it."""
    calls = []

    def rows(out, lse, sink):
        calls.append(lse.shape)
        if lse.shape[1] != lse.shape[2]:
            return sink_right(out, lse, sink)
        new = torch.logaddexp(lse, sink)                      # sink (h,) against the last axis, the rows
        return out * torch.exp(lse - new).unsqueeze(-1), new
    expect_error(nb14.check_add_sink, rows, "broadcast over the rows")
    assert len(calls) == 2


# ----------------------------------------------------------------------------- step_work

def work_right(L, W, layout):
    runs = [shard_segments(L, r, W, layout=layout) for r in range(W)]
    return [[sum((qb - qa) * (kb - ka) for qa, qb in runs[r] for ka, kb in runs[(r - s) % W] if ka < qb)
             for r in range(W)] for s in range(W)]


RIGHT["step_work"] = nb14.check_step_work, work_right
RIGHT["step_work_tensor"] = nb14.check_step_work, lambda L, W, lay: torch.tensor(work_right(L, W, lay))


def _work_by_ring_tiles(L, W, layout):                          # the package's tiles summed: a look-up
    from selfattn_lite import distributed as dist_attn
    runs = [dist_attn.shard_segments(L, r, W, layout=layout) for r in range(W)]
    return [[sum((t.rows.stop - t.rows.start) * (t.cols.stop - t.cols.start)
                 for t in dist_attn.ring_tiles(runs[r], runs[(r - s) % W], is_causal=True)) for r in range(W)]
            for s in range(W)]


def _work(rule, schedule=lambda r, s, W: (r - s) % W):
    def fn(L, W, layout):
        runs = [shard_segments(L, r, W, layout=layout) for r in range(W)]
        return [[sum(rule(qa, qb, ka, kb) for qa, qb in runs[r] for ka, kb in runs[schedule(r, s, W)])
                 for r in range(W)] for s in range(W)]
    return fn


def _whole(qa, qb, ka, kb):
    return (qb - qa) * (kb - ka)


def _one_tile(L, W, layout):
    pos = [shard_indices(L, r, W, layout=layout) for r in range(W)]
    return [[len(pos[r]) * len(pos[(r - s) % W]) * int(bool((pos[(r - s) % W][:, None] <= pos[r][None, :]).any()))
             for r in range(W)] for s in range(W)]


@pytest.mark.parametrize("wrong,fragment", [
    (lambda L, W, lay: [list(col) for col in zip(*work_right(L, W, lay))], "rows and columns swapped"),
    (_work(lambda qa, qb, ka, kb: _whole(qa, qb, ka, kb) * (ka < qb), lambda r, s, W: (r + s) % W),
     "schedule runs backwards"),
    (_work(_whole), "nothing skipped"),
    (_work(lambda qa, qb, ka, kb: sum(max(0, min(kb, q + 1) - ka) for q in range(qa, qb))), "only the needed"),
    (_one_tile, "a tile of its own"),
    (_work(lambda qa, qb, ka, kb: _whole(qa, qb, ka, kb) * (kb - 1 <= qa)), "only partly masked"),
    (_work(lambda qa, qb, ka, kb: _whole(qa, qb, ka, kb) * (ka < qa)), "only partly masked"),   # diagonal skipped
    (lambda L, W, lay: [row[::-1] for row in work_right(L, W, lay)], "at step"),
    (lambda L, W, lay: work_right(L, W, lay)[:-1], "one per step"),
    (_work_by_ring_tiles, "classify each (query run, key run) tile yourself"),
])
def test_step_work_diagnoses(wrong, fragment):
    expect_error(nb14.check_step_work, wrong, fragment)


def test_step_work_message_is_the_tables(capsys):
    """The figures the message prints, recomputed from the right answer and the formulas of the notebook."""
    nb14.check_step_work(work_right)
    message = capsys.readouterr().out
    c = 64
    cont, zz = work_right(16 * c, 8, "contiguous"), work_right(16 * c, 8, "zigzag")
    assert [sum(col) for col in zip(*cont)] == [4 * c * c * (r + 1) for r in range(8)]   # cell 20's formula
    assert [sum(col) for col in zip(*zz)] == [17 * c * c] * 8                            # (2W + 1) c²
    assert "a whole block of (2c)² = 16384 scores or nothing, and 28 of the 64 (step, rank) slots are empty" in message
    assert "3c² = 12288 at step 0 and 2c² = 8192, half a block, at every later step" in message


# ----------------------------------------------------------------------------- zigzag_owner

def owner_right(p, L, W):
    parts = 2 * W
    size, extra = divmod(L, parts)
    starts = [c * size + min(c, extra) for c in range(parts + 1)]
    c = max(i for i in range(parts) if starts[i] <= p)
    if c < W:
        return c, p - starts[c]
    rank = parts - 1 - c
    return rank, starts[rank + 1] - starts[rank] + p - starts[c]


RIGHT["zigzag_owner"] = nb14.check_zigzag_owner, owner_right


def _owner_by_search(p, L, W):                                  # a look-up over the shards, not the layout
    from selfattn_lite import distributed as dist_attn
    return next((r, row) for r in range(W)
                for row, q in enumerate(dist_attn.shard_indices(L, r, W, layout="zigzag").tolist()) if q == p)


def _owner(partner, late_offset=True, sizes=None):
    def fn(p, L, W):
        parts = 2 * W
        chunk = sizes(L, parts) if sizes else [L // parts + (i < L % parts) for i in range(parts)]
        starts = [sum(chunk[:i]) for i in range(parts + 1)]
        c = max(i for i in range(parts) if starts[i] <= p)
        if c < W:
            return c, p - starts[c]
        rank = partner(c, W)
        early = chunk[rank] if rank < parts else 0
        return rank, (early if late_offset else 0) + p - starts[c]
    return fn


def _contiguous_owner(p, L, W):
    sizes = [L // W + (i < L % W) for i in range(W)]
    starts = [sum(sizes[:i]) for i in range(W + 1)]
    r = max(i for i in range(W) if starts[i] <= p)
    return r, p - starts[r]


def _even(L, parts):
    return [L // parts] * (parts - 1) + [L - (parts - 1) * (L // parts)]


@pytest.mark.parametrize("wrong,fragment", [
    (_contiguous_owner, "contiguous split"),
    (lambda p, L, W: owner_right(p, L, W)[::-1], "wrong way round"),
    (lambda p, L, W: (owner_right(p, L, W)[0], p), "not the global position"),
    (_owner(lambda c, W: c - W), "not to rank i − W"),
    (_owner_by_search, "work from L and W"),
    (_owner(lambda c, W: 2 * W - c), "off by one"),
    (_owner(lambda c, W: 2 * W - 1 - c, late_offset=False), "add the early chunk's length"),
    (_owner(lambda c, W: 2 * W - 1 - c, sizes=_even), "one row longer"),
    (lambda p, L, W: (0, 0), "position 1 is row"),
    (lambda p, L, W: 0, "pair (rank, row)"),
])
def test_zigzag_owner_diagnoses(wrong, fragment):
    expect_error(nb14.check_zigzag_owner, wrong, fragment)


def test_the_hidden_package_functions_come_back_after_a_check():
    from selfattn_lite import distributed as dist_attn
    from selfattn_lite.distributed import ring, sharding
    before = (dist_attn.ring_tiles, ring.ring_tiles, dist_attn.shard_indices, sharding.shard_segments)
    expect_error(nb14.check_step_work, _work_by_ring_tiles, "ring_tiles")
    expect_error(nb14.check_zigzag_owner, _owner_by_search, "shard_indices")
    assert (dist_attn.ring_tiles, ring.ring_tiles, dist_attn.shard_indices, sharding.shard_segments) == before
    assert dist_attn.shard_lengths(37, 4) == [10, 9, 9, 9]


def test_zigzag_owner_message_is_the_layout(capsys):
    nb14.check_zigzag_owner(owner_right)
    message = capsys.readouterr().out
    assert owner_right(36, 37, 4) == (0, 8) and _contiguous_owner(36, 37, 4)[0] == 3
    assert "the last position, whose logits sample the next token, is row 8 of rank 0" in message


# ----------------------------------------------------------------------------- Ulysses and the ring's backward
# The notebook passes the gloo processes' results; here single-process SDPA's, sharded, stand in for them
# (the notebook asserts the two agree to 1e-10).

def _case(method, L, W, layout="contiguous", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(2, 4, L, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    case = dict(method=method, q=q, k=k, v=v, grad=grad, is_causal=True, layout=layout,
                ranks=None if W == 4 else list(range(W)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(grad)
    full = dict(out=out.detach(), dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
    per_rank = [{name: shard(t, r, W, layout=layout) for name, t in full.items()} for r in range(W)]
    return case, per_rank


ULYSSES = _case("ulysses", 37, 4)
RING = {"contiguous": _case("ring", 29, 3, seed=1), "zigzag": _case("ring", 37, 4, "zigzag", seed=2)}


def ulysses_right(qs, ks, vs, is_causal):
    W, h = len(qs), qs[0].shape[1]

    def to_heads(xs):                                    # rank j: heads [j h/W, (j+1) h/W) of all rows
        return [torch.cat([x[:, j * h // W:(j + 1) * h // W] for x in xs], dim=2) for j in range(W)]
    outs = [F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
            for q, k, v in zip(to_heads(qs), to_heads(ks), to_heads(vs))]
    lengths = [x.shape[2] for x in qs]
    return [torch.cat([o.split(lengths, dim=2)[r] for o in outs], dim=1) for r in range(W)]


RIGHT["simulated_ulysses"] = partial(nb14.check_simulated_ulysses, case=ULYSSES[0], per_rank=ULYSSES[1]), ulysses_right


@pytest.mark.parametrize("wrong, fragment", [
    (lambda qs, ks, vs, c: [F.scaled_dot_product_attention(q, k, v, is_causal=c) for q, k, v in zip(qs, ks, vs)],
     "only to its own rows"),
    (lambda qs, ks, vs, c: ulysses_right(qs, ks, vs, False), "causal mask is missing"),
    (lambda qs, ks, vs, c: [torch.cat(ulysses_right(qs, ks, vs, c), dim=2)] * len(qs), "should have shape"),
    (lambda qs, ks, vs, c: [o.detach() for o in ulysses_right([q.detach() for q in qs], ks, vs, c)], "autograd"),
    (lambda qs, ks, vs, c: ulysses_right(qs, ks, vs, c)[:-1], "one tensor per rank"),
    (lambda qs, ks, vs, c: [o.flip(1) for o in ulysses_right(qs, ks, vs, c)], "differ from the multi-process"),
])
def test_simulated_ulysses_diagnoses(wrong, fragment):
    expect_error(partial(nb14.check_simulated_ulysses, case=ULYSSES[0], per_rank=ULYSSES[1]), wrong, fragment)


def test_simulated_ulysses_wants_a_ulysses_case():
    with pytest.raises(ValueError, match="ulysses cases"):
        nb14.check_simulated_ulysses(ulysses_right, RING["zigzag"][0], RING["zigzag"][1])


def ring_backward_right(q, k, v, out, lse, grad, positions, is_causal, *, hops=None, travel=True, delta=True):
    W = len(q)
    scale = q[0].shape[-1] ** -0.5
    deltas = [(g * o).sum(-1) if delta else torch.zeros_like(s) for g, o, s in zip(grad, out, lse)]
    dq = [torch.zeros_like(t) for t in q]
    held = [(r, torch.zeros_like(k[r]), torch.zeros_like(v[r])) for r in range(W)]   # block, its dK, dV
    kept = [(torch.zeros_like(k[r]), torch.zeros_like(v[r])) for r in range(W)]
    for step in range(W):
        for r in range(W):
            src, dk, dv = held[r]
            mask = positions[src][None, :] <= positions[r][:, None] if is_causal else None
            g = block_attention_backward(q[r], k[src], v[src], lse[r], deltas[r], grad[r], scale=scale, mask=mask)
            dq[r] += g[0]
            if travel:
                dk += g[1]
                dv += g[2]
            elif src == r:
                kept[r][0].add_(g[1])
                kept[r][1].add_(g[2])
        if step < (W if hops is None else hops):
            held = [held[(r - 1) % W] for r in range(W)]  # send to r + 1, receive from r - 1
    return [(dq[r], *(held[r][1:] if travel else kept[r])) for r in range(W)]


for layout, (case, per_rank) in RING.items():
    RIGHT[f"ring_backward_{layout}"] = partial(nb14.check_ring_backward, case=case, per_rank=per_rank), \
        ring_backward_right


@pytest.mark.parametrize("layout", list(RING))
@pytest.mark.parametrize("wrong, fragment", [
    (partial(ring_backward_right, hops=-1), "one hop short"),
    (partial(ring_backward_right, travel=False), "kept only the dK, dV of its own block"),
    (partial(ring_backward_right, delta=False), "D = rowsum(dO * O) is missing"),
    (lambda *a: ring_backward_right(*a[:-1], False), "causal mask is missing"),
    (lambda *a: [(dq, dk * 2, dv) for dq, dk, dv in ring_backward_right(*a)], "dq is right"),
    (lambda *a: [(dq * 2, dk, dv) for dq, dk, dv in ring_backward_right(*a)], "dq differs"),
    (lambda *a: ring_backward_right(*a)[0], "one (dq, dk, dv) triple per rank"),
])
def test_ring_backward_diagnoses(layout, wrong, fragment):
    case, per_rank = RING[layout]
    W = len(case["ranks"] or range(4))
    if fragment == "one hop short":
        wrong = partial(ring_backward_right, hops=W - 1)
    expect_error(partial(nb14.check_ring_backward, case=case, per_rank=per_rank), wrong, fragment)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
