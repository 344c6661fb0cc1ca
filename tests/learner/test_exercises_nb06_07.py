"""The checkers of notebooks 06 and 07 accept right answers and diagnose typical wrong ones."""

import math

import pytest
import torch
from helpers import expect_correct, expect_not_attempted, right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError, nb06, nb07
from selfattn_lite.models import DecoderConfig, TinyDecoder
from selfattn_lite.presets import get_preset


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ---------------------------------------------------------------- nb06: cache size
def good_bytes(layers, heads, dim, tokens, batch, nbytes):
    return 2 * layers * heads * dim * tokens * batch * nbytes


RIGHT["kv_cache_bytes"] = nb06.check_kv_cache_bytes, good_bytes


@pytest.mark.parametrize("wrong, match", [
    (lambda L, h, d, t, b, n: L * h * d * t * b * n, "keys AND values"),
    (lambda L, h, d, t, b, n: 16 * L * h * d * t * b * n, "bits"),
    (lambda L, h, d, t, b, n: 2 * h * d * t * b * n, "n_layers"),
    (lambda L, h, d, t, b, n: 2 * L * h * d * t * n, "batch"),
    (lambda L, h, d, t, b, n: 2 * L * h * d * t * b, "bytes_per_value"),
    (lambda L, h, d, t, b, n: 2 * L * h * d * b * n, "n_tokens"),
    (lambda L, h, d, t, b, n: 2 * L * h * h * t * b * n, "the formula is"),
    (lambda L, h, d, t, b, n: "lots", "return a number"),
])
def test_kv_bytes_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_kv_cache_bytes(wrong)


# ---------------------------------------------------------------- nb06: one cached step
def _attend(q, k, v, scale=True):
    s = q @ k.transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v


def good_step(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return _attend(q, k_all, v_all), k_all, v_all


def _past_only(q, kn, vn, kc, vc):
    return _attend(q, kc, vc), torch.cat([kc, kn], -2), torch.cat([vc, vn], -2)


def _unscaled(q, kn, vn, kc, vc):
    k, v = torch.cat([kc, kn], -2), torch.cat([vc, vn], -2)
    return _attend(q, k, v, scale=False), k, v


def _prepended(q, kn, vn, kc, vc):
    k, v = torch.cat([kn, kc], -2), torch.cat([vn, vc], -2)
    return _attend(q, k, v), k, v


def _new_only(q, kn, vn, kc, vc):
    return _attend(q, kn, vn), kn, vn


def _not_appended(q, kn, vn, kc, vc):
    return _attend(q, kc, vc), kc, vc


def _softmax_wrong_dim(q, kn, vn, kc, vc):
    k, v = torch.cat([kc, kn], -2), torch.cat([vc, vn], -2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return w @ v, k, v


RIGHT["cached_attention"] = nb06.check_cached_attention, good_step


@pytest.mark.parametrize("wrong, match", [
    (_past_only, "cached keys only"),
    (_unscaled, "sqrt"),
    (_prepended, "new key first"),
    (_new_only, r"got \(2, 3, 1, 8\): append the new key"),
    (_not_appended, r"got \(2, 3, 5, 8\): append the new key"),
    (_softmax_wrong_dim, "differs from softmax"),
    (lambda *a: a[0], "triple"),
])
def test_cached_attention_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_cached_attention(wrong)


# ---------------------------------------------------------------- nb06: the decoding loop
@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyDecoder(DecoderConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, max_len=64)).eval()


@torch.no_grad()
def good_generate(model, ids, n):
    caches = model.new_caches(ids.shape[0], ids.shape[1] + n)
    logits = model(ids, caches=caches)
    for step in range(n):
        next_id = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], 1)
        if step < n - 1:
            logits = model(next_id, caches=caches)
    return ids


@torch.no_grad()
def uncached_generate(model, ids, n):
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@torch.no_grad()
def whole_sequence_into_cache(model, ids, n):
    caches = model.new_caches(1, ids.shape[1] + n)
    for _ in range(n):
        ids = torch.cat([ids, model(ids, caches=caches)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@torch.no_grad()
def first_position(model, ids, n):
    caches = model.new_caches(1, ids.shape[1] + n)
    logits = model(ids, caches=caches)
    for step in range(n):
        next_id = logits[:, 0].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], 1)
        if step < n - 1:
            logits = model(next_id, caches=caches)
    return ids


