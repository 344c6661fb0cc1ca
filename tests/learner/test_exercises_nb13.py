"""Checkers of notebook 13: right answers pass, each planted mistake is named, stubs are not attempted."""

import pytest
import torch

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb13 as check


def stub(*args):
    raise NotImplementedError


def test_mla_bytes(capsys):
    check.check_mla_bytes(lambda n, r, p, t, b: (r + p) * n * t * b)
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda n, r, p, t, b: 2 * (r + p) * n * t * b, "no separate K and V"),
                           (lambda n, r, p, t, b: r * n * t * b, "RoPE key is missing"),
                           (lambda n, r, p, t, b: (r + p) * t * b, "multiply by n_layers"),
                           (lambda n, r, p, t, b: 0, "should be")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_mla_bytes(wrong)
    check.check_mla_bytes(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def test_sink_slot(capsys):
    check.check_sink_slot(lambda p, s, w: p if p < s else s + (p - s) % w)
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda p, s, w: p if p < s else p % w, "writes over the sink"),
                           (lambda p, s, w: p % (s + w), "evicts the sinks"),
                           (lambda p, s, w: p if p < s else s + p % w, "count the ring from the first"),
                           (lambda p, s, w: p, "should be")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_sink_slot(wrong)
    check.check_sink_slot(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def _positions(ids):
    out = []
    for t in range(len(ids)):
        out.append(0 if t == 0 or ids[t] != ids[t - 1] else out[-1] + 1)
    return torch.tensor(out)


def test_document_positions(capsys):
    check.check_document_positions(_positions)
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [(lambda ids: torch.arange(len(ids)), "positions in the packed row"),
                           (lambda ids: _positions(ids) + 1, "off by one"),
                           (lambda ids: ids.clone(), "document id"),
                           (lambda ids: torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3, 0]) if len(ids) == 10
                            else torch.zeros(len(ids), dtype=torch.long), "whatever their values"),
                           (lambda ids: torch.zeros(10, dtype=torch.long), "expected")]:
        with pytest.raises(ExerciseError, match=message):
            check.check_document_positions(wrong)
    with pytest.raises(ExerciseError, match="should be a torch.Tensor"):
        check.check_document_positions(lambda ids: [0] * 10)
    check.check_document_positions(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def absorb_right(q_nope, w_uk):
    return torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)


def test_absorb_query(capsys):
    check.check_absorb_query(absorb_right)
    assert "Correct" in capsys.readouterr().out
    check.check_absorb_query(lambda q, w: q @ w)                     # the same, by broadcasting matmul
    assert "Correct" in capsys.readouterr().out
    for wrong, message in [
        (lambda q, w: q @ w.transpose(-2, -1), "torch refused the shapes"),        # W^UK q, not W^UK^T q
        (lambda q, w: torch.einsum("bhln,hnc->blc", q, w), "the heads are gone"),   # summed over heads
        (lambda q, w: q, "still q"),
        (lambda q, w: absorb_right(q, w) / q.shape[-1] ** 0.5, "came out scaled"),
        (lambda q, w: absorb_right(q, w) / w.shape[-1] ** 0.5, "came out scaled"),
        (lambda q, w: q @ w[0], "used head 0"),
        (lambda q, w: absorb_right(q, w.flip(0)), "differ from the naive"),       # heads mismatched
    ]:
        with pytest.raises(ExerciseError, match=message):
            check.check_absorb_query(wrong)
    check.check_absorb_query(stub)
    assert "Not attempted yet" in capsys.readouterr().out
