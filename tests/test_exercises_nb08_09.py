"""Checkers of notebooks 08 and 09: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F

from selfattn_lite.exercises import ExerciseError, nb08, nb09


def stub(*args, **kwargs):
    raise NotImplementedError


def expect_error(check, fn, fragment):
    with pytest.raises(ExerciseError) as info:
        check(fn)
    assert fragment in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- nb08: merge_stats

def merge_right(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m)


def test_merge_stats_right_and_not_attempted(capsys):
    nb08.check_merge_stats(merge_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb08.check_merge_stats(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 + l2), "l = l1 + l2"),
    (lambda m1, l1, m2, l2: (torch.minimum(m1, m2), l1 + l2), "smaller of the two maxima"),
    (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 * torch.exp(m1 - torch.maximum(m1, m2)) + l2), "*both*"),
    (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 * torch.exp(torch.maximum(m1, m2) - m1)
                             + l2 * torch.exp(torch.maximum(m1, m2) - m2)), "upside down"),
    (lambda m1, l1, m2, l2: (m1, l1), "max of the whole row"),
    (lambda m1, l1, m2, l2: torch.maximum(m1, m2), "pair (m, l)"),
])
def test_merge_stats_diagnoses(wrong, fragment):
    expect_error(nb08.check_merge_stats, wrong, fragment)


def test_merge_stats_empty_chunk_nan():
    def nan_on_empty(m1, l1, m2, l2):
        m = torch.maximum(m1, m2)
        return m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m) + 0 * m1   # 0 * -inf = NaN
    expect_error(nb08.check_merge_stats, nan_on_empty, "empty chunk")


# ----------------------------------------------------------------------------- nb08: tiles_computed

def tiles_right(n, block, causal):
    t = math.ceil(n / block)
    return t * (t + 1) // 2 if causal else t * t


def test_tile_count_right_and_not_attempted(capsys):
    nb08.check_tile_count(tiles_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb08.check_tile_count(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda n, b, c: math.ceil(n / b) ** 2, "counted every tile"),
    (lambda n, b, c: (n // b) * (n // b + 1) // 2 if c else (n // b) ** 2, "partial tile is missing"),
    (lambda n, b, c: math.ceil(n / b) * (math.ceil(n / b) - 1) // 2 if c else math.ceil(n / b) ** 2,
     "diagonal tiles"),
    (lambda n, b, c: n * n // (b * b) + 7, "expected"),
])
def test_tile_count_diagnoses(wrong, fragment):
    expect_error(nb08.check_tile_count, wrong, fragment)


# ----------------------------------------------------------------------------- nb08: window_mask

def window_right(n, w):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (i - j < w)


def test_window_mask_right_and_not_attempted(capsys):
    nb08.check_window_mask(window_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb08.check_window_mask(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda n, w: ~window_right(n, w), "polarity"),
    (lambda n, w: window_right(n, w + 1), "window + 1 keys"),
    (lambda n, w: window_right(n, w - 1), "window - 1 keys"),
    (lambda n, w: (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() < w, "looks ahead"),
    (lambda n, w: torch.ones(n, n, dtype=torch.bool).tril(), "plain causal"),
    (lambda n, w: window_right(n, w).int(), "bool"),
    (lambda n, w: window_right(7, 3), "window_mask(12, 5)"),
    (lambda n, w: window_right(n, w)[:, :-1], "shape"),
])
def test_window_mask_diagnoses(wrong, fragment):
    expect_error(nb08.check_window_mask, wrong, fragment)


# ----------------------------------------------------------------------------- nb08: linear_attn

def phi(x):
    return F.elu(x) + 1


def linear_right(q, k, v):
    kv = phi(k).transpose(-2, -1) @ v
    return (phi(q) @ kv) / (phi(q) @ phi(k).sum(-2).unsqueeze(-1))


def test_linear_attention_right_and_not_attempted(capsys):
    nb08.check_linear_attention(linear_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb08.check_linear_attention(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "softmax attention"),
    (lambda q, k, v: phi(q) @ (phi(k).transpose(-2, -1) @ v), "normaliser is missing"),
    (lambda q, k, v: (torch.relu(q) @ (torch.relu(k).transpose(-2, -1) @ v))
     / (torch.relu(q) @ torch.relu(k).sum(-2).unsqueeze(-1) + 1e-6), "relu"),
    (lambda q, k, v: phi(q) @ (phi(k).transpose(-2, -1) @ v) / phi(q).sum(-1, keepdim=True), "dot product"),
    (lambda q, k, v: linear_right(q, k, v)[:, :, :2], "shape"),
    (lambda q, k, v: linear_right(q, k, v) * 1.1, "expected"),
])
def test_linear_attention_diagnoses(wrong, fragment):
    expect_error(nb08.check_linear_attention, wrong, fragment)


# ----------------------------------------------------------------------------- nb09: merge_heads

def merge_heads_right(out):
    B, h, T, dk = out.shape
    return out.transpose(1, 2).reshape(B, T, h * dk)


def test_merge_heads_right_and_not_attempted(capsys):
    nb09.check_merge_heads(merge_heads_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb09.check_merge_heads(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda out: out.transpose(1, 2).view(out.shape[0], out.shape[2], -1), "`.view` after `.transpose`"),
    (lambda out: out.reshape(out.shape[0], out.shape[2], -1), "without transposing"),
    (lambda out: out.permute(0, 2, 3, 1).reshape(out.shape[0], out.shape[2], -1), "(dk, h)"),
    (lambda out: out.transpose(1, 2), "shape"),
    (lambda out: merge_heads_right(out).flip(1), "row 1 of batch 0"),
])
def test_merge_heads_diagnoses(wrong, fragment):
    expect_error(nb09.check_merge_heads, wrong, fragment)


# ----------------------------------------------------------------------------- nb09: decode_mask

def test_decode_mask_right_and_not_attempted(capsys):
    nb09.check_decode_mask(lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L))
    assert capsys.readouterr().out.startswith("Correct")
    nb09.check_decode_mask(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(), "top-left"),
    (lambda L, S: ~torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L), "polarity"),
    (lambda L, S: torch.ones(L, S, dtype=torch.bool), "no key is masked"),
    (lambda L, S: torch.ones(L, S).tril(diagonal=S - L), "bool"),
    (lambda L, S: torch.ones(S, S, dtype=torch.bool).tril(), "shape"),
    (lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L - 1), "expected row 0"),
    (lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(diagonal=4) if (L, S) == (3, 7)
     else torch.zeros(L, S, dtype=torch.bool), "L = 1"),
])
def test_decode_mask_diagnoses(wrong, fragment):
    expect_error(nb09.check_decode_mask, wrong, fragment)


# ----------------------------------------------------------------------------- nb09: expand_kv

def test_expand_kv_right_and_not_attempted(capsys):
    nb09.check_expand_kv(lambda k, n: k.repeat_interleave(n // k.shape[1], dim=1))
    assert capsys.readouterr().out.startswith("Correct")
    nb09.check_expand_kv(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda k, n: k.repeat(1, n // k.shape[1], 1, 1), "`.repeat` tiles"),
    (lambda k, n: k.repeat_interleave(n // k.shape[1], dim=2), "shape"),
    (lambda k, n: k.repeat_interleave(n // k.shape[1], dim=1).flip(1), "query heads 0, 1, 2"),
])
def test_expand_kv_diagnoses(wrong, fragment):
    expect_error(nb09.check_expand_kv, wrong, fragment)


# ----------------------------------------------------------------------------- nb09: masked_weights

def masked_right(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.masked_fill(~mask.any(-1, keepdim=True), 0.0)


def test_masked_weights_right_and_not_attempted(capsys):
    nb09.check_masked_weights(masked_right)
    assert capsys.readouterr().out.startswith("Correct")
    nb09.check_masked_weights(stub)
    assert capsys.readouterr().out.startswith("Not attempted")


@pytest.mark.parametrize("wrong,fragment", [
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1), "NaN"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, torch.finfo(s.dtype).min), dim=-1), "uniform"),
    (lambda s, m: masked_right(s, ~m), "polarity"),
    (lambda s, m: masked_right(s, m).transpose(-1, -2).contiguous().transpose(-1, -2) * 0.5, "rows with allowed"),
    (lambda s, m: masked_right(s, m)[..., :3], "shape"),
])
def test_masked_weights_diagnoses(wrong, fragment):
    expect_error(nb09.check_masked_weights, wrong, fragment)
