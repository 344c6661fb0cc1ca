"""Checkers of notebooks 08 and 09: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite import efficient as nb08_efficient
from selfattn_lite.course.memory import peak_memory
from selfattn_lite.exercises import nb08, nb09


def stub(*args, **kwargs):
    raise NotImplementedError


RIGHT = {}          # test id -> (checker, a right answer); each exercise below adds its own


# ----------------------------------------------------------------------------- nb08: window_tiles

def window_tiles_right(n, window, block):
    """Loop over tile pairs: computed when some query i sees some key j, 0 <= i - j < window."""
    t = math.ceil(n / block)
    count = 0
    for a in range(t):
        r0, r1 = a * block, min(a * block + block, n) - 1
        for b in range(t):
            c0, c1 = b * block, min(b * block + block, n) - 1
            count += c0 <= r1 and r0 - c1 < window
    return count


def window_tiles_from_mask(n, window, block):
    """Another right answer: build the band mask and ask each tile whether it holds a True."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    band = (j <= i) & (i - j < window)
    return sum(bool(band[r:r + block, c:c + block].any()) for r in range(0, n, block) for c in range(0, n, block))


RIGHT["window_tiles"] = nb08.check_window_tiles, window_tiles_right
RIGHT["window_tiles_from_mask"] = nb08.check_window_tiles, window_tiles_from_mask


def two_sided(n, window, block):
    t = math.ceil(n / block)
    return sum((b * block - (min(a * block + block, n) - 1) <= window - 1)
               and (a * block - (min(b * block + block, n) - 1) < window) for a in range(t) for b in range(t))


@pytest.mark.parametrize("wrong,fragment", [
    (lambda n, w, b: math.ceil(n / b) * (math.ceil(n / b) + 1) // 2, "every causal tile"),
    (two_sided, "looks ahead"),
    (lambda n, w, b: window_tiles_right(n, w + 1, b), "window + 1 keys"),
    (lambda n, w, b: window_tiles_right(n // b * b, w, b), "partial tile"),
    (lambda n, w, b: 2 * math.ceil(n / b) - 1, "2T - 1"),
    (lambda n, w, b: window_tiles_right(n, w, b) + 1, "expected"),
    (lambda n, w, b: float(window_tiles_right(n, w, b)), "an int"),
    (lambda n, w, b: int((nb08_efficient.tile_plan(n, block_size=b, is_causal=True, window=w) != 0).sum()),
     "count the tiles yourself"),
])
def test_window_tiles_diagnoses(wrong, fragment):
    expect_error(nb08.check_window_tiles, wrong, fragment)


def test_window_tiles_gives_tile_plan_back():
    from selfattn_lite import efficient

    saved = efficient.tile_plan
    nb08.check_window_tiles(window_tiles_right)
    assert efficient.tile_plan is saved
    with pytest.raises(nb08.ExerciseError):
        nb08.check_window_tiles(lambda n, w, b: 0)
    assert efficient.tile_plan is saved          # restored after a failed answer too


def test_window_tiles_reference_is_tile_plan():
    """The checker's count is the package's plan: tile_plan with a window, causal, non-skipped tiles."""
    from selfattn_lite import efficient

    for n, w, b in [(64, 9, 8), (100, 10, 16), (17, 5, 3), (10, 1, 4), (10, 20, 4), (1000, 100, 128), (33, 8, 8)]:
        plan = efficient.tile_plan(n, block_size=b, is_causal=True, window=w)
        assert nb08._window_tiles(n, w, b) == int((plan != efficient.SKIP).sum()) == window_tiles_right(n, w, b)


# ----------------------------------------------------------------------------- nb08: causal_linear_attn

def phi(x):
    return F.elu(x) + 1


def causal_linear_right(q, k, v):
    B, n, m = q.shape
    S = torch.zeros(B, m, v.shape[-1])                                  # sum_j phi(k_j) v_j^T
    z = torch.zeros(B, m)                                               # sum_j phi(k_j)
    out = []
    for i in range(n):
        S = S + phi(k[:, i, :, None]) * v[:, i, None, :]
        z = z + phi(k[:, i])
        fq = phi(q[:, i])                                               # (B, m)
        out.append((fq[:, None, :] @ S)[:, 0] / (fq * z).sum(-1, keepdim=True))
    return torch.stack(out, dim=1)


def causal_linear_cumsum(q, k, v):
    S = torch.cumsum(phi(k)[..., :, None] * v[..., None, :], dim=1)    # (B, n, m, dv): no n x n
    z = torch.cumsum(phi(k), dim=1)
    return (phi(q)[..., None, :] @ S)[..., 0, :] / (phi(q) * z).sum(-1, keepdim=True)


def quadratic(q, k, v, diagonal=0, normalise=True):
    a = (phi(q) @ phi(k).transpose(-2, -1)).tril(diagonal)
    return (a @ v) / a.sum(-1, keepdim=True) if normalise else a @ v


RIGHT["causal_linear_attention"] = nb08.check_causal_linear_attention, causal_linear_right
RIGHT["causal_linear_attention_cumsum"] = nb08.check_causal_linear_attention, causal_linear_cumsum


@pytest.mark.parametrize("wrong,fragment", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), "softmax attention"),
    (lambda q, k, v: quadratic(q, k, v, diagonal=k.shape[1]), "non-causal form"),
    (lambda q, k, v: quadratic(q, k, v, diagonal=-1).nan_to_num(), "its own key"),
    (lambda q, k, v: quadratic(q, k, v, normalise=False), "normaliser is missing"),
    (quadratic, "forms the n x n matrix"),
    (lambda q, k, v: causal_linear_right(q, k, v)[:, :, :2], "shape"),
    (lambda q, k, v: causal_linear_right(q, k, v) * 1.1, "expected"),
    (lambda q, k, v: nb08_efficient.linear_attention(q, k, v, is_causal=True), "write the recurrence yourself"),
    (lambda q, k, v: torch.stack([nb08_efficient.linear_attention_step(None, q[:, i], k[:, i], v[:, i])[0]
                                  for i in range(q.shape[1])], 1), "write the recurrence yourself"),
])
def test_causal_linear_attention_diagnoses(wrong, fragment):
    expect_error(nb08.check_causal_linear_attention, wrong, fragment)


