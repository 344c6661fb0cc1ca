"""Checkers of notebook 13: right answers pass, each planted mistake is named, stubs are not attempted."""

import pytest
import torch
import torch.nn.functional as F
from helpers import right_and_not_attempted_test

from selfattn_lite.exercises import ExerciseError
from selfattn_lite.exercises import nb13 as check


def stub(*args):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


def _weights(layer):
    return sum(p.numel() for p in layer.parameters())


def _cache(layer, n):
    return n * (layer.kv_lora_rank + layer.qk_rope_head_dim)


def crossover_right(layer, n):
    return _weights(layer) // _cache(layer, n) + 1


RIGHT["crossover_batch"] = check.check_crossover_batch, crossover_right
RIGHT["crossover_batch_loop"] = check.check_crossover_batch, lambda layer, n: next(
    b for b in range(1, 10**7) if b * _cache(layer, n) > _weights(layer))
RIGHT["crossover_batch_tensor"] = check.check_crossover_batch, lambda layer, n: torch.tensor(crossover_right(layer, n))


def _differing(layer):
    return layer.kv_b_proj.weight.numel() + layer.o_proj.weight.numel()       # W^UK, W^UV (kv_b_proj) and W^O


@pytest.mark.parametrize("wrong, message", [
    (lambda layer, n: -(-_weights(layer) // _cache(layer, n)), "equal is not more"),             # ceil: >=
    (lambda layer, n: _weights(layer) // _cache(layer, n), "weights still weigh at least"),     # one short
    (lambda layer, n: _weights(layer) // (n * layer.kv_lora_rank) + 1, "RoPE key is cached too"),
    (lambda layer, n: _weights(layer) // (2 * _cache(layer, n)) + 1, "no separate K and V"),
    (lambda layer, n: _differing(layer) // _cache(layer, n) + 1, "query and latent projections too"),
    (lambda layer, n: _weights(layer) // (n * layer.n_heads * (layer.qk_head_dim + layer.v_head_dim)) + 1,
     "expanded keys and values"),
    (lambda layer, n: sum(p.nbytes for p in layer.parameters()) // _cache(layer, n) + 1, "weights are counted in bytes"),
    (lambda layer, n: _weights(layer) // (4 * _cache(layer, n)) + 1, "cache is counted in bytes"),
    (lambda layer, n: _weights(layer) / _cache(layer, n), "whole number"),
    (lambda layer, n: 1, "the smallest batch is"),
    (lambda layer, n: [crossover_right(layer, n)], "should return an int"),
])
def test_crossover_batch_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_crossover_batch(wrong)


def test_crossover_cases_hold_a_tie_and_a_batch_of_one():
    """The cases the checker tries include an exact tie (where >= and > differ) and a cache that outweighs the
    weights at batch 1, and the DeepSeek-V2 layer's count is its published shapes' (computed by hand)."""
    layers = [(check._crossover_layer(shape), n) for shape, n in check._CROSSOVER_CASES]
    assert any(_weights(layer) % _cache(layer, n) == 0 for layer, n in layers)
    assert any(crossover_right(layer, n) == 1 for layer, n in layers)
    v2, n = layers[-1]
    q = 5120 * 1536 + 1536 + 1536 * 128 * (128 + 64)                  # q_a_proj, q_a_layernorm, q_b_proj
    kv = 5120 * (512 + 64) + 512 + 512 * 128 * (128 + 128)            # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    assert _weights(v2) == q + kv + 128 * 128 * 5120 == 149_227_520 and n == 2048
    assert crossover_right(v2, n) == 127


def test_crossover_message_counts_the_moe_layer_with_its_router(capsys):
    """The pass message's whole-layer batch counts DeepSeek-V2's attention layer, its 162 experts and its router
    (transformers' DeepseekV2TopkRouter: a (160, 5120) weight, no bias), worked out here by hand."""
    check.check_crossover_batch(crossover_right)
    out = capsys.readouterr().out
    attention = 149_227_520
    experts = 162 * 3 * 5120 * 1536                                  # 160 routed + 2 shared, gate, up and down
    router = 160 * 5120
    cache = 2048 * (512 + 64)
    assert (attention + experts + router) // cache + 1 == 3368 != (attention + experts) // cache + 1
    assert "from batch 127 on" in out and "from batch 3,368 on" in out and "router" in out


def cache_positions_right(kept, n_sink):
    return torch.cat([kept[:n_sink], n_sink + kept[n_sink:].argsort().argsort()])


def cache_positions_loop(kept, n_sink):                 # rank by counting the older window keys
    window = kept[n_sink:].tolist()
    return torch.tensor(kept[:n_sink].tolist() + [n_sink + sum(o < p for o in window) for p in window])


RIGHT["cache_positions"] = check.check_cache_positions, cache_positions_right
RIGHT["cache_positions_loop"] = check.check_cache_positions, cache_positions_loop
RIGHT["cache_positions_shift"] = check.check_cache_positions, lambda kept, s: torch.cat(   # the window is contiguous
    [kept[:s], kept[s:] - kept[s:].min() + s])


@pytest.mark.parametrize("wrong, message", [
    (lambda kept, s: kept.clone(), "original positions"),
    (lambda kept, s: torch.arange(len(kept)), "slot index"),
    (lambda kept, s: torch.cat([kept[:s], s + kept[s:].argsort()]), "argsort twice"),
    (lambda kept, s: torch.cat([kept[:s] + 1, s + kept[s:].argsort().argsort()]), "sinks keep positions"),
    (lambda kept, s: torch.cat([kept[:s], 1 + s + kept[s:].argsort().argsort()]), "expected"),
    (lambda kept, s: kept.tolist(), "should be a torch.Tensor"),
])
def test_cache_positions_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_cache_positions(wrong)


def doc_window_right(doc_ids, window):
    def mask_mod(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mask_mod


def doc_window_composed(doc_ids, window):               # torch's own combinator over the package's mods
    from torch.nn.attention.flex_attention import and_masks

    from selfattn_lite import flex
    return and_masks(flex.document_mod(doc_ids, is_causal=True), flex.sliding_window_mod(window))


RIGHT["doc_window_mod"] = check.check_doc_window_mod, doc_window_right
RIGHT["doc_window_mod_composed"] = check.check_doc_window_mod, doc_window_composed


def _doc_mod(cond):
    return lambda d, w: (lambda b, h, q, kv: cond(d, w, q, kv))


@pytest.mark.parametrize("wrong, message", [
    (_doc_mod(lambda d, w, q, kv: (kv <= q) & (q - kv < w)), "sliding window alone"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & (kv <= q)), "causal document mask alone"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & ((q - kv).abs() < w)), "window is causal"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & (kv < q) & (q - kv < w)), "diagonal is missing"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & (kv <= q) & (q - kv <= w)), "the query included"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & (kv <= q) & (q - kv < w - 1)), "holds the query and"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) and (kv <= q)), "combine conditions with"),
    (_doc_mod(lambda d, w, q, kv: (d[q] == d[kv]) & (kv <= q) & (q - kv < 2 * w)), "expected"),
    (lambda d, w: None, "should return a function"),
])
def test_doc_window_mod_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_doc_window_mod(wrong)


def absorbed_right(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale):
    q_latent = torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)                     # (B, h, 1, d_c)
    scores = (q_latent @ c_kv[:, None].transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)) * scale
    o_latent = scores.softmax(dim=-1) @ c_kv[:, None]                           # (B, h, 1, d_c)
    o = torch.einsum("bhlc,hvc->blhv", o_latent, w_uv)                          # (B, 1, h, v)
    return o.flatten(2) @ w_o.T                                                 # (B, 1, d)


