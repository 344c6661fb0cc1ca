"""MQAR rows: every property recall.mqar states, checked on many draws; bad arguments named."""

import pytest
import torch

from selfattn_lite.recall import IGNORE_INDEX, key_range, mqar, query_distances, value_range


@pytest.mark.parametrize("batch, seq_len, n_pairs, vocab_size", [(8, 64, 8, 64), (5, 16, 4, 10), (3, 97, 24, 128),
                                                                  (4, 8, 2, 6), (2, 40, 1, 4)])
def test_rows_have_every_stated_property(batch, seq_len, n_pairs, vocab_size):
    inputs, targets = mqar(batch, seq_len, n_pairs, vocab_size, generator=torch.Generator().manual_seed(1))
    assert inputs.shape == targets.shape == (batch, seq_len)
    assert inputs.dtype == targets.dtype == torch.long
    keys, values = inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2]
    for b in range(batch):
        assert len(set(keys[b].tolist())) == n_pairs, "keys distinct within a row"
        assert all(k in key_range(vocab_size) for k in keys[b].tolist())
        assert all(v in value_range(vocab_size) for v in values[b].tolist())
        assert (targets[b, :2 * n_pairs] == IGNORE_INDEX).all(), "no target inside the pairs"
        answer = dict(zip(keys[b].tolist(), values[b].tolist()))
        asked = (targets[b] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert sorted(inputs[b, asked].tolist()) == sorted(answer), "each key queried exactly once"
        for t in asked:
            assert t >= 2 * n_pairs
            assert targets[b, t].item() == answer[inputs[b, t].item()], "target = the value after that key"
            assert inputs[b, t + 1].item() == answer[inputs[b, t].item()], "the value follows its query"
        queried = set(asked) | {t + 1 for t in asked}
        rest = [t for t in range(2 * n_pairs, seq_len) if t not in queried]
        assert (inputs[b, rest] == 0).all(), "filler between the queries"


def test_seeded_rows_repeat_and_differ_across_seeds():
    a = mqar(4, 32, 6, 32, generator=torch.Generator().manual_seed(3))
    b = mqar(4, 32, 6, 32, generator=torch.Generator().manual_seed(3))
    c = mqar(4, 32, 6, 32, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_queries_land_everywhere_in_the_rest():
    inputs, targets = mqar(2000, 24, 4, 16, generator=torch.Generator().manual_seed(0))
    positions = (targets != IGNORE_INDEX).nonzero()[:, 1]
    assert positions.min().item() == 8 and positions.max().item() == 22       # first and last possible slot


def test_query_distances_point_at_the_value():
    inputs, targets = mqar(6, 40, 5, 20, generator=torch.Generator().manual_seed(2))
    d = query_distances(inputs, targets)
    assert ((d >= 0) == (targets != IGNORE_INDEX)).all()
    for b, t in (d >= 0).nonzero().tolist():
        assert inputs[b, t - d[b, t]].item() == targets[b, t].item()          # the value read back
        assert inputs[b, t - d[b, t] - 1].item() == inputs[b, t].item()      # right after the key
    with pytest.raises(ValueError, match=r"\(6, 40\).*\(6, 39\)"):
        query_distances(inputs, targets[:, :-1])


@pytest.mark.parametrize("args, match", [
    ((4, 31, 8, 64), r"seq_len=31 is too short for n_pairs=8.*>= 32"),
    ((4, 64, 8, 16), r"vocab_size=16 has only 7 key tokens.*n_pairs=8.*vocab_size >= 18"),
    ((0, 64, 8, 64), r"batch must be a positive int, got 0"),
    ((4, 64, 0, 64), r"n_pairs must be a positive int, got 0"),
    ((4, 64.0, 8, 64), r"seq_len must be a positive int, got 64.0"),
    ((4, 64, 8, True), r"vocab_size must be a positive int, got True"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        mqar(*args)
