"""Checkers of notebooks 08 and 09: right answers pass, typical wrong answers get the right diagnosis."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import expect_error, right_and_not_attempted_test

from selfattn_lite import efficient as nb08_efficient
from selfattn_lite.course.memory import peak_memory
from selfattn_lite.exercises import ExerciseError, nb08, nb09
from selfattn_lite.masks import causal_mask


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


# ----------------------------------------------------------------------------- nb08: chunked_linear_attn

def chunked_right(q, k, v, chunk, *, last_chunk_stateless=False, no_mask_above=None):
    """Chunked causal linear attention, phi = elu + 1; the keywords plant mistakes."""
    B, n, m = q.shape
    S, z = torch.zeros(B, m, v.shape[-1]), torch.zeros(B, m, 1)
    out = []
    for c0 in range(0, n, chunk):
        fq, fk, vc = phi(q[:, c0:c0 + chunk]), phi(k[:, c0:c0 + chunk]), v[:, c0:c0 + chunk]
        a = fq @ fk.transpose(1, 2)
        if no_mask_above is None or chunk <= no_mask_above:
            a = a.tril()
        S_read, z_read = (S * 0, z * 0) if last_chunk_stateless and c0 + chunk > n else (S, z)
        out.append((fq @ S_read + a @ vc) / (fq @ z_read + a.sum(-1, keepdim=True)))
        S, z = S + fk.transpose(1, 2) @ vc, z + fk.sum(1)[..., None]
    return torch.cat(out, dim=1)


def chunked_einsum(q, k, v, chunk):
    """Another right answer: the state and its reads as einsums, the normaliser by elementwise products."""
    fq, fk = phi(q), phi(k)
    S, z = torch.zeros(q.shape[0], q.shape[-1], v.shape[-1]), torch.zeros(q.shape[0], q.shape[-1])
    out = []
    for c0 in range(0, q.shape[1], chunk):
        qc, kc, vc = fq[:, c0:c0 + chunk], fk[:, c0:c0 + chunk], v[:, c0:c0 + chunk]
        a = torch.einsum("bim,bjm->bij", qc, kc).tril()
        num = torch.einsum("bim,bmd->bid", qc, S) + torch.einsum("bij,bjd->bid", a, vc)
        den = (qc * z[:, None]).sum(-1, keepdim=True) + a.sum(-1, keepdim=True)
        out.append(num / den)
        S = S + torch.einsum("bjm,bjd->bmd", kc, vc)
        z = z + kc.sum(1)
    return torch.cat(out, dim=1)


RIGHT["chunked_linear_attention"] = nb08.check_chunked_linear_attention, chunked_right
RIGHT["chunked_linear_attention_einsum"] = nb08.check_chunked_linear_attention, chunked_einsum


@pytest.mark.parametrize("wrong,fragment", [
    (lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=True), "softmax attention"),
    (lambda q, k, v, c: quadratic(q, k, v, diagonal=k.shape[1]), "non-causal form"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, diagonal=-1), "its own key"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, diagonal=c), "later keys of its own chunk"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, state_first=True), "counted twice"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, intra=False), "numerator lacks"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, normalise=False), "normaliser is missing"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, norm_inter=False), "lacks the earlier chunks"),
    (lambda q, k, v, c: nb08._chunked_variant(q, k, v, c, norm_intra=False), "normaliser lacks the chunk's own"),
    (lambda q, k, v, c: chunked_right(q, k, v, c, last_chunk_stateless=True), "the chunk divides n"),
    (lambda q, k, v, c: chunked_right(q, k, v, c, no_mask_above=8), "wrong at chunk = 10"),
    (lambda q, k, v, c: quadratic(q, k, v), "forms the n x n matrix"),
    (lambda q, k, v, c: torch.cat([quadratic(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1])[:, -1:]
                                   for i in range(q.shape[1])], 1), "matmul FLOPs"),
    (lambda q, k, v, c: causal_linear_right(q, k, v), "token by token"),
    (lambda q, k, v, c: causal_linear_cumsum(q, k, v), "does not follow the chunk"),
    (lambda q, k, v, c: chunked_right(q, k, v, c)[:, :, :2], "shape"),
    (lambda q, k, v, c: chunked_right(q, k, v, c) * 1.1, "expected causal linear attention"),
    (lambda q, k, v, c: nb08_efficient.linear_attention(q, k, v, is_causal=True, chunk_size=c),
     "write the chunked loop yourself"),
])
def test_chunked_linear_attention_diagnoses(wrong, fragment):
    expect_error(nb08.check_chunked_linear_attention, wrong, fragment)


def test_chunked_flops_is_what_the_solution_counts():
    """The checker's FLOP formula is the matmuls of the chunked form, counted (chunk dividing n)."""
    from torch.utils.flop_counter import FlopCounterMode

    gen = torch.Generator().manual_seed(0)
    for n, m, dv, chunk in ((64, 8, 4, 16), (96, 4, 6, 32)):
        q, k, v = torch.randn(1, n, m, generator=gen), torch.randn(1, n, m, generator=gen), torch.randn(1, n, dv, generator=gen)
        with FlopCounterMode(display=False) as counter:
            chunked_einsum(q, k, v, chunk)
        assert counter.get_total_flops() == nb08._chunked_flops(n, m, dv, chunk)