def absorbed_sdpa(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale):
    q = torch.cat([torch.einsum("bhln,hnc->bhlc", q_nope, w_uk), q_rope], dim=-1)
    k = torch.cat([c_kv, k_rope], dim=-1)[:, None]
    o_latent = F.scaled_dot_product_attention(q, k, c_kv[:, None], scale=scale)   # broadcast over heads
    return torch.einsum("bhlc,hvc->blhv", o_latent, w_uv).flatten(2) @ w_o.T


def _naive_decode(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale):
    k = torch.einsum("hnc,bsc->bhsn", w_uk, c_kv)                               # expanded keys
    v = torch.einsum("hvc,bsc->bhsv", w_uv, c_kv)                               # expanded values
    s = (q_nope @ k.transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)) * scale
    return (s.softmax(-1) @ v).transpose(1, 2).flatten(2) @ w_o.T


def _folded_decode(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale):
    q_latent = torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)
    s = (q_latent @ c_kv[:, None].transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)) * scale
    o_latent = s.softmax(-1) @ c_kv[:, None]
    fold = torch.einsum("dhv,hvc->dhc", w_o.view(w_o.shape[0], w_uv.shape[0], -1), w_uv)   # every step
    return torch.einsum("bhlc,dhc->bld", o_latent, fold)


