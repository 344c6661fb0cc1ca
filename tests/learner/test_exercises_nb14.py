"""Checkers of notebook 14: right answers pass, typical wrong answers get the right diagnosis."""

import pytest
import torch
from helpers import expect_error, right_and_not_attempted_test

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


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
