"""The tiny decoder: against a hand-written forward, cached == uncached, RoPE positions through the cache,
RoPE angles once per forward, GQA conversion, the shipped weights."""

import json
import math

import pytest
import torch
from helpers import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.kv_cache import Int8KVCache, KVCache
from selfattn_lite.models import (
    CONFIG_FILE,
    TEXT_FILE,
    WEIGHTS_FILE,
    CharTokenizer,
    DecoderConfig,
    evaluate,
    load_text,
    load_tiny_decoder,
    pool_kv_heads,
    split_text,
    to_gqa,
)


def _chunks(ids, sizes):
    out, start = [], 0
    for s in sizes:
        if start >= ids.shape[1]:
            break
        out.append(ids[:, start:start + s])
        start += s
    if start < ids.shape[1]:
        out.append(ids[:, start:])
    return out


# ---------------------------------------------------------------- against a hand-written forward
def reference_forward(model, ids):
    """The decoder written out from its formulas: RoPE by its angles m theta_i, explicit causal softmax.

    Only the norms, the MLPs and the weight matrices are taken from ``model``.
    Returns logits (B, T, V) and [weights (B, h, T, T)] * n_layers.
    """
    c = model.config
    B, T = ids.shape
    h, h_kv, dk = c.n_heads, c.n_kv_heads, c.head_dim
    theta = c.rope_base ** (-torch.arange(0, dk, 2, dtype=torch.float64) / dk)      # (dk/2,)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * theta                 # (T, dk/2): m theta_i
    cos, sin = angles.cos().to(model.embed.weight.dtype), angles.sin().to(model.embed.weight.dtype)

    def rotate(t):                                          # (B, heads, T, dk): pairs (i, i + dk/2)
        a, b = t[..., : dk // 2], t[..., dk // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = model.embed.weight[ids]                                                    # (B, T, d)
    all_weights = []
    for block in model.blocks:
        attn, u = block.attn, block.norm1(x)
        q = (u @ attn.q_proj.weight.T).view(B, T, h, dk).transpose(1, 2)           # (B, h, T, dk)
        k = (u @ attn.k_proj.weight.T).view(B, T, h_kv, dk).transpose(1, 2)        # (B, h_kv, T, dk)
        v = (u @ attn.v_proj.weight.T).view(B, T, h_kv, dk).transpose(1, 2)
        q, k = rotate(q), rotate(k)
        k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(dk)).masked_fill(future, float("-inf"))
        weights = scores.softmax(dim=-1)                                           # (B, h, T, T)
        y = (weights @ v).transpose(1, 2).reshape(B, T, c.d_model) @ attn.out_proj.weight.T
        x = x + y
        x = x + block.mlp(block.norm2(x))
        all_weights.append(weights)
    return model.norm(x) @ model.embed.weight.T, all_weights


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_and_weights_match_a_hand_written_forward(n_kv_heads, dtype):
    model = tiny_model(4, n_layers=3, n_kv_heads=n_kv_heads, d_model=32).to(dtype)
    ids = torch.randint(0, 11, (2, 13), generator=torch.Generator().manual_seed(2))
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-8)
    with torch.no_grad():
        expected_logits, expected_weights = reference_forward(model, ids)
        logits, weights = model(ids, need_weights=True)
        plain = model(ids)                                             # the flag changes no logit
    torch.testing.assert_close(logits, expected_logits, **tol)
    torch.testing.assert_close(plain, expected_logits, **tol)
    assert len(weights) == 3
    for ours, theirs in zip(weights, expected_weights, strict=True):
        assert ours.shape == (2, 4, 13, 13)
        torch.testing.assert_close(ours, theirs, **tol)


def test_weights_through_the_cache_are_rows_of_the_full_weights():
    model = tiny_model(6, n_kv_heads=2)
    ids = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, full = model(ids, need_weights=True)                        # n_layers x (B, h, 10, 10)
        caches = model.new_caches(2, 10)
        _, prefill = model(ids[:, :6], caches=caches, need_weights=True)
        steps = [model(ids[:, t:t + 1], caches=caches, need_weights=True)[1] for t in range(6, 10)]
    for layer in range(2):
        torch.testing.assert_close(prefill[layer], full[layer][:, :, :6, :6])
        for t, step in zip(range(6, 10), steps, strict=True):
            assert step[layer].shape == (2, 4, 1, t + 1)                # one query, every key so far
            torch.testing.assert_close(step[layer], full[layer][:, :, t:t + 1, :t + 1])


