"""KVCache, the cache size formula against published model figures, paging and int8 caches."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite.kv_cache import (
    PRESETS,
    Int8KVCache,
    KVCache,
    PagedKVCache,
    dequantize_int8,
    format_bytes,
    get_preset,
    kv_cache_bytes,
    paging_waste,
    quantize_int8,
)

KiB, GiB = 1024, 1024 ** 3


def _kv(B, h, T, dk, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, h, T, dk, generator=g).to(dtype), torch.randn(B, h, T, dk, generator=g).to(dtype)


# ---------------------------------------------------------------- KVCache
@given(chunks=st.lists(st.integers(1, 5), min_size=1, max_size=6), B=st.integers(1, 2),
       h=st.integers(1, 3), dk=st.sampled_from([1, 4, 8]))
def test_update_returns_everything_stored_in_order(chunks, B, h, dk):
    cache = KVCache(B, h, sum(chunks) + 2, dk)
    ks, vs = [], []
    for i, t in enumerate(chunks):
        k, v = _kv(B, h, t, dk, seed=i)
        ks.append(k)
        vs.append(v)
        k_all, v_all = cache.update(k, v)
        assert len(cache) == sum(c.shape[2] for c in ks)
        torch.testing.assert_close(k_all, torch.cat(ks, dim=2), rtol=0, atol=0)
        torch.testing.assert_close(v_all, torch.cat(vs, dim=2), rtol=0, atol=0)


def test_update_returns_views_of_the_preallocated_buffers():
    cache = KVCache(1, 2, 8, 4)
    k_buffer_ptr = cache.k.data_ptr()
    k_all, v_all = cache.update(*_kv(1, 2, 3, 4))
    assert k_all.data_ptr() == k_buffer_ptr and v_all.data_ptr() == cache.v.data_ptr()
    assert k_all.shape == (1, 2, 3, 4)
    assert cache.k.data_ptr() == k_buffer_ptr  # never reallocated


def test_len_reset_and_crop():
    cache = KVCache(1, 1, 6, 2)
    assert len(cache) == 0
    k, v = _kv(1, 1, 4, 2)
    cache.update(k, v)
    assert len(cache) == 4
    cache.crop(2)
    k2, v2 = _kv(1, 1, 1, 2, seed=1)
    k_all, _ = cache.update(k2, v2)
    torch.testing.assert_close(k_all, torch.cat([k[:, :, :2], k2], dim=2))
    cache.reset()
    assert len(cache) == 0
    k_all, _ = cache.update(k2, v2)
    torch.testing.assert_close(k_all, k2)
    with pytest.raises(ValueError, match=r"crop length must be an int in \[0, 1\], got 5"):
        cache.crop(5)


def test_overflow_names_the_numbers():
    cache = KVCache(1, 2, 5, 4)
    cache.update(*_kv(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"holds 4 tokens, 2 more would make 6 > max_len = 5"):
        cache.update(*_kv(1, 2, 2, 4))
    assert len(cache) == 4  # a failed update stores nothing


@pytest.mark.parametrize("shape, pattern", [
    ((1, 3, 2, 4), r"n_kv_heads=2.*got \(1, 3, 2, 4\)"),
    ((2, 2, 2, 4), r"B=1.*got \(2, 2, 2, 4\)"),
    ((1, 2, 2, 5), r"head_dim=4.*got \(1, 2, 2, 5\)"),
    ((2, 2, 4), r"got \(2, 2, 4\)"),
    ((1, 2, 0, 4), r"at least one new token"),
])
def test_shape_errors(shape, pattern):
    cache = KVCache(1, 2, 8, 4)
    x = torch.zeros(shape)
    with pytest.raises(ValueError, match=pattern):
        cache.update(x, x)


def test_k_v_mismatch_dtype_and_type_errors():
    cache = KVCache(1, 2, 8, 4)
    k, v = _kv(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"same shape.*k \(1, 2, 3, 4\) and v \(1, 2, 2, 4\)"):
        cache.update(k, v[:, :, :2])
    with pytest.raises(ValueError, match=r"dtype torch.float16 but the cache holds torch.float32"):
        cache.update(k.half(), v.half())
    with pytest.raises(ValueError, match=r"must be a torch.Tensor, got list"):
        cache.update([1.0], v)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_constructor_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match=r"max_len must be a positive int"):
        KVCache(1, 1, bad, 4)


def test_half_cache_and_nbytes_match_the_formula():
    cache = KVCache(2, 4, 16, 8, dtype=torch.bfloat16)
    assert cache.nbytes == kv_cache_bytes(1, 4, 8, n_tokens=16, batch=2, bytes_per_value=2)
    cache.update(*_kv(2, 4, 5, 8, dtype=torch.bfloat16))
    assert cache.used_bytes == kv_cache_bytes(1, 4, 8, n_tokens=5, batch=2, bytes_per_value=2)


# ---------------------------------------------------------------- size formula and presets
def test_llama2_7b_figures_from_the_source_page():
    # 2 x 32 layers x 32 heads x 128 dims x 2 bytes = 512 KiB per token; 2 GiB at 4,096 tokens.
    assert kv_cache_bytes(32, 32, 128) == 512 * KiB
    assert kv_cache_bytes(32, 32, 128, n_tokens=4096) == 2 * GiB
    p = get_preset("llama-2-7b")
    assert p.kv_bytes() == 512 * KiB and p.kv_bytes(4096) == 2 * GiB
    assert format_bytes(p.kv_bytes()) == "512.0 KiB" and format_bytes(p.kv_bytes(4096)) == "2.00 GiB"


@pytest.mark.parametrize("name, per_token", [
    ("Llama-3-8B", 128 * KiB),    # GQA: 8 KV heads instead of 32 -> a quarter of Llama-2-7B's
    ("Mistral-7B", 128 * KiB),
    ("Llama-2-70B", 320 * KiB),   # 80 layers x 8 KV heads
    ("Llama-3-70B", 320 * KiB),
    ("Qwen2.5-7B", 56 * KiB),     # 28 layers x 4 KV heads
    ("GPT-2 (124M)", 36 * KiB),   # 12 layers x 12 heads x 64 dims
    ("Llama-2-13B", 800 * KiB),
])
def test_presets_per_token(name, per_token):
    assert PRESETS[name].kv_bytes() == per_token


def _llama_params(p):
    """Parameter count of a Llama-style model (untied embeddings, SwiGLU MLP, RMSNorm)."""
    attn = p.d_model * p.n_heads * p.head_dim * 2 + p.d_model * p.n_kv_heads * p.head_dim * 2
    mlp = 3 * p.d_model * p.ffn_dim
    return p.n_layers * (attn + mlp + 2 * p.d_model) + p.d_model + 2 * p.vocab_size * p.d_model


def test_preset_shapes_reproduce_the_published_parameter_counts():
    # The configs and the published totals are independent figures: they must agree.
    for name in ["Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Mistral-7B", "Llama-3-8B", "Llama-3-70B"]:
        assert _llama_params(PRESETS[name]) == PRESETS[name].n_params, name
    qwen = PRESETS["Qwen2.5-7B"]  # Llama-style plus biases on q, k, v
    assert _llama_params(qwen) + qwen.n_layers * (qwen.d_model + 2 * qwen.n_kv_heads * qwen.head_dim) == qwen.n_params
    gpt2 = PRESETS["GPT-2 (124M)"]  # learned positions, biases, LayerNorms, tied embeddings
    d = gpt2.d_model
    layer = (4 * d * d + 4 * d) + (2 * d * gpt2.ffn_dim + gpt2.ffn_dim + d) + 4 * d
    assert gpt2.n_layers * layer + (gpt2.vocab_size + gpt2.max_position) * d + 2 * d == gpt2.n_params


def test_preset_kinds_and_weights():
    kinds = {name: p.attention for name, p in PRESETS.items()}
    assert kinds["Llama-2-7B"] == "MHA" and kinds["Llama-3-8B"] == "GQA" and kinds["GPT-2 (124M)"] == "MHA"
    assert get_preset("Llama-2-7B").weight_bytes() == 2 * 6_738_415_616
    assert get_preset("Llama-3-8B").kv_bytes(n_kv_heads=32) == get_preset("Llama-2-7B").kv_bytes()


def test_kv_cache_bytes_scales_linearly_and_rejects_bad_input():
    base = kv_cache_bytes(4, 2, 16)
    assert kv_cache_bytes(4, 2, 16, n_tokens=10, batch=3) == 30 * base
    assert kv_cache_bytes(4, 2, 16, bytes_per_value=4) == 2 * base
    assert kv_cache_bytes(4, 2, 16, n_tokens=0) == 0
    with pytest.raises(ValueError, match="n_layers must be a positive int, got 0"):
        kv_cache_bytes(0, 2, 16)
    with pytest.raises(ValueError, match="n_tokens must be a non-negative int, got -1"):
        kv_cache_bytes(4, 2, 16, n_tokens=-1)
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'"):
        get_preset("gpt-5")


# ---------------------------------------------------------------- paged cache
@given(lengths=st.lists(st.integers(1, 13), min_size=1, max_size=4), block=st.integers(1, 5))
def test_paged_cache_gathers_what_was_appended(lengths, block):
    h, dk = 2, 3
    pool = PagedKVCache(sum(math.ceil(n / block) for n in lengths), block, h, dk)
    full = {i: _kv(1, h, n, dk, seed=i) for i, n in enumerate(lengths)}
    # interleave requests, two tokens at a time, as a server would
    done = dict.fromkeys(full, 0)
    while any(done[i] < n for i, n in enumerate(lengths)):
        for i, n in enumerate(lengths):
            if done[i] < n:
                k, v = full[i]
                pool.append(i, k[0, :, done[i]:done[i] + 2], v[0, :, done[i]:done[i] + 2])
                done[i] = min(n, done[i] + 2)
    for i, (k, v) in full.items():
        k_got, v_got = pool.gather(i)
        torch.testing.assert_close(k_got, k[0], rtol=0, atol=0)
        torch.testing.assert_close(v_got, v[0], rtol=0, atol=0)
    assert pool.tokens_stored == sum(lengths)
    assert pool.slots_reserved == paging_waste(lengths, max(lengths), block)["paged"]


def test_paged_cache_free_and_out_of_blocks():
    pool = PagedKVCache(3, 4, 1, 2)
    k, v = _kv(1, 1, 8, 2)
    pool.append("a", k[0], v[0])
    assert pool.block_tables["a"] == [0, 1] and pool.blocks_in_use == 2
    with pytest.raises(ValueError, match=r"out of blocks: sequence 'b' needs 2 more but only 1 of the 3 blocks of 4 tokens"):
        pool.append("b", k[0], v[0])
    assert "b" not in pool.block_tables and pool.blocks_in_use == 2  # a refused append takes nothing
    pool.free("a")
    assert pool.blocks_in_use == 0
    with pytest.raises(ValueError, match=r"unknown sequence 'a'"):
        pool.gather("a")
    with pytest.raises(ValueError, match=r"\(n_kv_heads=1, T_new, head_dim=2\)"):
        pool.append("c", k[0, :, :, :1], v[0, :, :, :1])


def test_paging_waste_counts_slots():
    stats = paging_waste([5, 16, 1], max_len=16, block_size=4)
    assert stats["tokens"] == 22 and stats["contiguous"] == 48 and stats["paged"] == 8 + 16 + 4
    assert stats["contiguous_waste"] == pytest.approx(1 - 22 / 48)
    assert stats["paged_waste"] == pytest.approx(1 - 22 / 28)
    with pytest.raises(ValueError, match=r"max_len=16.*\[5, 17\]"):
        paging_waste([5, 17], 16, 4)


# ---------------------------------------------------------------- int8
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 16)), seed=st.integers(0, 99))
def test_int8_roundtrip_error_is_at_most_half_a_step(shape, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == shape[:-1] + (1,)
    err = (dequantize_int8(q, scale) - x).abs()
    assert (err <= scale / 2 + 1e-6).all()
    assert (q.abs().amax(-1) == 127).all()  # absmax maps to +-127


def test_int8_cache_same_api_and_smaller():
    k, v = _kv(2, 2, 6, 32)
    ref, q8 = KVCache(2, 2, 6, 32), Int8KVCache(2, 2, 6, 32)
    ref.update(k[:, :, :4], v[:, :, :4])
    q8.update(k[:, :, :4], v[:, :, :4])
    k_ref, v_ref = ref.update(k[:, :, 4:], v[:, :, 4:])
    k_q, v_q = q8.update(k[:, :, 4:], v[:, :, 4:])
    assert len(q8) == 6 and k_q.dtype == torch.float32
    torch.testing.assert_close(k_q, k_ref, atol=k.abs().max().item() / 127, rtol=0)
    torch.testing.assert_close(v_q, v_ref, atol=v.abs().max().item() / 127, rtol=0)
    # 1 byte per value + one fp32 scale per 32 values, against 4 bytes per value
    assert q8.nbytes / ref.nbytes == pytest.approx((32 + 4) / (32 * 4))
    with pytest.raises(ValueError, match="overflow"):
        q8.update(k[:, :, :1], v[:, :, :1])
    with pytest.raises(ValueError, match="x must be a floating-point tensor"):
        quantize_int8(torch.ones(3, dtype=torch.int64))


# ---------------------------------------------------------------- pictures and widgets
def test_calculator_widget_follows_its_controls():
    from selfattn_lite.viz.kv import KVCalculatorWidget

    w = KVCalculatorWidget("Llama-2-7B", seq_len=4096, batch=1)
    assert w.cache_bytes == 2 * GiB and w.renders == 1 and bytes(w.image.value).startswith(b"\x89PNG")
    w.batch.value = 16
    assert w.cache_bytes == 32 * GiB and w.renders == 2
    w.dtype.value = "fp8 / int8"
    assert w.cache_bytes == 16 * GiB
    w.preset.value = "Llama-3-70B"            # one redraw, K/V heads reset to the model's 8
    assert w.renders == 4 and w.kv_heads.value == 8 and w.kv_heads.options[-1] == 64
    assert w.cache_bytes == PRESETS["Llama-3-70B"].kv_bytes(4096, 16, bytes_per_value=1)
    assert w.weight_bytes == 2 * 70_553_706_496


def test_head_sharing_widget_measures_kv_caches():
    from selfattn_lite.viz.kv import HeadSharingWidget

    w = HeadSharingWidget(n_heads=8, head_dim=16, n_layers=4, max_len=512)
    assert w.cache_bytes == {kv: kv_cache_bytes(4, kv, 16, 512, bytes_per_value=4) for kv in (1, 2, 4, 8)}
    w.slider.value = 8
    assert w.group_size == 1 and w.renders == 2


def test_static_pictures():
    from selfattn_lite.viz.kv import draw_block_table, draw_cache_memory, draw_head_sharing

    ax = draw_cache_memory("Llama-2-7B", 4096, batch=16)
    assert "cache larger than the weights" in ax.get_title()
    assert "smaller" in draw_cache_memory("Llama-3-8B", 4096).get_title()
    with pytest.raises(ValueError, match="n_heads=8 is not a multiple of n_kv_heads=3"):
        draw_head_sharing(8, 3)
    pool = PagedKVCache(8, 4, 1, 2)
    pool.append("a", torch.zeros(1, 5, 2), torch.zeros(1, 5, 2))
    assert "2 of 8 blocks in use, 5 tokens, 3 empty slots" in draw_block_table(pool).get_title()