def test_generate_checker_accepts_and_skips(capsys, model):
    expect_correct(nb06.check_generate, good_generate, capsys, model)
    expect_not_attempted(nb06.check_generate, stub, capsys, model)
    assert not model._forward_pre_hooks  # the counting hook is removed


@pytest.mark.parametrize("wrong, match", [
    (uncached_generate, r"ran on \d+ tokens; with a cache it needs 21"),
    (whole_sequence_into_cache, "cache overflowed"),
    (first_position, "LAST position"),
    (lambda m, ids, n: ids, r"expected shape \(1, 22\)"),
])
def test_generate_checker_diagnoses(wrong, match, model):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_generate(wrong, model)
    assert not model._forward_pre_hooks


# ---------------------------------------------------------------- nb07
def good_expand(k, h):
    B, n_kv, S, dk = k.shape
    return k[:, :, None].expand(B, n_kv, h // n_kv, S, dk).reshape(B, h, S, dk)


def interleave_expand(k, h):
    return k.repeat_interleave(h // k.shape[1], dim=1)


def group_first_expand(k, h):
    B, n_kv, S, dk = k.shape
    return k[:, None].expand(B, h // n_kv, n_kv, S, dk).reshape(B, h, S, dk)


RIGHT["expand_kv"] = nb07.check_expand_kv, good_expand


@pytest.mark.parametrize("wrong, match", [
    (lambda k, h: k.repeat(1, h // k.shape[1], 1, 1), "tiled"),
    (group_first_expand, "after it"),
    (interleave_expand, "write it as a view"),
    (lambda k, h: k.repeat_interleave(h // k.shape[1], dim=2), r"expected shape \(2, 8, 5, 4\)"),
    (lambda k, h: k.repeat_interleave(h // k.shape[1], dim=1).flip(1), "right order"),
])
def test_expand_kv_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb07.check_expand_kv(wrong)


def good_pool(w, h, kv):
    return w.view(kv, h // kv, -1, w.shape[-1]).mean(1).reshape(-1, w.shape[-1])


RIGHT["mean_pool"] = nb07.check_mean_pool, good_pool


@pytest.mark.parametrize("wrong, match", [
    (lambda w, h, kv: w.view(h // kv, kv, -1, w.shape[-1]).mean(0).reshape(-1, w.shape[-1]), "strided"),
    (lambda w, h, kv: w.view(kv, h // kv, -1, w.shape[-1]).sum(1).reshape(-1, w.shape[-1]), "summed"),
    (lambda w, h, kv: w.view(kv, h // kv, -1, w.shape[-1])[:, 0].reshape(-1, w.shape[-1]), "first head"),
    (lambda w, h, kv: w.view(h, -1, w.shape[-1]).mean(1), r"expected shape \(6, 5\)"),
    (lambda w, h, kv: good_pool(w, h, kv) + 1, "per-group mean"),
])
def test_mean_pool_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb07.check_mean_pool(wrong)


# ----------------------------------------------------------------------------- nb07: plans_that_fit

def plans_that_fit(name, batch, seq_len, gpu_bytes, weight_bytes_per_value):
    p = get_preset(name)
    kv_options = [h for h in range(1, p.n_kv_heads + 1) if p.n_heads % h == 0]    # GQA: divisors of n_heads
    weights = p.weight_bytes(weight_bytes_per_value)
    return {(h, b) for h in kv_options for b in (2, 1, 0.5)                        # bf16, 8-bit, 4-bit cache
            if weights + p.kv_bytes(seq_len, batch, b, n_kv_heads=h) <= gpu_bytes}


RIGHT["serving_plans"] = nb07.check_serving_plans, plans_that_fit


def plans_variant(**flags):
    def plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value):
        return nb07._plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value, **flags)
    return plans


@pytest.mark.parametrize("wrong, fragment", [
    (plans_variant(weights=False), "the weights need memory too"),
    (plans_variant(kv_factor=0.5), "keys AND values"),
    (plans_variant(batch_factor=False), "multiply by the batch"),
    (plans_variant(kv_options=lambda p: [p.n_kv_heads]), "try every K/V head count"),
    (plans_variant(kv_options=lambda p: [h for h in (1, 2, 4, 8, 16) if p.n_heads % h == 0]), "must divide n_heads"),
    (lambda *case: {(1, 2)}, "expected"),
    (lambda *case: 3, "a set (or list) of pairs"),
])
def test_serving_plans_diagnoses(wrong, fragment):
    with pytest.raises(ExerciseError, match=None) as info:
        nb07.check_serving_plans(wrong)
    assert fragment in str(info.value), str(info.value)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