def test_rope_angles_are_computed_once_per_forward_and_passed_to_every_layer(monkeypatch):
    model = tiny_model(8, n_layers=3)
    calls, seen = [], []
    angles = model.rope.angles
    monkeypatch.setattr(model.rope, "angles", lambda *a, **kw: calls.append(1) or angles(*a, **kw))
    for block in model.blocks:                                         # what each layer is handed
        forward = block.attn.forward
        monkeypatch.setattr(block.attn, "forward",
                            lambda *a, forward=forward, **kw: seen.append(kw["rope_angles"]) or forward(*a, **kw))
    ids = torch.randint(0, 11, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(ids)
        assert len(calls) == 1                                         # not 2 per layer (q and k)
        assert len(seen) == 3 and all(s is seen[0] for s in seen)      # the same (cos, sin) for every layer
        model.generate(ids, 3)
    assert len(calls) == 1 + 3                                         # prefill and two decode steps, + the first
    assert not hasattr(model.rope, "_shared")                          # nothing stashed on the module


def test_angles_passed_down_give_the_same_outputs_as_rope_in_every_layer():
    """The old path: each attention computes its own cos and sin (the blocks called without angles)."""
    model = tiny_model(9, n_layers=3, n_kv_heads=2)
    ids = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        x = model.embed(ids)
        for block in model.blocks:
            x, _ = block(x)                                            # rope(q, arange(T)) per layer
        per_layer = model.lm_head(model.norm(x))
        caches = model.new_caches(2, 12)
        cached = torch.cat([model(ids[:, :8], caches=caches), *(model(ids[:, t:t + 1], caches=caches)
                                                                  for t in range(8, 12))], dim=1)
        shared = model(ids)
    torch.testing.assert_close(shared, per_layer, atol=0, rtol=0)        # the same cos and sin, bit for bit
    torch.testing.assert_close(cached, per_layer, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- cache equivalence
@settings(max_examples=25)
@given(seed=st.integers(0, 50), n_layers=st.integers(1, 3), heads=st.sampled_from([(4, 4), (4, 2), (4, 1)]),
       T=st.integers(1, 20), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), B=st.integers(1, 2),
       norm=st.sampled_from(["rmsnorm", "layernorm"]))
def test_cached_logits_equal_uncached_logits(seed, n_layers, heads, T, sizes, B, norm):
    model = tiny_model(seed, n_layers=n_layers, n_heads=heads[0], n_kv_heads=heads[1], norm=norm)
    ids = torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(ids)                                          # (B, T, V), no cache
        caches = model.new_caches(B, T)
        pieces = [model(chunk, caches=caches) for chunk in _chunks(ids, sizes)]   # prefill + chunked decode
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)
    assert all(len(c) == T for c in caches)


@settings(max_examples=15)
@given(seed=st.integers(0, 50), T=st.integers(1, 12), new=st.integers(0, 8), kv=st.sampled_from([4, 2, 1]))
def test_generate_same_tokens_with_and_without_cache(seed, T, new, kv):
    model = tiny_model(seed, n_kv_heads=kv)
    ids = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(seed))
    with_cache = model.generate(ids, new, use_cache=True)
    without = model.generate(ids, new, use_cache=False)
    assert with_cache.shape == (2, T + new)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :T], ids)


def test_rope_rotates_cached_keys_at_their_true_positions():
    model = tiny_model(3)
    attn = model.blocks[0].attn
    ids = torch.randint(0, 11, (1, 9), generator=torch.Generator().manual_seed(0))
    x = model.blocks[0].norm1(model.embed(ids)).detach()          # (1, 9, d): the first layer's input
    k = attn.k_proj(x).view(1, 9, 4, 4).transpose(1, 2)            # (1, h, 9, dk), not rotated
    expected = model.rope(k, torch.arange(9))                      # rotated at positions 0..8
    with torch.no_grad():
        caches = model.new_caches(1, 9)
        model(ids[:, :6], caches=caches)                           # prefill 6 tokens
        model(ids[:, 6:7], caches=caches)                          # decode token 6 ...
        model(ids[:, 7:9], caches=caches)                          # ... and a chunk of 2
    torch.testing.assert_close(caches[0].k[:, :, :9], expected.detach(), atol=1e-6, rtol=1e-5)
    # a decode step rotated from position 0 instead would store a different key
    assert not torch.allclose(model.rope(k[:, :, 6:7], torch.arange(1)), expected[:, :, 6:7])