def package_step_loop(q, k, v):
    """The notebook's decoding loop over efficient.linear_attention_step: right, but not the learner's work."""
    state, out = None, []
    for i in range(q.shape[1]):
        out_i, state = nb08_efficient.linear_attention_step(state, q[:, i], k[:, i], v[:, i])
        out.append(out_i)
    return torch.stack(out, dim=1)


def test_causal_linear_attention_rejects_the_package_and_restores_it():
    saved = nb08_efficient.linear_attention, nb08_efficient.linear_attention_step
    expect_error(nb08.check_causal_linear_attention, package_step_loop, "write the recurrence yourself")
    assert (nb08_efficient.linear_attention, nb08_efficient.linear_attention_step) == saved
    nb08.check_causal_linear_attention(causal_linear_right)
    assert (nb08_efficient.linear_attention, nb08_efficient.linear_attention_step) == saved


# ----------------------------------------------------------------------------- nb08: causal_tiled_attention

def tiled(skip=True, diagonal_mask=True, rescale=True, subtract_max=True, scale=True, full_mask=False):
    """A causal tiled attention with online softmax; each flag off plants one mistake."""
    def causal_tiled_attention(q, k, v, block_size):
        n, d = q.shape[-2], q.shape[-1]
        out = torch.empty_like(q)
        big_mask = torch.ones(n, n).tril() if full_mask else None         # an n x n float mask: O(n^2) memory
        for q0 in range(0, n, block_size):
            q_blk = q[..., q0:q0 + block_size, :] / (math.sqrt(d) if scale else 1.0)
            rows = torch.arange(q0, q0 + q_blk.shape[-2])[:, None]
            m = torch.full(q_blk.shape[:-1], float("-inf"))
            l = torch.zeros(q_blk.shape[:-1])
            acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],))
            for k0 in range(0, q0 + q_blk.shape[-2] if skip else n, block_size):
                s = q_blk @ k[..., k0:k0 + block_size, :].transpose(-2, -1)
                cols = torch.arange(k0, k0 + s.shape[-1])[None, :]
                if full_mask:
                    s = s.masked_fill(big_mask[q0:q0 + s.shape[-2], k0:k0 + s.shape[-1]] == 0, float("-inf"))
                elif diagonal_mask:
                    s = s.masked_fill(cols > rows, float("-inf"))
                m_new = torch.maximum(m, s.amax(-1)) if subtract_max else torch.zeros_like(m)
                p = torch.exp(s - m_new[..., None])
                factor = torch.exp(m - m_new) if (rescale and subtract_max) else torch.ones_like(m)
                l = l * factor + p.sum(-1)
                acc = acc * factor[..., None] + p @ v[..., k0:k0 + block_size, :]
                m = m_new
            out[..., q0:q0 + block_size, :] = acc / l[..., None]
        return out
    return causal_tiled_attention