# ----------------------------------------------------------------------------- nb08: causal_tiled_attention

def tiled(skip=True, diagonal_mask=True, rescale=True, subtract_max=True, scale=True, full_mask=False,
          bool_mask=False, in_place=False):
    """A causal tiled attention with online softmax; each flag off plants one mistake.

    ``in_place`` runs both tile products as ``Tensor.baddbmm_`` (which torch's FLOP counter alone misses).
    """
    def matmul(a, b):                                                    # (..., r, c) @ (..., c, s)
        if not in_place:
            return a @ b
        out = torch.zeros(*a.shape[:-1], b.shape[-1])
        out.view(-1, *out.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
        return out

    def causal_tiled_attention(q, k, v, block_size):
        n, d = q.shape[-2], q.shape[-1]
        out = torch.empty_like(q)
        big_mask = torch.ones(n, n).tril() if full_mask else None         # an n x n float mask: O(n^2) memory
        if bool_mask:                                                     # one n x n bool mask: n^2 bytes
            big_mask = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
        for q0 in range(0, n, block_size):
            q_blk = q[..., q0:q0 + block_size, :] / (math.sqrt(d) if scale else 1.0)
            rows = torch.arange(q0, q0 + q_blk.shape[-2])[:, None]
            m = torch.full(q_blk.shape[:-1], float("-inf"))
            l = torch.zeros(q_blk.shape[:-1])
            acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],))
            for k0 in range(0, q0 + q_blk.shape[-2] if skip else n, block_size):
                s = matmul(q_blk, k[..., k0:k0 + block_size, :].transpose(-2, -1))
                cols = torch.arange(k0, k0 + s.shape[-1])[None, :]
                if full_mask or bool_mask:
                    s = s.masked_fill(big_mask[q0:q0 + s.shape[-2], k0:k0 + s.shape[-1]] == 0, float("-inf"))
                elif diagonal_mask:
                    s = s.masked_fill(cols > rows, float("-inf"))
                m_new = torch.maximum(m, s.amax(-1)) if subtract_max else torch.zeros_like(m)
                p = torch.exp(s - m_new[..., None])
                factor = torch.exp(m - m_new) if (rescale and subtract_max) else torch.ones_like(m)
                l = l * factor + p.sum(-1)
                acc = acc * factor[..., None] + matmul(p, v[..., k0:k0 + block_size, :])
                m = m_new
            out[..., q0:q0 + block_size, :] = acc / l[..., None]
        return out
    return causal_tiled_attention


def check_tiled_with_memory(fn):
    nb08.check_causal_tiled(fn, peak_memory)


RIGHT["causal_tiled"] = nb08.check_causal_tiled, tiled()
RIGHT["causal_tiled_memory"] = check_tiled_with_memory, tiled()
RIGHT["causal_tiled_in_place"] = nb08.check_causal_tiled, tiled(in_place=True)


