"""Checkers of notebook 14: right answers pass, typical wrong answers get the right diagnosis."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite.distributed import block_attention_backward, shard
from selfattn_lite.exercises import ExerciseError, nb14


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- merge_partials

def merge_right(o1, l1, o2, l2):
    lse = torch.logaddexp(l1, l2)
    return o1 * torch.exp(l1 - lse).unsqueeze(-1) + o2 * torch.exp(l2 - lse).unsqueeze(-1), lse


RIGHT["merge_partials"] = nb14.check_merge_partials, merge_right


def _with_lse(out_fn):
    return lambda o1, l1, o2, l2: (out_fn(o1, l1, o2, l2), torch.logaddexp(l1, l2))


@pytest.mark.parametrize("wrong,fragment", [
    (_with_lse(lambda o1, l1, o2, l2: (o1 + o2) / 2), "averaging"),
    (lambda o1, l1, o2, l2: (merge_right(o1, l1, o2, l2)[0], torch.maximum(l1, l2)), "larger of the two"),
    (lambda o1, l1, o2, l2: (merge_right(o1, l1, o2, l2)[0], l1 + l2), "NaN or inf"),   # -inf + finite
    (_with_lse(lambda o1, l1, o2, l2: o1 * torch.exp(l1).unsqueeze(-1) + o2 * torch.exp(l2).unsqueeze(-1)),
     "not normalised"),
    (_with_lse(lambda o1, l1, o2, l2: o1 * torch.exp(l2 - torch.logaddexp(l1, l2)).unsqueeze(-1)
               + o2 * torch.exp(l1 - torch.logaddexp(l1, l2)).unsqueeze(-1)), "swapped"),
    (lambda o1, l1, o2, l2: (o1 * torch.exp(l1 - torch.maximum(l1, l2)).unsqueeze(-1), torch.logaddexp(l1, l2)),
     "attention to all keys"),
    (lambda o1, l1, o2, l2: (o1 + 0 * l2.unsqueeze(-1), torch.logaddexp(l1, l2)), "NaN or inf"),
    (lambda o1, l1, o2, l2: merge_right(o1, l1, o2, l2)[0], "pair (out, lse)"),
    (_with_lse(lambda o1, l1, o2, l2: o1 + o2), "forgot to rescale"),
    (lambda o1, l1, o2, l2: (merge_right(o1, l1, o2, l2)[0], torch.logaddexp2(l1, l2)), "base 2"),
    (_with_lse(lambda o1, l1, o2, l2: o1 * torch.exp2(l1 - torch.logaddexp(l1, l2)).unsqueeze(-1)
               + o2 * torch.exp2(l2 - torch.logaddexp(l1, l2)).unsqueeze(-1)), "base 2"),
    (lambda o1, l1, o2, l2: (merge_right(o1, l1, o2, l2)[0][0], torch.logaddexp(l1, l2)), "shape"),
])
def test_merge_partials_diagnoses(wrong, fragment):
    expect_error(nb14.check_merge_partials, wrong, fragment)


def test_merge_partials_sum_of_lse_is_named():
    def add_lse(o1, l1, o2, l2):             # finite everywhere, but lse1 + lse2
        out, lse = merge_right(o1, l1, o2, l2)
        return out, torch.where(torch.isfinite(l1 + l2), l1 + l2, lse)
    with pytest.raises(ExerciseError) as info:
        nb14.check_merge_partials(add_lse)
    assert "lse" in str(info.value)


# ----------------------------------------------------------------------------- the ring's causal skips

def skips_right(rank, world, layout):
    return [s for s in range(1, world) if (rank - s) % world > rank] if layout == "contiguous" else []


RIGHT["ring_skips"] = nb14.check_ring_skips, skips_right
RIGHT["ring_skips_tensor"] = (
    nb14.check_ring_skips,
    lambda r, w, lay: torch.tensor(skips_right(r, w, lay), dtype=torch.long))


@pytest.mark.parametrize("wrong,fragment", [
    (lambda r, w, lay: [0, *skips_right(r, w, lay)], "diagonal step"),                   # skipped its own block
    (lambda r, w, lay: skips_right(r, w, "contiguous"), "zig-zag"),                      # same rule for zig-zag
    (lambda r, w, lay: [s for s in range(1, w) if (r - s) % w < r] if lay == "contiguous" else [], "reversed"),
    (lambda r, w, lay: [s for s in range(r, w) if s] if lay == "contiguous" else [], "off by one"),
    (lambda r, w, lay: [], "nothing skipped"),
    (lambda r, w, lay: skips_right(r, w, lay)[:-1] if w > 2 else skips_right(r, w, lay), "may be skipped are"),
    (lambda r, w, lay: [s for s in range(1, w) if (r - s) % w != r - 1] if lay == "contiguous" else [],
     "must be computed"),
])
def test_ring_skips_diagnoses(wrong, fragment):
    expect_error(nb14.check_ring_skips, wrong, fragment)


# ----------------------------------------------------------------------------- zigzag_indices

def zigzag_right(L, rank, world):
    parts = 2 * world
    sizes = [L // parts + (1 if p < L % parts else 0) for p in range(parts)]
    starts = [sum(sizes[:p]) for p in range(parts + 1)]
    return [*range(starts[rank], starts[rank + 1]),
            *range(starts[parts - 1 - rank], starts[parts - rank])]


RIGHT["zigzag_indices"] = nb14.check_zigzag_indices, zigzag_right
RIGHT["zigzag_indices_tensor"] = nb14.check_zigzag_indices, lambda L, r, w: torch.tensor(zigzag_right(L, r, w))


def contiguous(L, rank, world):
    sizes = [L // world + (1 if p < L % world else 0) for p in range(world)]
    return list(range(sum(sizes[:rank]), sum(sizes[:rank + 1])))


def chunks(L, rank, world, partner):
    parts = 2 * world
    sizes = [L // parts + (1 if p < L % parts else 0) for p in range(parts)]
    starts = [sum(sizes[:p]) for p in range(parts + 1)]
    c = partner(rank, world)
    return [*range(starts[rank], starts[rank + 1]), *range(starts[c], starts[c + 1])]


@pytest.mark.parametrize("wrong,fragment", [
    (contiguous, "contiguous split"),
    (lambda L, r, w: zigzag_right(L, r, w)[::-1], "wrong order"),
    (lambda L, r, w: chunks(L, r, w, lambda r, w: w + r), "W + r"),
    (lambda L, r, w: chunks(L, r, w, lambda r, w: min(2 * w - r, 2 * w - 1)), "off by one"),
    (lambda L, r, w: [*range(r * (L // (2 * w)), (r + 1) * (L // (2 * w))),
                      *range((2 * w - 1 - r) * (L // (2 * w)), (2 * w - r) * (L // (2 * w)))], "not divisible"),
    (lambda L, r, w: [0, 1], "expected"),
])
def test_zigzag_diagnoses(wrong, fragment):
    expect_error(nb14.check_zigzag_indices, wrong, fragment)


def test_zigzag_message_claims_equal_work_only_where_it_is(capsys):
    nb14.check_zigzag_indices(zigzag_right)
    message = capsys.readouterr().out
    assert "Where 2W divides L every rank computes the same causal work (L=16, W=4: [36, 36, 36, 36]" in message
    assert "the work differs too (L=11, W=3: [15, 28, 28])" in message


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