def check_tiled_with_memory(fn):
    nb08.check_causal_tiled(fn, peak_memory)


RIGHT["causal_tiled"] = nb08.check_causal_tiled, tiled()
RIGHT["causal_tiled_memory"] = check_tiled_with_memory, tiled()


@pytest.mark.parametrize("wrong,fragment", [
    (tiled(skip=False), "tiles' worth of matmuls"),
    (tiled(diagonal_mask=False), "right with 1 x 1 tiles"),
    (tiled(skip=False, diagonal_mask=False), "non-causal attention"),
    (tiled(rescale=False), "rescale the running sum"),
    (tiled(subtract_max=False), "exp(1e4) overflows"),
    (tiled(scale=False), "not scaled"),
    (lambda q, k, v, block_size: tiled()(q, k, v, block_size)[..., :-1, :], "shape"),
    (lambda q, k, v, block_size: nb08_efficient.flash_attention(q, k, v, is_causal=True, block_size=block_size),
     "write the tile loop yourself"),
    (lambda q, k, v, block_size: nb08_efficient.sliding_window_attention(q, k, v, q.shape[-2], block_size=block_size),
     "write the tile loop yourself"),
    (lambda q, k, v, block_size: F.scaled_dot_product_attention(q, k, v, is_causal=True),   # 0 FLOPs counted on a CPU
     "write the tile loop yourself"),
])
def test_causal_tiled_diagnoses(wrong, fragment):
    expect_error(nb08.check_causal_tiled, wrong, fragment)


def test_causal_tiled_restores_the_package():
    saved = nb08_efficient.flash_attention, nb08_efficient.sliding_window_attention
    expect_error(nb08.check_causal_tiled, lambda q, k, v, b: nb08_efficient.flash_attention(q, k, v, is_causal=True,
                                                                                            block_size=b), "yourself")
    assert (nb08_efficient.flash_attention, nb08_efficient.sliding_window_attention) == saved
    sdpa = F.scaled_dot_product_attention
    expect_error(nb08.check_causal_tiled, lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 "yourself")
    assert F.scaled_dot_product_attention is sdpa


def test_causal_tiled_memory_catches_an_n_by_n_mask():
    expect_error(check_tiled_with_memory, tiled(full_mask=True), "for the n x n scores")
    nb08.check_causal_tiled(tiled(full_mask=True))            # without the memory measurement it passes


# ----------------------------------------------------------------------------- nb09: the fixed snippets
# Each wrong answer below is the notebook's buggy snippet, or a plausible half-fix of it.

def decode_step_fixed(q_new, k_new, v_new, k_cache, v_cache, rope):
    pos = k_cache.shape[-2] + torch.arange(q_new.shape[-2])
    q_new, k_new = rope(q_new, pos), rope(k_new, pos)
    k_all, v_all = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    return F.scaled_dot_product_attention(q_new, k_all, v_all), k_all, v_all


def decode_step_buggy(q_new, k_new, v_new, k_cache, v_cache, rope):
    pos = torch.arange(q_new.shape[-2])                              # the bug: no offset
    q_new, k_new = rope(q_new, pos), rope(k_new, pos)
    k_all, v_all = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    return F.scaled_dot_product_attention(q_new, k_all, v_all), k_all, v_all