@pytest.mark.parametrize("wrong,fragment", [
    (tiled(skip=False), "tiles' worth of matmuls"),
    (tiled(skip=False, in_place=True), "tiles' worth of matmuls"),       # baddbmm_ is counted too
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


@pytest.mark.parametrize("flag", ["full_mask", "bool_mask"])
def test_causal_tiled_memory_catches_an_n_by_n_mask(flag):
    # a float mask (4 bytes an entry) and a boolean one from arange comparisons (1 byte an entry): both O(n^2)
    expect_error(check_tiled_with_memory, tiled(**{flag: True}), "grows like n^2")
    nb08.check_causal_tiled(tiled(**{flag: True}))            # without the memory measurement it passes


# ----------------------------------------------------------------------------- nb09: the fixed snippets
# Each wrong answer below is the notebook's buggy snippet, or a plausible half-fix of it.

def window_chunk_fixed(q_new, k_all, v_all, window):
    n_new, n_all = q_new.shape[-2], k_all.shape[-2]
    i = n_all - n_new + torch.arange(n_new)[:, None]                   # (n_new, 1) query positions
    j = torch.arange(n_all)[None, :]                                   # (1, n_all) key positions
    mask = (j <= i) & (i - j < window)
    return F.scaled_dot_product_attention(q_new, k_all, v_all, attn_mask=mask)


def window_chunk_additive(q_new, k_all, v_all, window):
    """Another right answer: a float mask (-inf outside the band) on the bottom-right causal mask."""
    n_new, n_all = q_new.shape[-2], k_all.shape[-2]
    inside = causal_mask(n_new, n_all, bottom_right=True) & ~causal_mask(n_new, n_all, bottom_right=True).tril(
        n_all - n_new - window)
    mask = torch.zeros(n_new, n_all).masked_fill(~inside, float("-inf"))
    return F.scaled_dot_product_attention(q_new, k_all, v_all, attn_mask=mask)


def window_variant(offset=True, width=0, causal=True, invert=False, hard_coded=False):
    """The stub is window_variant(offset=False, width=1): top-left positions and i - j <= window."""
    def fn(q_new, k_all, v_all, window):
        n_new, n_all = q_new.shape[-2], k_all.shape[-2]
        start = (6 if hard_coded else n_all - n_new) if offset else 0
        i = start + torch.arange(n_new)[:, None]
        j = torch.arange(n_all)[None, :]
        mask = (i - j < window + width) & ((j <= i) if causal else True)
        return F.scaled_dot_product_attention(q_new, k_all, v_all, attn_mask=~mask if invert else mask)
    return fn


RIGHT["window_chunk"] = nb09.check_window_chunk, window_chunk_fixed
RIGHT["window_chunk_additive"] = nb09.check_window_chunk, window_chunk_additive


@pytest.mark.parametrize("wrong,fragment", [
    (window_variant(offset=False, width=1), "bug class: a mask aligned top-left"),       # the stub
    (window_variant(offset=False), "bug class: a mask aligned top-left"),
    (lambda q, k, v, w: F.scaled_dot_product_attention(q, k, v, is_causal=True), "bug class: a mask aligned top-left"),
    (window_variant(width=1), "bug class: a window one too wide"),
    (window_variant(width=-1), "bug class: a window one too narrow"),
    (window_variant(width=100), "bug class: no window"),
    (window_variant(causal=False), "bug class: the future is visible"),
    (lambda q, k, v, w: F.scaled_dot_product_attention(q, k, v), "bug class: the future is visible"),
    (window_variant(invert=True), "bug class: mask polarity"),
    (window_variant(hard_coded=True), "not from these sizes"),
    (lambda q, k, v, w: (window_chunk_fixed(q, k, v, w), k), "should be a torch.Tensor"),
])
def test_window_chunk_diagnoses(wrong, fragment):
    expect_error(nb09.check_window_chunk, wrong, fragment)


def _keep(k, lengths):
    return torch.arange(k.shape[-2])[None, :] < lengths[:, None]                      # (B, S) True = real key


def padded_sdpa_fixed(q, k, v, lengths):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_keep(k, lengths)[:, None, None, :])


def padded_sdpa_log(q, k, v, lengths):
    """Another right answer: the additive form, 0 for a real key and -inf for padding."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_keep(k, lengths).float().log()[:, None, None, :])


RIGHT["padded_sdpa"] = nb09.check_padded_sdpa, padded_sdpa_fixed
RIGHT["padded_sdpa_log"] = nb09.check_padded_sdpa, padded_sdpa_log


def _manual_inverted(q, k, v, lengths):
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(_keep(k, lengths)[:, None, None, :],
                                                                          float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("wrong,fragment", [
    (lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, attn_mask=_keep(k, n).float()[:, None, None, :]),
     "bug class: a float mask read as a boolean one"),                                                   # the stub
    (lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v), "bug class: a float mask read as a boolean one"),
    (lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, attn_mask=~_keep(k, n)[:, None, None, :]),
     "bug class: mask polarity"),
    (_manual_inverted, "bug class: fully masked rows"),
    (lambda q, k, v, n: q, "each sequence run alone"),
    (lambda q, k, v, n: padded_sdpa_fixed(q, k, v, n)[:, :1], "shape"),
])
def test_padded_sdpa_diagnoses(wrong, fragment):
    expect_error(nb09.check_padded_sdpa, wrong, fragment)


def mha_scaled(divisor):
    def fn(x, w_qkv, n_heads):
        B, T, d_model = x.shape
        q, k, v = (t.reshape(B, T, n_heads, -1).transpose(1, 2) for t in (x @ w_qkv).chunk(3, dim=-1))
        scores = q @ k.transpose(-2, -1) / divisor(d_model, n_heads)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, d_model)
    return fn


def mha_sdpa(x, w_qkv, n_heads):
    """Another right answer: torch's SDPA, whose default scale is 1/sqrt(q.shape[-1])."""
    B, T, d_model = x.shape
    q, k, v = (t.reshape(B, T, n_heads, -1).transpose(1, 2) for t in (x @ w_qkv).chunk(3, dim=-1))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d_model)


