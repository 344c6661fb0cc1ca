"""Checkers of notebook 16: right answers pass, each planted mistake is named, stubs are not attempted."""

import math

import pytest
import torch
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb16 as check


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own
RIGHT["old_key_recall"] = check.check_old_key_recall, lambda g: math.exp(g[1:].sum().item())


@pytest.mark.parametrize("wrong, message", [
    (lambda g: math.exp(g.sum().item()), "gate of step 0 acts before"),
    (lambda g: g[1:].sum().item(), "log-decay"),
    (lambda g: math.exp(g[-1].item()), "not only the last one"),
    (lambda g: 1.0, "should be"),
])
def test_old_key_recall_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_old_key_recall(wrong)


def chunked(q, k, v, beta, C, *, use_beta=True, lower=True, carry=True, diagonal=True, last_chunk=True):
    """A learner's chunked delta rule, written out again here (not the checker's), with planted mistakes."""
    T, dk = k.shape
    S = torch.zeros(dk, v.shape[-1], dtype=v.dtype)
    b_all = beta if use_beta else torch.ones_like(beta)
    outs = []
    starts = range(0, T, C) if last_chunk else range(0, T - T % C or T, C)
    for t0 in starts:
        Q, K, V, b = q[t0:t0 + C], k[t0:t0 + C], v[t0:t0 + C], b_all[t0:t0 + C]
        A = b[:, None] * (K @ K.T)
        A = A.tril(-1) if lower else A.triu(1)
        eye = torch.eye(len(b), dtype=v.dtype)
        S0 = S if carry else torch.zeros_like(S)
        U = torch.linalg.solve_triangular(eye + A, b[:, None] * (V - K @ S0), upper=not lower)
        O = Q @ S0 + (Q @ K.T).tril(0 if diagonal else -1) @ U
        outs.append(O / math.sqrt(dk))
        S = S0 + K.T @ U
    o = torch.cat(outs)
    return o if last_chunk else torch.cat([o, torch.zeros(T - len(o), v.shape[-1], dtype=v.dtype)])


RIGHT["chunked_delta_rule"] = check.check_chunked_delta_rule, chunked


@pytest.mark.parametrize("wrong, message", [
    (lambda *a: chunked(*a, use_beta=False), "beta is missing"),
    (lambda *a: chunked(*a, lower=False), "wrong triangle"),
    (lambda *a: chunked(*a, carry=False), "carry is not applied"),
    (lambda *a: chunked(*a, diagonal=False), "reads its own correction"),
    (lambda *a: chunked(*a, last_chunk=False), "the last, shorter chunk is wrong"),
    (lambda q, k, v, beta, C: torch.zeros(q.shape[0], v.shape[-1], dtype=v.dtype), "does not equal the token loop"),
    (lambda q, k, v, beta, C: torch.zeros(q.shape[0], q.shape[1], dtype=v.dtype), r"shape \(11, 3\)"),
])
def test_chunked_delta_rule_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_chunked_delta_rule(wrong)


def test_the_planted_mistakes_differ_from_the_loop():
    """Each mistake the checker names gives outputs away from the loop on its inputs (else it could not be seen)."""
    q, k, v, beta = check._chunk_inputs()
    loop = chunked(q, k, v, beta, 1)
    for C in (3, 4):
        torch.testing.assert_close(chunked(q, k, v, beta, C), loop)
        for wrong in ("use_beta", "lower", "carry", "diagonal"):
            assert (chunked(q, k, v, beta, C, **{wrong: False}) - loop).abs().max() > 1e-3, wrong


RIGHT["seen_value_floor"] = check.check_floor, lambda n, V: (1 + (n - 1) / (V // 2)) / n


@pytest.mark.parametrize("wrong, message", [
    (lambda n, V: 1 / n, "drawn with replacement"),
    (lambda n, V: (1 + (n - 1) / V) / n, "upper half"),
    (lambda n, V: (1 + n / (V // 2)) / n, "off by one"),
    (lambda n, V: 2 / V, "should be"),
])
def test_floor_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_floor(wrong)


def crossover(preset, nbytes):
    state = preset.n_layers * preset.n_heads * preset.head_dim ** 2 * nbytes
    per_token = 2 * preset.n_layers * preset.n_kv_heads * preset.head_dim * nbytes
    return state // per_token + 1


RIGHT["crossover_length"] = check.check_crossover_length, crossover


@pytest.mark.parametrize("wrong, message", [
    (lambda p, b: crossover(p, b) - 1, "off by one"),
    (lambda p, b: p.head_dim // 2 + 1, "shares its K/V heads"),
    (lambda p, b: p.n_heads * p.head_dim // p.n_kv_heads + 1, "a key AND a value"),
    (lambda p, b: 3, "should be"),
])
def test_crossover_length_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_crossover_length(wrong)


def test_crossover_covers_grouped_query_models():
    names = check.CROSSOVER_PRESETS
    assert "Llama-2-7B" in names and "Llama-3-8B" in names and "DeepSeek-V2" not in names
    assert crossover(check.PRESETS["Llama-3-8B"], 2) == 32 * 128 // (2 * 8) + 1


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