def test_int8_cache_generates_nearly_the_same():
    model = tiny_model(5, d_model=32, n_heads=4)
    ids = torch.randint(0, 11, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        caches = model.new_caches(1, 20, cache_cls=Int8KVCache)
        assert isinstance(caches[0], Int8KVCache)
        approx = model(ids, caches=caches)
    torch.testing.assert_close(approx, model(ids).detach(), atol=5e-3, rtol=0)
    assert model.generate(ids, 5, cache_cls=Int8KVCache).shape == (1, 15)


# ---------------------------------------------------------------- bad input
def test_generate_rejects_overflow_and_bad_ids():
    model = tiny_model(max_len=10)
    with pytest.raises(ValueError, match=r"prompt of 6 tokens \+ 5 new tokens = 11 exceeds max_len=10"):
        model.generate(torch.zeros(6, dtype=torch.long), 5)
    with pytest.raises(ValueError, match=r"max_new_tokens must be a non-negative int, got -1"):
        model.generate(torch.zeros(3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match=r"integer token ids, got \(1, 3\) of dtype torch.float32"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\[0, vocab_size=11\), got min 0, max 11"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match=r"one cache per layer \(2\), got 1"):
        model(torch.zeros(1, 2, dtype=torch.long), caches=model.new_caches(1)[:1])
    caches = model.new_caches(1, 10)
    model(torch.zeros(1, 8, dtype=torch.long), caches=caches)
    with pytest.raises(ValueError, match=r"8 cached \+ 3 new tokens exceed max_len=10"):
        model(torch.zeros(1, 3, dtype=torch.long), caches=caches)


def test_a_small_cache_overflows_with_a_clear_error():
    model = tiny_model(max_len=32)
    caches = model.new_caches(1, 4)
    with pytest.raises(ValueError, match=r"KV cache overflow: it holds 0 tokens, 5 more would make 5 > max_len = 4"):
        model(torch.zeros(1, 5, dtype=torch.long), caches=caches)


@pytest.mark.parametrize("kw, pattern", [
    (dict(d_model=18, n_heads=4), r"d_model=18 is not divisible by n_heads=4"),
    (dict(n_heads=4, n_kv_heads=3), r"n_heads=4 is not a multiple of n_kv_heads=3"),
    (dict(d_model=12, n_heads=4), r"even head_dim, got d_model / n_heads = 3"),
    (dict(norm="batchnorm"), r"norm must be 'rmsnorm' or 'layernorm'"),
    (dict(max_len=0), r"max_len must be a positive int, got 0"),
])
def test_config_errors(kw, pattern):
    cfg = dict(vocab_size=11, d_model=16, n_heads=4)
    cfg.update(kw)
    with pytest.raises(ValueError, match=pattern):
        DecoderConfig(**cfg)


# ---------------------------------------------------------------- MHA -> GQA
def test_pool_kv_heads_averages_consecutive_heads():
    w = torch.arange(8.0).repeat_interleave(2)[:, None] * torch.ones(1, 3)   # 8 heads of dk=2, head j = j
    pooled = pool_kv_heads(w, n_heads=8, n_kv_heads=2)
    assert pooled.shape == (4, 3)
    torch.testing.assert_close(pooled[:, 0], torch.tensor([1.5, 1.5, 5.5, 5.5]))   # mean(0..3), mean(4..7)
    with pytest.raises(ValueError, match="n_heads=8 is not a multiple of n_kv_heads=3"):
        pool_kv_heads(w, 8, 3)


def test_to_gqa_is_exact_when_heads_in_a_group_already_agree():
    mha = tiny_model(7, n_heads=4)
    with torch.no_grad():
        for block in mha.blocks:                       # make K/V heads 0=1 and 2=3: an MHA that is secretly GQA
            for proj in (block.attn.k_proj, block.attn.v_proj):
                w = proj.weight.view(2, 2, 4, 16)
                w[:, 1] = w[:, 0]
    gqa = to_gqa(mha, 2)
    assert gqa.config.n_kv_heads == 2 and gqa.blocks[0].attn.k_proj.weight.shape == (8, 16)
    ids = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids), mha(ids), atol=1e-5, rtol=1e-4)
        assert not torch.allclose(to_gqa(tiny_model(7, n_heads=4), 2)(ids), tiny_model(7, n_heads=4)(ids), atol=1e-3)
    assert torch.equal(to_gqa(mha, 4)(ids), mha(ids))  # 4 of 4: nothing pooled
    with pytest.raises(ValueError, match="converts an MHA model"):
        to_gqa(gqa, 1)


def test_gqa_caches_are_smaller_by_the_head_ratio():
    mha = tiny_model(1, n_heads=4)
    sizes = {kv: sum(c.nbytes for c in to_gqa(mha, kv).new_caches(1)) for kv in (4, 2, 1)}
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


# ---------------------------------------------------------------- tokenizer and data
def test_char_tokenizer_roundtrip_and_errors():
    tok = CharTokenizer.from_text("hello world")
    assert tok.chars == " dehlorw" and len(tok) == 8
    assert tok.decode(tok.encode("low held")) == "low held"
    with pytest.raises(ValueError, match=r"not in the vocabulary: \['Z', 'x'\]"):
        tok.encode("xZ")


def test_shipped_text_and_split():
    text = load_text()
    assert 100_000 < len(text) < 400_000 and text.startswith("First Citizen:")
    train, val = split_text(text)
    assert train + val == text and abs(len(val) / len(text) - 0.1) < 1e-3


# ---------------------------------------------------------------- the shipped model
def test_shipped_weights_are_small_plain_tensors():
    from safetensors import safe_open

    assert WEIGHTS_FILE.stat().st_size < 5 * 1024 * 1024
    with safe_open(str(WEIGHTS_FILE), framework="pt") as f:   # safetensors: tensors only, no pickled code
        keys = list(f.keys())
        assert "embed.weight" in keys and "lm_head.weight" not in keys     # tied: stored once
        assert all(f.get_tensor(k).is_floating_point() for k in keys)


def test_shipped_model_loads_and_matches_its_training_record():
    model = load_tiny_decoder()
    info = json.loads(CONFIG_FILE.read_text())
    assert model.info == info and not model.training
    assert model.lm_head.weight is model.embed.weight
    assert model.n_params() == info["n_params"]
    assert info["data"]["file"] == TEXT_FILE.name and len(load_text()) == info["data"]["chars"]
    text = load_text()
    val_ids = model.tokenizer.encode(split_text(text)[1])
    got = evaluate(model, val_ids)                 # the default window count is the record's (VAL_WINDOWS)
    assert got["loss"] == pytest.approx(info["val_loss"], abs=2e-3)      # the same held-out loss
    assert got["loss"] < 2.0                                             # it learned: uniform is ln(V) ~ 4.1


def test_shipped_model_generates_the_same_text_with_and_without_cache():
    model = load_tiny_decoder()
    prompt = "MENENIUS:\n"
    cached, plain = model.complete(prompt, 40), model.complete(prompt, 40, use_cache=False)
    assert cached == plain and len(cached) == 40
    assert set(cached) <= set(model.tokenizer.chars)


def test_load_errors_name_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors not found"):
        load_tiny_decoder(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny_model().complete("ab", 2)
    assert isinstance(tiny_model().new_caches(2)[0], KVCache)


def test_decode_benchmark_command_line_runs(capsys):
    from selfattn_lite.course import bench_decode

    result = bench_decode.main(["--prompt", "8", "--new", "4", "--repeat", "2"])
    assert (result["prompt"], result["new"]) == (8, 4) and result["seconds"] > 0
    out = capsys.readouterr().out
    assert out.count("prompt 8 + 4 generated") == 2 and "best of 2" in out


def test_decode_targets_measure_both_ways_the_same():
    from selfattn_lite.course import bench_decode

    model = load_tiny_decoder()
    speed = bench_decode.cache_speedup(model, prompt_len=8, new_tokens=4, repeat=2)
    assert speed["cached_s"] > 0 and speed["uncached_s"] > 0
    assert speed["speedup"] == speed["uncached_s"] / speed["cached_s"]
    growth = bench_decode.step_growth(model, contexts=(4, 16), budget_s=0.02)
    assert growth["contexts"] == [4, 16] and len(growth["cache_ms"]) == len(growth["no_cache_ms"]) == 2
    assert growth["growth"]["cache"] == growth["cache_ms"][1] / growth["cache_ms"][0]