RIGHT["multi_head_attention"] = nb09.check_multi_head_attention, mha_scaled(lambda d, h: math.sqrt(d // h))
RIGHT["multi_head_attention_sdpa"] = nb09.check_multi_head_attention, mha_sdpa


def mha_unmasked(x, w_qkv, n_heads):
    B, T, d_model = x.shape
    q, k, v = (t.reshape(B, T, n_heads, -1).transpose(1, 2) for t in (x @ w_qkv).chunk(3, dim=-1))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, d_model)


@pytest.mark.parametrize("wrong,fragment", [
    (mha_scaled(lambda d, h: math.sqrt(d)), "sqrt(d_model)"),                                          # the stub
    (mha_scaled(lambda d, h: 1.0), "nothing"),
    (mha_scaled(lambda d, h: d // h), "by d_head"),
    (mha_unmasked, "bug class: lost causal mask"),
    (lambda x, w, h: x, "differs from causal multi-head attention"),
])
def test_multi_head_attention_diagnoses(wrong, fragment):
    expect_error(nb09.check_multi_head_attention, wrong, fragment)


def padded_fixed(mha, x, lengths):
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]     # (B, T) True = real token
    return mha(x, x, x, key_padding_mask=~keep)[0]


def padded_float(mha, x, lengths):
    """Another right answer: a float key_padding_mask, -inf on the padding."""
    pad = torch.arange(x.shape[1])[None, :] >= lengths[:, None]
    return mha(x, x, x, key_padding_mask=torch.zeros(pad.shape).masked_fill(pad, float("-inf")))[0]


def padded_buggy(mha, x, lengths):
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return mha(x, x, x, key_padding_mask=keep)[0]


RIGHT["padded_self_attention"] = nb09.check_padded_self_attention, padded_fixed
RIGHT["padded_self_attention_float"] = nb09.check_padded_self_attention, padded_float


@pytest.mark.parametrize("wrong,fragment", [
    (padded_buggy, "bug class: mask polarity"),
    (lambda mha, x, lengths: mha(x, x, x)[0], "bug class: no padding mask"),
    (lambda mha, x, lengths: x, "each sequence run alone"),
])
def test_padded_self_attention_diagnoses(wrong, fragment):
    expect_error(nb09.check_padded_self_attention, wrong, fragment)


# ---------------------------------------------------------------- nb09 exercise 3: write the property test

def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 6, 8, generator=g) for _ in range(3))