def decode_step_front(q_new, k_new, v_new, k_cache, v_cache, rope):
    pos = k_cache.shape[-2] + torch.arange(q_new.shape[-2])
    q_new, k_new = rope(q_new, pos), rope(k_new, pos)
    k_all, v_all = torch.cat([k_new, k_cache], dim=-2), torch.cat([v_new, v_cache], dim=-2)
    return F.scaled_dot_product_attention(q_new, k_all, v_all), k_all, v_all


def decode_step_rotate_all(q_new, k_new, v_new, k_cache, v_cache, rope):
    k_all, v_all = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    pos = torch.arange(k_all.shape[-2])
    k_all = rope(k_all, pos)                                         # rotates the cache a second time
    q_new = rope(q_new, pos[-1:])
    return F.scaled_dot_product_attention(q_new, k_all, v_all), k_all, v_all


def decode_step_causal(q_new, k_new, v_new, k_cache, v_cache, rope):
    pos = k_cache.shape[-2] + torch.arange(q_new.shape[-2])
    q_new, k_new = rope(q_new, pos), rope(k_new, pos)
    k_all, v_all = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    return F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True), k_all, v_all


RIGHT["decode_step"] = nb09.check_decode_step, decode_step_fixed


@pytest.mark.parametrize("wrong,fragment", [
    (decode_step_buggy, "bug class: RoPE without the position offset"),
    (decode_step_front, "bug class: cache order"),
    (decode_step_rotate_all, "bug class: double rotation"),
    (decode_step_causal, "bug class: is_causal=True with a cache"),
    (lambda *a: decode_step_fixed(*a)[0], "three things"),
])
def test_decode_step_diagnoses(wrong, fragment):
    expect_error(nb09.check_decode_step, wrong, fragment)


def gqa_fixed(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_buggy(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_half_fixed(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat(1, g, 1, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


RIGHT["gqa_attention"] = nb09.check_gqa_attention, gqa_fixed
RIGHT["gqa_attention_enable_gqa"] = (
    nb09.check_gqa_attention,
    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


@pytest.mark.parametrize("wrong,fragment", [
    (gqa_buggy, "bug class: repeat instead of repeat_interleave"),
    (gqa_half_fixed, "one of k and v"),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), "bug class: lost causal mask"),
    (lambda q, k, v: q, "differs from causal attention"),
    (lambda q, k, v: gqa_fixed(q, k, v)[:, :2], "shape"),
])
def test_gqa_attention_diagnoses(wrong, fragment):
    expect_error(nb09.check_gqa_attention, wrong, fragment)


def padded_fixed(mha, x, lengths):
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]     # (B, T) True = real token
    return mha(x, x, x, key_padding_mask=~keep)[0]


def padded_buggy(mha, x, lengths):
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return mha(x, x, x, key_padding_mask=keep)[0]


RIGHT["padded_self_attention"] = nb09.check_padded_self_attention, padded_fixed


@pytest.mark.parametrize("wrong,fragment", [
    (padded_buggy, "bug class: mask polarity"),
    (lambda mha, x, lengths: mha(x, x, x)[0], "bug class: no padding mask"),
    (lambda mha, x, lengths: x, "each sequence run alone"),
])
def test_padded_self_attention_diagnoses(wrong, fragment):
    expect_error(nb09.check_padded_self_attention, wrong, fragment)


def step_fixed(q, k, v, dropout_p, training):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p if training else 0.0, is_causal=True)


def step_buggy(q, k, v, dropout_p, training):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


RIGHT["attention_step"] = nb09.check_attention_step, step_fixed


@pytest.mark.parametrize("wrong,fragment", [
    (step_buggy, "bug class: SDPA dropout in eval mode"),
    (lambda q, k, v, p, training: F.scaled_dot_product_attention(q, k, v, is_causal=True), "dropout never applied"),
    (lambda q, k, v, p, training: F.scaled_dot_product_attention(q, k, v, dropout_p=p if training else 0.0),
     "bug class: lost causal mask"),
    (lambda q, k, v, p, training: v, "plain causal attention"),
])
def test_attention_step_diagnoses(wrong, fragment):
    expect_error(nb09.check_attention_step, wrong, fragment)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
