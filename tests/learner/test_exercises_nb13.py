"""Checkers of notebook 13: right answers pass, each planted mistake is named, stubs are not attempted."""

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb13 as check


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own
RIGHT["mla_bytes"] = check.check_mla_bytes, lambda n, r, p, t, b: (r + p) * n * t * b


@pytest.mark.parametrize("wrong, message", [
    (lambda n, r, p, t, b: 2 * (r + p) * n * t * b, "no separate K and V"),
    (lambda n, r, p, t, b: r * n * t * b, "RoPE key is missing"),
    (lambda n, r, p, t, b: (r + p) * t * b, "multiply by n_layers"),
    (lambda n, r, p, t, b: 0, "should be"),
])
def test_mla_bytes_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_mla_bytes(wrong)


RIGHT["sink_slot"] = check.check_sink_slot, lambda p, s, w: p if p < s else s + (p - s) % w


@pytest.mark.parametrize("wrong, message", [
    (lambda p, s, w: p if p < s else p % w, "writes over the sink"),
    (lambda p, s, w: p % (s + w), "evicts the sinks"),
    (lambda p, s, w: p if p < s else s + p % w, "count the ring from the first"),
    (lambda p, s, w: p, "should be"),
])
def test_sink_slot_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_sink_slot(wrong)


def _positions(ids):
    out = []
    for t in range(len(ids)):
        out.append(0 if t == 0 or ids[t] != ids[t - 1] else out[-1] + 1)
    return torch.tensor(out)


RIGHT["document_positions"] = check.check_document_positions, _positions


@pytest.mark.parametrize("wrong, message", [
    (lambda ids: torch.arange(len(ids)), "positions in the packed row"),
    (lambda ids: _positions(ids) + 1, "off by one"),
    (lambda ids: ids.clone(), "document id"),
    (lambda ids: torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3, 0]) if len(ids) == 10
     else torch.zeros(len(ids), dtype=torch.long), "whatever their values"),
    (lambda ids: torch.zeros(10, dtype=torch.long), "expected"),
    (lambda ids: [0] * 10, "should be a torch.Tensor"),
])
def test_document_positions_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_document_positions(wrong)


def absorb_right(q_nope, w_uk):
    return torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)


RIGHT["absorb_query"] = check.check_absorb_query, absorb_right
RIGHT["absorb_query_matmul"] = check.check_absorb_query, lambda q, w: q @ w


@pytest.mark.parametrize("wrong, message", [
    (lambda q, w: q @ w.transpose(-2, -1), "torch refused the shapes"),        # W^UK q, not W^UK^T q
    (lambda q, w: torch.einsum("bhln,hnc->blc", q, w), "the heads are gone"),   # summed over heads
    (lambda q, w: q, "still q"),
    (lambda q, w: absorb_right(q, w) / q.shape[-1] ** 0.5, "came out scaled"),
    (lambda q, w: absorb_right(q, w) / w.shape[-1] ** 0.5, "came out scaled"),
    (lambda q, w: q @ w[0], "used head 0"),
    (lambda q, w: absorb_right(q, w.flip(0)), "differ from the naive"),       # heads mismatched
])
def test_absorb_query_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_absorb_query(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