def leaks_future_right(attn):
    q, k, v = _qkv()
    out = attn(q, k, v)
    g = torch.Generator().manual_seed(1)
    for t in range(1, 6):                                              # change every token from t on
        moved = [x.clone() for x in (q, k, v)]
        for x in moved:
            x[:, t:] += torch.randn(x[:, t:].shape, generator=g)
        if not torch.allclose(attn(*moved)[:, :t], out[:, :t], atol=1e-6):
            return True
    return False


def leaks_future_each_position(attn):
    """Another right answer: change one later token at a time, by a large amount."""
    q, k, v = _qkv(3)
    out = attn(q, k, v)
    for t in range(1, 6):
        moved = [x.clone() for x in (q, k, v)]
        for x in moved:
            x[:, t] = -x[:, t] + 5.0
        if (attn(*moved)[:, :t] - out[:, :t]).abs().max() > 1e-5:
            return True
    return False


def leaks_values_only(attn):                                          # misses the leak through the queries
    q, k, v = _qkv()
    out = attn(q, k, v)
    for t in range(1, 6):
        v2 = v.clone()
        v2[:, t:] += 1.0
        if not torch.allclose(attn(q, k, v2)[:, :t], out[:, :t], atol=1e-6):
            return True
    return False


def leaks_row0_last_token(attn):                                      # pitfall 3's recipe, with q, k and v
    q, k, v = _qkv()
    moved = [x.clone() for x in (q, k, v)]
    for x in moved:
        x[:, -1] += 10.0
    return not torch.allclose(attn(*moved)[:, 0], attn(q, k, v)[:, 0], atol=1e-6)


def leaks_whole_output(attn):                                         # compares the rows at and after the change
    q, k, v = _qkv()
    v2 = v.clone()
    v2[:, -1] += 1.0
    return not torch.allclose(attn(q, k, v2), attn(q, k, v))


def leaks_unlike_sdpa(attn):                                          # a reference comparison, not the property
    q, k, v = _qkv()
    return not torch.allclose(attn(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-4)


RIGHT["leaks_future"] = nb09.check_leaks_future, leaks_future_right
RIGHT["leaks_future_each_position"] = nb09.check_leaks_future, leaks_future_each_position


@pytest.mark.parametrize("wrong,fragment", [
    (leaks_values_only, "leak through the queries"),
    (leaks_row0_last_token, "only the *next* one"),
    (leaks_whole_output, "is correct"),
    (leaks_unlike_sdpa, "differing from a reference is not a leak"),
    (lambda attn: False, "no mask at all"),
    (lambda attn: True, "is correct"),
    (lambda attn: "yes", "should return True or False"),
])
def test_leaks_future_diagnoses(wrong, fragment):
    expect_error(nb09.check_leaks_future, wrong, fragment)


def test_no_message_prints_the_fixed_line():
    """The checkers name the bug class for the untouched stubs; they do not hand out the corrected code."""
    messages = []
    for wrong, checker in ((window_variant(offset=False, width=1), nb09.check_window_chunk),
                           (lambda q, k, v, n: F.scaled_dot_product_attention(
                               q, k, v, attn_mask=_keep(k, n).float()[:, None, None, :]), nb09.check_padded_sdpa),
                           (mha_scaled(lambda d, h: math.sqrt(d)), nb09.check_multi_head_attention),
                           (padded_buggy, nb09.check_padded_self_attention)):
        with pytest.raises(ExerciseError) as info:
            checker(wrong)
        messages.append(str(info.value))
    for message in messages:
        for fix in ("torch.arange(", "bottom_right=True", "i - j < window", "n_all - n_new", ".bool()", "d_model // n_heads", "~keep", "sqrt(d_head)"):
            assert fix not in message, (fix, message)


test_right_and_not_attempted = right_and_not_attempted_test(RIGHT, stub)
