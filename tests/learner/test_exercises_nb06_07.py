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


# ---------------------------------------------------------------- nb06: attention through a block table
def good_paged(q, k_pool, v_pool, table, n):
    idx = torch.tensor(table)
    k = k_pool[idx].transpose(0, 1).flatten(1, 2)[:, :n]          # (h, n, dk)
    v = v_pool[idx].transpose(0, 1).flatten(1, 2)[:, :n]
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def good_paged_loop(q, k_pool, v_pool, table, n):                 # token by token through the table
    block = k_pool.shape[2]
    k = torch.stack([k_pool[table[i // block], :, i % block] for i in range(n)], dim=1)   # (h, n, dk)
    v = torch.stack([v_pool[table[i // block], :, i % block] for i in range(n)], dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


RIGHT["paged_decode"] = nb06.check_paged_decode, good_paged
RIGHT["paged_decode (token by token, torch SDPA)"] = nb06.check_paged_decode, good_paged_loop


def _paged_heads_mixed(q, k_pool, v_pool, table, n):
    idx = torch.tensor(table)
    k = k_pool[idx].reshape(k_pool.shape[1], -1, k_pool.shape[-1])[:, :n]
    v = v_pool[idx].reshape(v_pool.shape[1], -1, v_pool.shape[-1])[:, :n]
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.mark.parametrize("wrong, match", [
    (lambda q, k, v, t, n: good_paged(q, k, v, sorted(t), n), "pool order"),
    (lambda q, k, v, t, n: good_paged(q, k, v, list(range(len(t))), n), "not the first blocks of the pool"),
    (lambda q, k, v, t, n: good_paged(q, k, v, t, len(t) * k.shape[2]), "only partly filled"),
    (_paged_heads_mixed, "move the heads first"),
    (lambda q, k, v, t, n: good_paged(q * math.sqrt(q.shape[-1]), k, v, t, n), r"sqrt\(d_k\)"),
    (lambda q, k, v, t, n: good_paged(q, k, v, t, n)[:, :, :4], "shape"),
])
def test_paged_decode_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_paged_decode(wrong)


# ---------------------------------------------------------------- nb06: int8 quantisation
def good_quantize(x):
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale).to(torch.int8), scale


def good_quantize_multiplied(x):                         # x * (127 / absmax): the same up to rounding ties
    inv = 127 / x.abs().amax(dim=-1, keepdim=True)
    return torch.round(x * inv).clamp(-127, 127).to(torch.int8), 1 / inv


RIGHT["quantize_int8"] = nb06.check_quantize_int8, good_quantize
RIGHT["quantize_int8 (multiplied)"] = nb06.check_quantize_int8, good_quantize_multiplied


def _quantize_with(scale_of, to_int=lambda y: torch.round(y).to(torch.int8)):
    def fn(x):
        scale = scale_of(x)
        return to_int(x / scale), scale
    return fn


@pytest.mark.parametrize("wrong, match", [
    (_quantize_with(lambda x: x.amax(-1, keepdim=True) / 127), r"max of x, not of \|x\|"),
    (_quantize_with(lambda x: x.abs().amax(-1, keepdim=True) / 255), "unsigned range"),
    (_quantize_with(lambda x: x.abs().amax(-1, keepdim=True) / 128), "one past int8's"),
    (_quantize_with(lambda x: x.abs().amax(-1, keepdim=True)), "only -1, 0 or 1"),
    (_quantize_with(lambda x: x.abs().max() / 127), "one scale for the whole tensor"),
    (_quantize_with(lambda x: x.abs().amax(-1, keepdim=True) / 127,
                    to_int=lambda y: y.to(torch.int8)), "truncates toward zero"),
    (lambda x: (torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)), x.abs().amax(-1, keepdim=True) / 127),
     "store it as int8"),
    (lambda x: (torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)).to(torch.int8), x.abs().amax(-1) / 127),
     "keep the last dim"),
    (lambda x: good_quantize(x)[0], "pair"),
])
def test_quantize_int8_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_quantize_int8(wrong)


# ---------------------------------------------------------------- nb06: new tokens after a cache
def _bottom_right(m, s):
    return torch.arange(s)[None, :] <= torch.arange(m)[:, None] + (s - m)


def _attend(q, k, v, scale=True, mask=None):
    s = q @ k.transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def good_step(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return _attend(q, k_all, v_all, mask=_bottom_right(q.shape[-2], k_all.shape[-2])), k_all, v_all


def good_step_torch(q, k_new, v_new, k_cache, v_cache):     # torch's own lower-right bias
    from torch.nn.attention.bias import causal_lower_right
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    bias = causal_lower_right(q.shape[-2], k_all.shape[-2])
    return torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, attn_mask=bias), k_all, v_all


def _with_mask(mask_of, scale=True):
    def fn(q, kn, vn, kc, vc):
        k, v = torch.cat([kc, kn], -2), torch.cat([vc, vn], -2)
        return _attend(q, k, v, scale=scale, mask=mask_of(q.shape[-2], k.shape[-2])), k, v
    return fn


def _past_only(q, kn, vn, kc, vc):
    return _attend(q, kc, vc), torch.cat([kc, kn], -2), torch.cat([vc, vn], -2)


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
RIGHT["cached_attention (torch causal_lower_right)"] = nb06.check_cached_attention, good_step_torch


@pytest.mark.parametrize("wrong, match", [
    (_with_mask(lambda m, s: torch.ones(m, s, dtype=torch.bool)), "sees the new tokens after it"),
    (_with_mask(lambda m, s: torch.ones(m, s, dtype=torch.bool).tril()), "aligned top-left"),
    (_with_mask(_bottom_right, scale=False), "sqrt"),
    (_past_only, "cached keys only"),
    (_prepended, "new keys first"),
    (_new_only, r"got \(2, 3, 3, 8\): append the new keys"),
    (_not_appended, r"got \(2, 3, 5, 8\): append the new keys"),
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


@torch.no_grad()
def natural_generate(model, ids, n):                      # also runs the last token: T + n, accepted
    caches = model.new_caches(1, ids.shape[1] + n)
    logits = model(ids, caches=caches)
    for _ in range(n):
        next_id = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], 1)
        logits = model(next_id, caches=caches)
    return ids


def delegate(model, ids, n):
    return model.generate(ids, n)


def delegate_quietly(model, ids, n):
    try:
        return model.generate(ids, n)
    except Exception:
        return type(model).generate(model, ids, n)


def test_generate_checker_accepts_and_skips(capsys, model):
    expect_correct(nb06.check_generate, good_generate, capsys, model)
    expect_correct(nb06.check_generate, natural_generate, capsys, model)
    expect_not_attempted(nb06.check_generate, stub, capsys, model)
    assert not model._forward_pre_hooks  # the counting hook is removed
    assert "generate" not in vars(model) and torch.equal(model.generate(torch.tensor([[1, 2]]), 2)[:, :2],
                                                         torch.tensor([[1, 2]]))   # the method is back


@pytest.mark.parametrize("wrong, match", [
    (uncached_generate, r"ran on \d+ tokens; with a cache it needs 21 .*re-ran earlier tokens"),
    (delegate, "you called model.generate"),
    (delegate_quietly, "you called model.generate"),
    (whole_sequence_into_cache, "cache overflowed"),
    (first_position, "LAST position"),
    (lambda m, ids, n: ids, r"expected shape \(1, 22\)"),
])
def test_generate_checker_diagnoses(wrong, match, model):
    with pytest.raises(ExerciseError, match=match):
        nb06.check_generate(wrong, model)
    assert not model._forward_pre_hooks and "generate" not in vars(model)


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


# ----------------------------------------------------------------------------- nb07: gqa_attention
def good_gqa(q, k, v):
    B, h, L, dk = q.shape
    q_groups = q.reshape(B, k.shape[1], -1, dk)                        # (B, h_kv, g * L, dk), a view
    w = torch.softmax(q_groups @ k.transpose(-2, -1) / math.sqrt(dk), dim=-1)
    return (w @ v).reshape(B, h, L, dk)


def copying_gqa(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def broadcasting_gqa(q, k, v):                                         # matmul expands k[:, :, None]: a copy
    B, h, L, dk = q.shape
    q5 = q.view(B, k.shape[1], -1, L, dk)
    w = torch.softmax(q5 @ k[:, :, None].transpose(-2, -1) / math.sqrt(dk), dim=-1)
    return (w @ v[:, :, None]).reshape(B, h, L, dk)


def tiled_gqa(q, k, v):                                                # heads i and i + h_kv share, wrongly
    B, h, L, dk = q.shape
    q_t = q.view(B, -1, k.shape[1], L, dk).transpose(1, 2).reshape(B, k.shape[1], -1, dk)
    w = torch.softmax(q_t @ k.transpose(-2, -1) / math.sqrt(dk), dim=-1)
    return (w @ v).view(B, k.shape[1], -1, L, dk).transpose(1, 2).reshape(B, h, L, dk)


def unscaled_gqa(q, k, v):
    B, h, L, dk = q.shape
    w = torch.softmax(q.reshape(B, k.shape[1], -1, dk) @ k.transpose(-2, -1), dim=-1)
    return (w @ v).reshape(B, h, L, dk)


def fused_gqa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


RIGHT["gqa_attention"] = nb07.check_gqa_attention, good_gqa


def test_gqa_attention_right_answer_passes_the_memory_check(capsys):
    from selfattn_lite.course import memory
    out = expect_correct(nb07.check_gqa_attention, good_gqa, capsys, memory.peak_memory)
    assert "under half of one expanded K" in out


@pytest.mark.parametrize("wrong, match", [
    (tiled_gqa, "wrong K/V heads"),
    (unscaled_gqa, "not scaled"),
    (fused_gqa, "fused kernel"),
    (lambda q, k, v: good_gqa(q, k, v)[:, :, :1], r"expected shape \(2, 8, 3, 4\)"),
    (lambda q, k, v: good_gqa(q, k, v) + 1, "not SDPA"),
])
def test_gqa_attention_checker_diagnoses(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        nb07.check_gqa_attention(wrong)


@pytest.mark.parametrize("wrong", [copying_gqa, broadcasting_gqa])
def test_gqa_attention_checker_catches_the_copy(wrong):
    from selfattn_lite.course import memory
    nb07.check_gqa_attention(wrong)                                     # right values ...
    with pytest.raises(ExerciseError, match="K or V is copied"):        # ... but K or V copied to 8 heads
        nb07.check_gqa_attention(wrong, memory.peak_memory)


# ----------------------------------------------------------------------------- nb07: plans_that_fit

def plans_that_fit(name, batch, seq_len, gpu_bytes, weight_bytes_per_value):
    p = get_preset(name)
    kv_options = [h for h in range(1, p.n_kv_heads + 1) if p.n_kv_heads % h == 0]  # pool whole K/V heads
    weights = p.weight_bytes(weight_bytes_per_value)
    return {(h, b) for h in kv_options for b in (2, 1, 0.5)                        # bf16, 8-bit, 4-bit cache
            if weights + p.kv_bytes(seq_len, batch, b, n_kv_heads=h) <= gpu_bytes}


RIGHT["serving_plans"] = nb07.check_serving_plans, plans_that_fit


def plans_variant(**flags):
    def plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value):
        return nb07._plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value, **flags)
    return plans


def test_serving_plans_accepts_the_n_heads_divisor_rule(capsys):
    """Divisors of n_heads up to n_kv_heads are the divisors of n_kv_heads for every model the checker uses."""
    def plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value):
        return nb07._plans(name, batch, seq_len, gpu_bytes, weight_bytes_per_value,
                           kv_options=lambda p: [h for h in range(1, p.n_kv_heads + 1) if p.n_heads % h == 0])
    nb07.check_serving_plans(plans)
    assert "Correct" in capsys.readouterr().out


def test_serving_plans_says_what_the_4bit_scales_do(capsys):
    """The tightest plan's margin and its fate with one 2-byte scale per 128 values, recomputed by hand."""
    nb07.check_serving_plans(plans_that_fit)
    out = capsys.readouterr().out
    layers, kv_heads, head_dim, tokens, batch, n_params = 80, 4, 128, 32768, 32, get_preset("Llama-3-70B").n_params
    cache_values = 2 * layers * kv_heads * head_dim * tokens * batch
    used = n_params * 0.5 + cache_values * 0.5
    scaled = (n_params + cache_values) * (0.5 + 2 / 128)
    assert used <= 80e9 < scaled                                # fits as counted, not with the scales
    assert f"uses {used / 1e9:.1f} of the 80 GB" in out and f"needs {scaled / 1e9:.1f} GB and no longer fits" in out


@pytest.mark.parametrize("wrong, fragment", [
    (plans_variant(weights=False), "the weights need memory too"),
    (plans_variant(kv_factor=0.5), "keys AND values"),
    (plans_variant(batch_factor=False), "multiply by the batch"),
    (plans_variant(kv_options=lambda p: [p.n_kv_heads]), "try every K/V head count"),
    (plans_variant(kv_options=lambda p: [h for h in (1, 2, 4, 8, 16) if p.n_heads % h == 0]),
     "must divide the model's own n_kv_heads"),
    (lambda *case: {(1, 2)}, "expected"),
    (lambda *case: 3, "a set (or list) of pairs"),
])
def test_serving_plans_diagnoses(wrong, fragment):
    with pytest.raises(ExerciseError, match=None) as info:
        nb07.check_serving_plans(wrong)
    assert fragment in str(info.value), str(info.value)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
