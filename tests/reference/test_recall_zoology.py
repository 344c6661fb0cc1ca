"""MQAR in Zoology's form (``mqar(..., style="zoology")``): every property its docstring states, and the
query slots against Zoology's own sampler (``zoology/data/multiquery_ar.py``, re-typed here in numpy)."""

import numpy as np
import pytest
import torch

from selfattn_lite.recall import IGNORE_INDEX, key_range, mqar, value_range, zoology_query_weights


def zoology_rows(batch, seq_len, n_pairs, vocab_size, seed):
    return mqar(batch, seq_len, n_pairs, vocab_size, generator=torch.Generator().manual_seed(seed), style="zoology")


@pytest.mark.parametrize("batch, seq_len, n_pairs, vocab_size", [(64, 64, 8, 128), (32, 64, 16, 128),
                                                                  (16, 30, 3, 40), (8, 10, 1, 12)])
def test_zoology_rows_have_every_stated_property(batch, seq_len, n_pairs, vocab_size):
    inputs, targets = zoology_rows(batch, seq_len, n_pairs, vocab_size, seed=3)
    assert inputs.shape == targets.shape == (batch, seq_len) and inputs.dtype == targets.dtype == torch.long
    context = 2 * n_pairs
    keys, values = inputs[:, 0:context:2], inputs[:, 1:context:2]
    for b in range(batch):
        assert len(set(keys[b].tolist())) == n_pairs, "keys distinct within a row"
        assert len(set(values[b].tolist())) == n_pairs, "values distinct within a row (without replacement)"
        assert all(k in key_range(vocab_size) for k in keys[b].tolist())
        assert all(v in value_range(vocab_size) for v in values[b].tolist())
        answer = dict(zip(keys[b].tolist(), values[b].tolist()))
        asked = (targets[b] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert sorted(inputs[b, asked].tolist()) == sorted(answer), "each key queried exactly once"
        for t in asked:
            assert t >= context and (t - context) % 2 == 0, "a query sits in the first place of a slot"
            assert targets[b, t].item() == answer[inputs[b, t].item()], "target = the value of that key"
    assert ((0 <= inputs) & (inputs < vocab_size)).all()


def test_gaps_hold_random_tokens_of_the_whole_vocabulary_not_a_filler():
    vocab = 128
    inputs, targets = zoology_rows(2000, 64, 8, vocab, seed=4)
    gap = torch.ones_like(inputs, dtype=torch.bool)
    gap[:, :16] = False                                     # the pairs
    gap &= targets == IGNORE_INDEX                          # not a query
    tokens = inputs[gap]
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = tokens.numel() / vocab
    assert (counts > 0).all(), "every token of the vocabulary appears in the gaps"
    assert (counts - expected).abs().max() < 6 * expected ** 0.5, "uniform over the vocabulary"
    assert counts[0] < 2 * expected, "0 is no filler"
    # the token after a query is random too: equal to the queried key's value only by chance (about 1 / vocab)
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    after = cols + 1 < 64
    repeat = (inputs[rows[after], cols[after] + 1] == targets[rows[after], cols[after]]).double().mean().item()
    assert repeat < 3 / vocab


def test_query_weights_are_zoologys_power_law():
    p = zoology_query_weights(24, 0.01)
    j = torch.arange(1, 25, dtype=torch.float64)
    torch.testing.assert_close(p, j ** -0.99 / (j ** -0.99).sum())
    torch.testing.assert_close(zoology_query_weights(5, 1.0), torch.full((5,), 0.2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"power_a must be in \(0, inf\)"):
        zoology_query_weights(5, 0.0)


def slot_frequencies(slots, n_slots):
    return np.bincount(np.asarray(slots).ravel(), minlength=n_slots) / len(slots)


def zoologys_slots(rows, n_slots, n_pairs, power_a, seed):
    """``multiquery_ar.py``'s draw of the query gaps, as written there (numpy, without replacement)."""
    rng = np.random.RandomState(seed)
    p = power_a * np.arange(1, n_slots + 1) ** (power_a - 1)
    p = p / p.sum()
    return [rng.choice(np.arange(n_slots), replace=False, p=p, size=n_pairs) for _ in range(rows)]


@pytest.mark.parametrize("n_pairs, power_a", [(1, 0.01), (4, 0.01), (8, 0.01), (4, 1.0)])
def test_query_slots_follow_zoologys_distribution(n_pairs, power_a):
    rows, seq_len, vocab = 20000, 64, 128
    n_slots = (seq_len - 2 * n_pairs) // 2
    inputs, targets = mqar(rows, seq_len, n_pairs, vocab, generator=torch.Generator().manual_seed(5),
                           style="zoology", power_a=power_a)
    slots = ((targets != IGNORE_INDEX).nonzero()[:, 1] - 2 * n_pairs) // 2
    ours = slot_frequencies(slots.view(rows, n_pairs).numpy(), n_slots)      # expected queries per slot
    theirs = slot_frequencies(zoologys_slots(rows, n_slots, n_pairs, power_a, seed=6), n_slots)
    assert np.abs(ours - theirs).max() < 0.02, (ours.round(3), theirs.round(3))
    if n_pairs == 1:                                   # one query: its slot is drawn from p itself
        assert np.abs(ours - zoology_query_weights(n_slots, power_a).numpy()).max() < 0.01
    # the first key takes the first draw, as in Zoology: its slot alone follows p when n_pairs > 1 too
    first_key = inputs[:, 0:1]
    first_slot = ((inputs[:, 2 * n_pairs:] == first_key) & (targets[:, 2 * n_pairs:] != IGNORE_INDEX)).int().argmax(1)
    p = zoology_query_weights(n_slots, power_a).numpy()
    assert np.abs(slot_frequencies(first_slot.numpy() // 2, n_slots) - p).max() < 0.015


def test_power_law_puts_most_queries_near_the_pairs():
    _, targets = zoology_rows(4000, 64, 4, 128, seed=7)
    slots = ((targets != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2
    assert (slots < 7).double().mean() > 0.5, "with power_a = 0.01 most queries sit in the first quarter"


def test_the_notebook_style_is_the_default_and_bad_styles_are_named():
    a = mqar(4, 32, 4, 64, generator=torch.Generator().manual_seed(0))
    b = mqar(4, 32, 4, 64, generator=torch.Generator().manual_seed(0), style="notebook")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="style must be one of"):
        mqar(4, 32, 4, 64, style="zoo")