def _variant(scale_of=None, rope=True, head0=False, stop=None):
    def fn(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale):
        uk = w_uk[:1].expand_as(w_uk) if head0 else w_uk
        q_latent = torch.einsum("bhln,hnc->bhlc", q_nope, uk)
        s = q_latent @ c_kv[:, None].transpose(-2, -1)
        if rope:
            s = s + q_rope @ k_rope[:, None].transpose(-2, -1)
        s = s * (scale if scale_of is None else scale_of(q_nope, q_rope, c_kv))
        o_latent = s.softmax(-1) @ c_kv[:, None]
        if stop == "latent":
            return o_latent
        o = torch.einsum("bhlc,hvc->blhv", o_latent, w_uv).flatten(2)
        return o if stop == "w_uv" else o @ w_o.T
    return fn


RIGHT["absorbed_decode"] = check.check_absorbed_decode, absorbed_right
RIGHT["absorbed_decode_sdpa"] = check.check_absorbed_decode, absorbed_sdpa


@pytest.mark.parametrize("wrong, message", [
    (_naive_decode, "latents were expanded"),
    (_folded_decode, "was folded inside the step"),
    (_variant(scale_of=lambda qn, qr, c: (c.shape[-1] + qr.shape[-1]) ** -0.5), "scale is off"),
    (_variant(scale_of=lambda qn, qr, c: 1.0), "scale is off"),
    (_variant(rope=False), "RoPE part is missing"),
    (_variant(head0=True), "served every head"),
    (_variant(stop="latent"), "apply each head"),
    (_variant(stop="w_uv"), "is applied"),
    (lambda qn, qr, c, kr, uk, uv, wo, s: torch.einsum("bhln,hcn->bhlc", qn, uk), "torch refused the shapes"),
    (lambda qn, qr, c, kr, uk, uv, wo, s: absorbed_right(qn, qr, c, kr, uk, uv, wo, s).flip(0), "differs from"),
])
def test_absorbed_decode_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_absorbed_decode(wrong)


def prefix_lm_right(prefix):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < prefix)
    return mask_mod


RIGHT["prefix_lm_mask_mod"] = check.check_prefix_lm_mask_mod, prefix_lm_right


@pytest.mark.parametrize("wrong, message", [
    (lambda p: (lambda b, h, q, kv: (kv <= q) or (kv < p)), "combine conditions with"),
    (lambda p: (lambda b, h, q, kv: kv <= q), "plain causal"),
    (lambda p: (lambda b, h, q, kv: (kv < q) | (kv < p)), "diagonal is missing"),
    (lambda p: (lambda b, h, q, kv: (kv <= q) | (q < p)), "not the query"),
    (lambda p: (lambda b, h, q, kv: (kv <= q) | (kv <= p)), "off by one"),
    (lambda p: (lambda b, h, q, kv: kv >= q), "pair .q="),
    (lambda p: None, "should return a function"),
])
def test_prefix_lm_mask_mod_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_prefix_lm_mask_mod(wrong)


def softcap_right(cap):
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


RIGHT["softcap_score_mod"] = check.check_softcap_score_mod, softcap_right


@pytest.mark.parametrize("wrong, message", [
    (lambda c: (lambda s, b, h, q, kv: s), "unchanged"),
    (lambda c: (lambda s, b, h, q, kv: c * torch.tanh(s)), "divide by cap inside"),
    (lambda c: (lambda s, b, h, q, kv: torch.tanh(s / c)), "multiply by cap outside"),
    (lambda c: (lambda s, b, h, q, kv: s.clamp(-c, c)), "hard clamp"),
    (lambda c: (lambda s, b, h, q, kv: c * torch.tanh(s / c) if s > 0 else s), "combine conditions with"),
    (lambda c: (lambda s, b, h, q, kv: 2 * s), "differs from the dense"),
])
def test_softcap_score_mod_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.check_softcap_score_mod(wrong)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
