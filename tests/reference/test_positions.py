"""selfattn_lite.positions against the papers' formulas and against reference code nobody here wrote.

References: Hugging Face transformers (rope init functions, Llama's rotate_half, GPT-J's
interleaved rotation and sinusoids, BLOOM's ALiBi), and formulas written out from the
papers: Vaswani et al. 2017, RoFormer (Su et al.), position interpolation (Chen et al.),
NTK-aware scaling (bloc97), YaRN (Peng et al.), Llama 3.1's apply_scaling, ALiBi (Press et al.).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply_rotary
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary

from selfattn_lite.positions import (
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    permute_qk_rows,
    rope_inv_freq,
    scaled_inv_freq,
    sinusoidal_encoding,
)
from selfattn_lite.rope_scaling import llama3_inv_freq, ntk_base, validate_scaling, yarn_attention_scaling, yarn_keep

logging.getLogger("transformers").setLevel(logging.ERROR)  # config validation chatter

HEAD_DIMS = (4, 8, 16, 64, 128)
BASES = (10000.0, 500000.0)
FACTORS = (1.5, 2.0, 4.0, 8.0, 32.0)
ORIGINAL_LENS = (256, 2048, 8192)


def hf_config(head_dim: int, rope_parameters: dict, max_position_embeddings: int = 1 << 20) -> LlamaConfig:
    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_position_embeddings, rope_parameters=rope_parameters)


def hf_inv_freq(head_dim: int, rope_parameters: dict, max_position_embeddings: int = 1 << 20, **kwargs):
    config = hf_config(head_dim, rope_parameters, max_position_embeddings)
    kind = rope_parameters["rope_type"]
    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config, **kwargs)


def turns(inv_freq: torch.Tensor, original_max_len: int) -> torch.Tensor:
    """r_i = L / lambda_i: how many full turns pair i makes over the original context."""
    return original_max_len * inv_freq.double() / (2 * math.pi)


# --------------------------------------------------------------------------------------
# Sinusoidal encoding
# --------------------------------------------------------------------------------------

def test_sinusoidal_matches_the_paper_formula():
    n, d = 12, 10
    pe = sinusoidal_encoding(n, d)
    expected = torch.empty(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(d // 2):
            expected[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / d))
            expected[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d))
    assert pe.shape == (n, d) and pe.dtype == torch.float32
    torch.testing.assert_close(pe, expected.float())


def test_sinusoidal_matches_gptj_reference_up_to_layout():
    # GPT-J stores all sines, then all cosines; we interleave them as the paper does.
    pe = sinusoidal_encoding(64, 32)
    ref = create_sinusoidal_positions(64, 32)
    torch.testing.assert_close(pe[:, 0::2], ref[:, :16])
    torch.testing.assert_close(pe[:, 1::2], ref[:, 16:])


def test_sinusoidal_offset_is_a_linear_map():
    # The paper's motivation: PE[m + k] is a fixed rotation of PE[m], the same for every m.
    pe = sinusoidal_encoding(40, 8).double()
    k = 5
    theta = 10000.0 ** (-torch.arange(4, dtype=torch.float64) * 2 / 8) * k
    c, s = theta.cos(), theta.sin()
    sin_m, cos_m = pe[:-k, 0::2], pe[:-k, 1::2]
    torch.testing.assert_close(pe[k:, 0::2], sin_m * c + cos_m * s)
    torch.testing.assert_close(pe[k:, 1::2], cos_m * c - sin_m * s)


@pytest.mark.parametrize("args, match", [
    ((0, 8), "n_positions"), ((4, 7), "d_model must be a positive even int.*got 7"), ((4, 0), "d_model"),
    ((4.0, 8), "n_positions"),
])
def test_sinusoidal_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_encoding(*args)


# --------------------------------------------------------------------------------------
# Frequencies: default and context extension, against papers and transformers
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
def test_default_inv_freq(head_dim, base):
    ours = rope_inv_freq(head_dim, base)
    paper = torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float32)
    torch.testing.assert_close(ours, paper)
    ref, scaling = hf_inv_freq(head_dim, {"rope_type": "default", "rope_theta": base})
    torch.testing.assert_close(ours, ref)
    rope = RotaryEmbedding(head_dim, base)
    assert rope.inv_freq.shape == (head_dim // 2,) and rope.attention_scaling == scaling == 1.0


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("factor", FACTORS)
def test_linear_matches_transformers_and_position_interpolation(head_dim, factor):
    rope = RotaryEmbedding(head_dim, scaling={"kind": "linear", "factor": factor})
    ref, scaling = hf_inv_freq(head_dim, {"rope_type": "linear", "rope_theta": 10000.0, "factor": factor})
    torch.testing.assert_close(rope.inv_freq, ref)
    assert rope.attention_scaling == scaling == 1.0
    # Chen et al.: position m of the long sequence is read as m / s by the original model.
    m = torch.arange(0, 4000, 37, dtype=torch.float64)
    angles = m[:, None] * rope.inv_freq.double()
    original = (m / factor)[:, None] * rope_inv_freq(head_dim).double()
    torch.testing.assert_close(angles, original, rtol=1e-6, atol=1e-6)


def test_linear_rotation_at_s_times_m_equals_original_rotation_at_m():
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)
    plain, linear = RotaryEmbedding(16), RotaryEmbedding(16, scaling={"kind": "linear", "factor": 4})
    positions = torch.arange(7) * 5
    torch.testing.assert_close(linear(x.float(), positions * 4), plain(x.float(), positions))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", FACTORS)
def test_ntk_matches_formula_and_transformers_dynamic(head_dim, base, factor):
    rope = RotaryEmbedding(head_dim, base, scaling={"kind": "ntk", "factor": factor})
    new_base = base * factor ** (head_dim / (head_dim - 2))        # bloc97 / YaRN paper eq. (NTK-aware)
    assert ntk_base(base, factor, head_dim) == pytest.approx(new_base, rel=1e-12)
    torch.testing.assert_close(rope.inv_freq, rope_inv_freq(head_dim, new_base))
    assert rope.attention_scaling == 1.0
    # transformers' dynamic NTK recomputes the base at each length T past the trained M:
    # b * (s T / M - (s - 1))^(d/(d-2)). With s = 1 at T = factor * M it is the static one.
    M = 1024
    ref, _ = hf_inv_freq(head_dim, {"rope_type": "dynamic", "rope_theta": base, "factor": 1.0}, M,
                         seq_len=int(factor * M))
    torch.testing.assert_close(rope.inv_freq, ref)


@pytest.mark.parametrize("factor, seq_len", [(2.0, 1536), (4.0, 1792), (8.0, 1920)])
def test_ntk_matches_dynamic_with_its_own_factor_at_the_matching_length(factor, seq_len):
    # s T / M - (s - 1) = s  <=>  T = M (2s - 1) / s.
    M = 1024
    assert factor * seq_len / M - (factor - 1) == factor
    ref, _ = hf_inv_freq(64, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": factor}, M, seq_len=seq_len)
    torch.testing.assert_close(RotaryEmbedding(64, scaling={"kind": "ntk", "factor": factor}).inv_freq, ref)


@pytest.mark.parametrize("head_dim", (8, 64, 128))
def test_ntk_divides_lowest_frequency_by_factor_and_keeps_highest(head_dim):
    factor = 8.0
    plain = rope_inv_freq(head_dim).double()
    ntk, _ = scaled_inv_freq(head_dim, scaling={"kind": "ntk", "factor": factor})
    assert ntk[0].item() == 1.0
    # theta_last = b'^(-(d-2)/d) = b^(-(d-2)/d) / s
    torch.testing.assert_close(ntk[-1].double(), plain[-1] / factor, rtol=1e-5, atol=0)
    assert torch.all(ntk.double() <= plain * (1 + 1e-6)) and torch.all(ntk.double() >= plain / factor * (1 - 1e-6))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("original_max_len", ORIGINAL_LENS)
def test_yarn_matches_transformers(head_dim, base, factor, original_max_len):
    rope = RotaryEmbedding(head_dim, base, scaling={"kind": "yarn", "factor": factor,
                                                    "original_max_len": original_max_len})
    ref, scaling = hf_inv_freq(head_dim, {"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                          "original_max_position_embeddings": original_max_len},
                               int(original_max_len * factor))
    torch.testing.assert_close(rope.inv_freq, ref)
    assert rope.attention_scaling == pytest.approx(scaling, rel=1e-12)


@pytest.mark.parametrize("beta_fast, beta_slow", [(32, 1), (16, 2), (64, 0.5), (8, 4)])
def test_yarn_betas_match_transformers(beta_fast, beta_slow):
    scaling = {"kind": "yarn", "factor": 16.0, "original_max_len": 4096, "beta_fast": beta_fast,
               "beta_slow": beta_slow}
    ours, s = scaled_inv_freq(128, 1e6, scaling)
    ref, t = hf_inv_freq(128, {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "beta_fast": beta_fast,
                               "beta_slow": beta_slow, "original_max_position_embeddings": 4096}, 65536)
    torch.testing.assert_close(ours, ref)
    assert s == pytest.approx(t)


@pytest.mark.parametrize("head_dim", (16, 64, 128))
@pytest.mark.parametrize("factor", (2.0, 8.0, 32.0))
@pytest.mark.parametrize("original_max_len", ORIGINAL_LENS)
def test_yarn_agrees_with_the_paper_outside_the_ramp(head_dim, factor, original_max_len):
    # YaRN paper: r(d) = L / lambda_d; gamma = 1 if r > beta, 0 if r < alpha (alpha = 1, beta = 32);
    # h(theta_d) = (1 - gamma) theta_d / s + gamma theta_d.
    alpha, beta = 1.0, 32.0
    plain = rope_inv_freq(head_dim)
    ours, mscale = scaled_inv_freq(head_dim, scaling={"kind": "yarn", "factor": factor,
                                                      "original_max_len": original_max_len})
    r = turns(plain, original_max_len)
    keep, interpolate = r > beta, r < alpha
    torch.testing.assert_close(ours[keep], plain[keep])
    torch.testing.assert_close(ours[interpolate], plain[interpolate] / factor)
    between = ~(keep | interpolate)
    assert torch.all(ours[between] <= plain[between] * (1 + 1e-6))
    assert torch.all(ours[between] >= plain[between] / factor * (1 - 1e-6))
    # the ramp decreases from 1 (fast pairs) to 0 (slow pairs)
    gamma = yarn_keep(head_dim, 10000.0, original_max_len)
    assert torch.all(gamma[1:] <= gamma[:-1])
    # temperature: sqrt(1/t) = 0.1 ln(s) + 1 multiplies cos and sin, so the scores get 1/t
    assert mscale == pytest.approx(0.1 * math.log(factor) + 1.0)
    assert yarn_attention_scaling(1.0) == 1.0


def test_yarn_cos_sin_match_transformers_rotary_module():
    params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}
    hf = LlamaRotaryEmbedding(hf_config(32, params, 2048))
    rope = RotaryEmbedding(32, scaling={"kind": "yarn", "factor": 4.0, "original_max_len": 512})
    positions = torch.tensor([[0, 1, 2, 700, 1500, 2047]])
    cos_ref, sin_ref = hf(torch.zeros(1, dtype=torch.float32), positions)     # (1, T, d), halves repeated
    cos, sin = rope.angles(positions)                                        # (1, T, d/2)
    torch.testing.assert_close(cos_ref[..., :16], cos, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin_ref[..., :16], sin, rtol=1e-5, atol=1e-5)


def meta_llama3_apply_scaling(freqs, scale_factor, low_freq_factor, high_freq_factor, old_context_len):
    """Llama 3.1's frequency scaling written as in Meta's release, one frequency at a time."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=torch.float32)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("original_max_len", ORIGINAL_LENS)
def test_llama3_matches_meta_and_transformers(head_dim, base, factor, original_max_len):
    scaling = {"kind": "llama3", "factor": factor, "original_max_len": original_max_len}
    rope = RotaryEmbedding(head_dim, base, scaling=scaling)
    meta = meta_llama3_apply_scaling(rope_inv_freq(head_dim, base), factor, 1.0, 4.0, original_max_len)
    torch.testing.assert_close(rope.inv_freq, meta)
    ref, s = hf_inv_freq(head_dim, {"rope_type": "llama3", "rope_theta": base, "factor": factor,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": original_max_len},
                         int(original_max_len * factor))
    torch.testing.assert_close(rope.inv_freq, ref)
    assert rope.attention_scaling == s == 1.0


def test_llama3_real_config_and_custom_factors():
    # Llama 3.1 8B: head_dim 128, base 500000, factor 8, low 1, high 4, original 8192.
    ours = llama3_inv_freq(rope_inv_freq(128, 500000.0), 8.0, 8192, 1.0, 4.0)
    meta = meta_llama3_apply_scaling(rope_inv_freq(128, 500000.0), 8.0, 1.0, 4.0, 8192)
    torch.testing.assert_close(ours, meta)
    scaling = {"kind": "llama3", "factor": 32.0, "original_max_len": 8192, "low_freq_factor": 2.0,
               "high_freq_factor": 8.0}
    ref, _ = hf_inv_freq(128, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                               "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                               "original_max_position_embeddings": 8192}, 8192 * 32)
    torch.testing.assert_close(scaled_inv_freq(128, 500000.0, scaling)[0], ref)


def test_llama3_is_the_yarn_paper_ramp_with_alpha_1_beta_4():
    plain = rope_inv_freq(128, 500000.0)
    r = turns(plain, 8192)
    gamma = ((r - 1.0) / (4.0 - 1.0)).clamp(0, 1).float()
    paper = (1 - gamma) * plain / 8.0 + gamma * plain
    torch.testing.assert_close(scaled_inv_freq(128, 500000.0, {"kind": "llama3", "factor": 8.0,
                                                               "original_max_len": 8192})[0], paper)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "llama3"])
def test_factor_one_changes_nothing(kind):
    scaling = {"kind": kind, "factor": 1.0}
    if kind in ("yarn", "llama3"):
        scaling["original_max_len"] = 1024
    inv_freq, attention_scaling = scaled_inv_freq(64, 10000.0, scaling)
    torch.testing.assert_close(inv_freq, rope_inv_freq(64))
    assert attention_scaling == 1.0


# --------------------------------------------------------------------------------------
# Applying the rotation
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("scaling", [None, {"kind": "linear", "factor": 2.0}, {"kind": "ntk", "factor": 4.0},
                                     {"kind": "yarn", "factor": 4.0, "original_max_len": 64},
                                     {"kind": "llama3", "factor": 8.0, "original_max_len": 64}])
def test_half_split_matches_transformers_llama(scaling):
    torch.manual_seed(0)
    B, h, T, d = 2, 3, 9, 16
    q, k = torch.randn(B, h, T, d), torch.randn(B, h, T, d)
    position_ids = torch.stack([torch.arange(T), torch.arange(T) + 100])        # (B, T): two offsets
    rope = RotaryEmbedding(d, scaling=scaling)
    cos = torch.cat([rope.angles(position_ids)[0]] * 2, dim=-1)                 # HF layout (B, T, d)
    sin = torch.cat([rope.angles(position_ids)[1]] * 2, dim=-1)
    q_ref, k_ref = llama_apply_rotary(q, k, cos, sin)
    torch.testing.assert_close(rope(q, position_ids), q_ref)
    torch.testing.assert_close(rope(k, position_ids), k_ref)
    # and with transformers computing cos/sin itself (default and linear rope)
    if scaling is None or scaling["kind"] == "linear":
        params = {"rope_type": "default", "rope_theta": 10000.0} if scaling is None else \
            {"rope_type": "linear", "rope_theta": 10000.0, "factor": scaling["factor"]}
        cos_hf, sin_hf = LlamaRotaryEmbedding(hf_config(d, params, 4096))(q, position_ids)
        q_ref, k_ref = llama_apply_rotary(q, k, cos_hf, sin_hf)
        torch.testing.assert_close(rope(q, position_ids), q_ref)
        torch.testing.assert_close(rope(k, position_ids), k_ref)


def test_interleaved_matches_gptj_and_complex_multiplication():
    torch.manual_seed(1)
    B, T, h, d = 2, 7, 3, 8
    x = torch.randn(B, T, h, d)                                     # GPT-J layout (B, T, h, d)
    positions = torch.arange(T) + 3
    rope = RotaryEmbedding(d, interleaved=True)
    cos, sin = rope.angles(positions)                              # (T, d/2)
    ref = gptj_apply_rotary(x, sin[None].expand(B, T, d // 2), cos[None].expand(B, T, d // 2))
    ours = rope(x.transpose(1, 2), positions).transpose(1, 2)       # we take (B, h, T, d)
    torch.testing.assert_close(ours, ref)
    # Meta / RoFormer: pairs are complex numbers, multiplied by e^(i m theta)
    z = torch.view_as_complex(x.transpose(1, 2).double().reshape(B, h, T, d // 2, 2).contiguous())
    angles = positions[:, None].double() * rope.inv_freq.double()
    rotated = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    torch.testing.assert_close(ours.transpose(1, 2), rotated.float())


def test_half_split_matches_complex_multiplication_on_halves():
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    positions = torch.tensor([0, 4, 9, 50, 1000])
    rope = RotaryEmbedding(12)
    z = torch.complex(x[..., :6], x[..., 6:])
    angles = positions[:, None].double() * rope.inv_freq.double()
    rotated = z * torch.polar(torch.ones_like(angles), angles)
    torch.testing.assert_close(rope(x, positions), torch.cat([rotated.real, rotated.imag], -1),
                               rtol=1e-5, atol=1e-5)


positions_st = st.lists(st.integers(0, 5000), min_size=1, max_size=6)


@given(head_dim=st.sampled_from([2, 4, 8, 32]), positions=positions_st, interleaved=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rotation_preserves_norms(head_dim, positions, interleaved, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, len(positions), head_dim, generator=g, dtype=torch.float64)
    y = RotaryEmbedding(head_dim, interleaved=interleaved)(x, torch.tensor(positions))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # and pair by pair: every 2D pair keeps its length
    pairs = (lambda t: t.unflatten(-1, (-1, 2))) if interleaved else (lambda t: t.unflatten(-1, (2, -1)).transpose(-1, -2))
    torch.testing.assert_close(pairs(y).norm(dim=-1), pairs(x).norm(dim=-1))


@given(head_dim=st.sampled_from([2, 8, 64]), interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_identity_at_position_zero(head_dim, interleaved, seed):
    x = torch.randn(3, 4, 5, head_dim, generator=torch.Generator().manual_seed(seed))
    y = RotaryEmbedding(head_dim, interleaved=interleaved)(x, torch.zeros(5, dtype=torch.long))
    assert torch.equal(y, x)


@given(offset=st.integers(-300, 300), shift=st.integers(0, 3000), head_dim=st.sampled_from([4, 16, 64]),
       interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_relative_property(offset, shift, head_dim, interleaved, seed):
    """q_m . k_n depends on m - n only: shifting both positions changes nothing."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(head_dim, generator=g, dtype=torch.float64), torch.randn(head_dim, generator=g,
                                                                                  dtype=torch.float64)
    rope = RotaryEmbedding(head_dim, interleaved=interleaved)
    m, n = 400 + offset, 400
    score = rope(q[None], torch.tensor([m])) @ rope(k[None], torch.tensor([n])).T
    shifted = rope(q[None], torch.tensor([m + shift])) @ rope(k[None], torch.tensor([n + shift])).T
    torch.testing.assert_close(score, shifted, rtol=1e-4, atol=1e-4)


def test_relative_property_many_offsets_at_once():
    torch.manual_seed(2)
    rope = RotaryEmbedding(32)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    positions = torch.arange(256)
    Q = rope(q.expand(256, 32), positions)                  # q at every position
    K = rope(k.expand(256, 32), positions)                  # k at every position
    scores = Q @ K.T                                        # (256, 256): scores[m, n] = q_m . k_n
    for offset in range(-255, 256):
        diagonal = scores.diagonal(-offset)                 # all (m, n) with m - n = offset
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-9, atol=1e-9)


def test_rotations_compose():
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    rope = RotaryEmbedding(16)
    m, n = torch.arange(6) * 3, torch.arange(6) + 11
    torch.testing.assert_close(rope(rope(x, m), n), rope(x, m + n))


@given(head_dim=st.sampled_from([2, 4, 16, 64]), seed=st.integers(0, 2**16))
def test_conventions_are_equal_under_the_permutation(head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, head_dim, generator=g, dtype=torch.float64)
    positions = torch.randint(0, 4000, (5,), generator=g)
    p = interleaved_to_half_permutation(head_dim)
    half, inter = RotaryEmbedding(head_dim), RotaryEmbedding(head_dim, interleaved=True)
    torch.testing.assert_close(half(x[..., p], positions), inter(x, positions)[..., p])
    inverse = half_to_interleaved_permutation(head_dim)
    torch.testing.assert_close(x[..., p][..., inverse], x)


def hf_conversion_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' convert_llama_weights_to_hf.py permute(): Meta (interleaved) -> HF (half-split)."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


@pytest.mark.parametrize("n_heads, head_dim, d_in", [(1, 2, 3), (4, 8, 32), (2, 64, 16)])
def test_permute_qk_rows_matches_conversion_script_and_keeps_scores(n_heads, head_dim, d_in):
    torch.manual_seed(3)
    Wq, Wk = torch.randn(n_heads * head_dim, d_in), torch.randn(n_heads * head_dim, d_in)
    Wq_half, Wk_half = permute_qk_rows(Wq, n_heads), permute_qk_rows(Wk, n_heads)
    torch.testing.assert_close(Wq_half, hf_conversion_permute(Wq, n_heads))
    torch.testing.assert_close(permute_qk_rows(Wq_half, n_heads, to="interleaved"), Wq)

    x, T = torch.randn(2, 11, d_in), 11
    positions = torch.arange(T) + 40

    def scores(Wq, Wk, interleaved):
        rope = RotaryEmbedding(head_dim, interleaved=interleaved)
        q = (x @ Wq.T).unflatten(-1, (n_heads, head_dim)).transpose(1, 2)    # (B, h, T, d)
        k = (x @ Wk.T).unflatten(-1, (n_heads, head_dim)).transpose(1, 2)
        return rope(q, positions) @ rope(k, positions).transpose(-2, -1)     # (B, h, T, T)

    meta = scores(Wq, Wk, interleaved=True)
    torch.testing.assert_close(scores(Wq_half, Wk_half, interleaved=False), meta, rtol=1e-4, atol=1e-4)
    # without the permutation the half-split model computes something else (for head_dim > 2)
    assert head_dim == 2 or not torch.allclose(scores(Wq, Wk, interleaved=False), meta, rtol=1e-3, atol=1e-3)


def test_permute_qk_rows_bias():
    b = torch.arange(16.0)
    torch.testing.assert_close(permute_qk_rows(b, 2), torch.tensor([0., 2, 4, 6, 1, 3, 5, 7,
                                                                     8, 10, 12, 14, 9, 11, 13, 15]))


def test_batched_positions_and_cache_decoding():
    torch.manual_seed(4)
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 10, 8)                                   # (B, h, T, d)
    full = rope(x, torch.arange(10))
    # decoding: the prefix of 7 tokens is cached, then 3 new tokens come at their true positions
    prefix = rope(x[:, :, :7], torch.arange(7))
    new = rope(x[:, :, 7:], torch.arange(7, 10))
    torch.testing.assert_close(torch.cat([prefix, new], dim=2), full)
    assert not torch.allclose(rope(x[:, :, 7:], torch.arange(3)), full[:, :, 7:])   # the classic bug
    # (B, T) positions: each sequence its own offset; (1, T) broadcasts
    per_row = rope(x, torch.stack([torch.arange(10), torch.arange(10) + 5]))
    torch.testing.assert_close(per_row[0], full[0])
    torch.testing.assert_close(per_row[1], rope(x[1], torch.arange(10) + 5))
    torch.testing.assert_close(rope(x, torch.arange(10)[None]), full)
    torch.testing.assert_close(rope(x), full)                      # default positions 0 .. T-1
    torch.testing.assert_close(rope(x[0, 0], torch.arange(10)), full[0, 0])     # (T, d) input


def test_angles_passed_in_rotate_like_angles_computed_inside():
    """rope(x, p, angles=rope.angles(p)) is rope(x, p) bit for bit; angles of other shapes or dtypes are refused."""
    rope = RotaryEmbedding(8, scaling={"kind": "yarn", "factor": 2.0, "original_max_len": 16})
    x = torch.randn(2, 3, 5, 8)                                          # (B, h, T, d)
    positions = torch.arange(4, 9)
    cos, sin = rope.angles(positions)
    assert cos.shape == sin.shape == (5, 4) and cos.dtype == torch.float32
    torch.testing.assert_close(rope(x, positions, angles=(cos, sin)), rope(x, positions), atol=0, rtol=0)
    batched = torch.stack([positions, positions + 3])                    # (B, T)
    torch.testing.assert_close(rope(x, batched, angles=rope.angles(batched)), rope(x, batched), atol=0, rtol=0)
    wide = rope.angles(positions, torch.float64)
    torch.testing.assert_close(rope(x.double(), positions, angles=wide), rope(x.double(), positions), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"angles must be \(cos, sin\), each of shape \(5, 4\) and dtype torch.float64"):
        rope(x.double(), positions, angles=(cos, sin))                   # float32 angles for float64 x
    with pytest.raises(ValueError, match=r"each of shape \(5, 4\)"):
        rope(x, positions, angles=rope.angles(torch.arange(6)))
    with pytest.raises(ValueError, match="angles must be"):
        rope(x, positions, angles=cos)
    assert not hasattr(rope, "shared_angles")                            # no side channel on the module


def test_half_precision_in_and_out():
    x = torch.randn(2, 4, 6, 16)
    rope = RotaryEmbedding(16)
    y = rope(x.to(torch.bfloat16), torch.arange(6) * 100)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), rope(x, torch.arange(6) * 100), atol=3e-2, rtol=3e-2)


def test_module_state():
    rope = RotaryEmbedding(8, interleaved=True, scaling={"kind": "yarn", "factor": 2, "original_max_len": 64})
    assert "inv_freq" not in rope.state_dict()                       # derived, not a weight
    assert rope.scaling == {"kind": "yarn", "factor": 2, "original_max_len": 64, "beta_fast": 32.0,
                            "beta_slow": 1.0}
    assert "interleaved=True" in repr(rope)
    x = torch.randn(3, 8)
    torch.testing.assert_close(apply_rotary(x, torch.ones(3, 4), torch.zeros(3, 4), interleaved=True), x)


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=7), "head_dim must be a positive even int.*got 7"),
    (dict(head_dim=0), "head_dim.*got 0"),
    (dict(head_dim=8.0), "head_dim.*got 8.0"),
    (dict(head_dim=8, base=1.0), "base must be a number > 1, got 1.0"),
    (dict(head_dim=8, scaling={"kind": "dynamic", "factor": 2}), "unknown scaling kind 'dynamic'.*linear"),
    (dict(head_dim=8, scaling={"factor": 2}), "unknown scaling kind None"),
    (dict(head_dim=8, scaling="linear"), "scaling must be a dict"),
    (dict(head_dim=8, scaling={"kind": "linear", "factor": 0}), "'factor' must be a positive number, got 0"),
    (dict(head_dim=8, scaling={"kind": "ntk", "factor": -2.0}), "'factor' must be a positive number, got -2.0"),
    (dict(head_dim=8, scaling={"kind": "linear", "factor": float("nan")}), "'factor' must be a positive number"),
    (dict(head_dim=8, scaling={"kind": "linear"}), r"'linear' needs \['factor'\]"),
    (dict(head_dim=8, scaling={"kind": "yarn", "factor": 4}), r"'yarn' needs \['original_max_len'\]"),
    (dict(head_dim=8, scaling={"kind": "llama3", "factor": 8}), r"'llama3' needs \['original_max_len'\]"),
    (dict(head_dim=8, scaling={"kind": "llama3", "factor": 8, "original_max_position_embeddings": 8192}),
     r"does not take \['original_max_position_embeddings'\]"),
    (dict(head_dim=8, scaling={"kind": "linear", "factor": 2, "original_max_len": 64}),
     r"'linear' does not take \['original_max_len'\]"),
    (dict(head_dim=8, scaling={"kind": "yarn", "factor": 4, "original_max_len": 64.5}), "original_max_len"),
    (dict(head_dim=8, scaling={"kind": "yarn", "factor": 4, "original_max_len": 64, "beta_fast": 1,
                               "beta_slow": 32}), "beta_fast > beta_slow"),
    (dict(head_dim=8, scaling={"kind": "llama3", "factor": 4, "original_max_len": 64, "low_freq_factor": 4,
                               "high_freq_factor": 1}), "high_freq_factor > low_freq_factor"),
    (dict(head_dim=2, scaling={"kind": "ntk", "factor": 4}), "ntk scaling needs head_dim >= 4.*got head_dim=2"),
    (dict(head_dim=8, interleaved="no"), "interleaved must be True or False, got 'no'"),
    (dict(head_dim=8, interleaved=1), "interleaved must be True or False, got 1"),
    (dict(head_dim=8, interleaved=None), "interleaved must be True or False, got None"),
    (dict(head_dim=8, scaling={"kind": "linear", "factor": True}), "'factor' must be a positive number, got True"),
    (dict(head_dim=8, scaling={"kind": "linear", "factor": np.True_}), "'factor' must be a positive number"),
    (dict(head_dim=8, scaling={"kind": "yarn", "factor": 4, "original_max_len": np.float64(64.5)}),
     "'original_max_len' must be a positive int, got np.float64"),
    (dict(head_dim=8, scaling={"kind": "yarn", "factor": 4, "original_max_len": np.int64(0)}),
     "'original_max_len' must be a positive number, got np.int64"),
    (dict(head_dim=np.int64(7)), "head_dim must be a positive even int.*got np.int64"),
])
def test_rotary_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)


def test_validate_scaling_fills_defaults():
    assert validate_scaling({"kind": "llama3", "factor": 8, "original_max_len": 8192}) == {
        "kind": "llama3", "factor": 8, "original_max_len": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("kind", ["yarn", "llama3"])
def test_numpy_scalars_are_accepted_like_python_numbers(kind):
    plain = {"kind": kind, "factor": 4.0, "original_max_len": 64}
    numpy = {"kind": kind, "factor": np.float64(4.0), "original_max_len": np.int64(64)}
    numpy.update({"beta_fast": np.float32(32), "beta_slow": np.int32(1)} if kind == "yarn" else
                 {"low_freq_factor": np.int64(1), "high_freq_factor": np.float32(4)})
    checked = validate_scaling(numpy)
    assert checked == validate_scaling(plain)
    assert type(checked["original_max_len"]) is int                   # no NumPy types leak into the module
    assert all(type(v) is float for key, v in checked.items() if key not in ("kind", "original_max_len"))
    ours = RotaryEmbedding(np.int64(8), np.float64(10000.0), scaling=numpy)
    ref = RotaryEmbedding(8, 10000.0, scaling=plain)
    torch.testing.assert_close(ours.inv_freq, ref.inv_freq)
    assert ours.attention_scaling == ref.attention_scaling
    assert repr(ours) == repr(ref) and type(ours.head_dim) is int
    torch.testing.assert_close(alibi_slopes(np.int64(6)), alibi_slopes(6))
    torch.testing.assert_close(sinusoidal_encoding(np.int64(5), np.int32(8)), sinusoidal_encoding(5, 8))


@pytest.mark.parametrize("x_shape, positions, match", [
    ((2, 3, 5, 8), torch.arange(4), r"positions must have shape \(T,\) = \(5,\).*got \(4,\)"),
    ((2, 3, 5, 8), torch.zeros(3, 5, dtype=torch.long), r"\(B, T\) = \(2, 5\).*got \(3, 5\)"),
    ((5, 8), torch.zeros(1, 5, dtype=torch.long), r"got \(1, 5\)"),
    ((2, 5, 8), torch.zeros(2, 5, 1, dtype=torch.long), r"got \(2, 5, 1\)"),
    ((2, 5, 8), torch.arange(5.0), "positions must be an integer tensor.*float32"),
    ((2, 5, 8), [0, 1, 2, 3, 4], "positions must be an integer tensor.*list"),
    ((2, 5, 6), torch.arange(5), r"last dim 6 but this RotaryEmbedding has head_dim=8 \(x shape \(2, 5, 6\)\)"),
    ((8,), torch.arange(1), r"x must be a floating \(..., T, head_dim\) tensor, got shape \(8,\)"),
])
def test_rotary_bad_call(x_shape, positions, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(8)(torch.randn(x_shape), positions)


@pytest.mark.parametrize("x_shape, cos_shape, sin_shape, match", [
    ((5, 7), (5, 3), (5, 3), r"last dim must be even.*got x of shape \(5, 7\)"),
    ((5, 8), (5, 3), (5, 3), r"cos and sin must have shape \(\.\.\., 4\).*\(5,\).*got \(5, 3\)"),
    ((5, 8), (6, 4), (6, 4), r"last dim \(5,\) \(x has shape \(5, 8\)\), got \(6, 4\)"),
    ((2, 5, 8), (3, 5, 4), (3, 5, 4), r"last dim \(2, 5\) \(x has shape \(2, 5, 8\)\), got \(3, 5, 4\)"),
    ((5, 8), (2, 5, 4), (2, 5, 4), r"\(x has shape \(5, 8\)\), got \(2, 5, 4\)"),  # would grow x
    ((5, 8), (5, 4), (5, 3), r"cos and sin must have the same shape, got \(5, 4\) and \(5, 3\)"),
])
def test_apply_rotary_bad_shapes(x_shape, cos_shape, sin_shape, match):
    with pytest.raises(ValueError, match=match):
        apply_rotary(torch.randn(x_shape), torch.randn(cos_shape), torch.randn(sin_shape))


def test_apply_rotary_bad_types():
    x, cos, sin = torch.randn(5, 8), torch.randn(5, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match="interleaved must be True or False, got 'no'"):
        apply_rotary(x, cos, sin, interleaved="no")
    with pytest.raises(ValueError, match="cos must be a floating tensor.*list"):
        apply_rotary(x, [1.0] * 4, sin)
    with pytest.raises(ValueError, match=r"x must be a floating tensor.*shape \(5, 8\) and dtype torch.int64"):
        apply_rotary(x.long(), cos, sin)
    assert apply_rotary(x, cos[:1], sin[:1]).shape == x.shape         # (1, d/2) broadcasts over T


def test_rotary_rejects_integer_x():
    with pytest.raises(ValueError, match="dtype torch.int64"):
        RotaryEmbedding(8)(torch.ones(5, 8, dtype=torch.long), torch.arange(5))


@pytest.mark.parametrize("call, match", [
    (lambda: permute_qk_rows(torch.randn(12, 4), 5), r"n_heads=5 dividing its first dim, got \(12, 4\)"),
    (lambda: permute_qk_rows(torch.randn(12, 4), 4), "head_dim must be a positive even int.*got 3"),
    (lambda: permute_qk_rows(torch.randn(16, 4), 2, to="meta"), "to must be 'half' or 'interleaved'"),
    (lambda: permute_qk_rows(torch.randn(2, 16, 4), 2), r"got \(2, 16, 4\)"),
    (lambda: interleaved_to_half_permutation(5), "got 5"),
])
def test_permutation_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------

def press_get_slopes(n):
    """ALiBi's reference get_slopes (Press et al.), written out."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + press_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def test_alibi_slopes_for_8_heads_are_the_papers():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([1 / 2 ** k for k in range(1, 9)]))


@pytest.mark.parametrize("n_heads", list(range(1, 70)) + [96, 128])
def test_alibi_slopes_match_reference_code_and_bloom(n_heads):
    ours = alibi_slopes(n_heads)
    torch.testing.assert_close(ours, torch.tensor(press_get_slopes(n_heads), dtype=torch.float32))
    torch.testing.assert_close(ours, _get_alibi_slopes(n_heads, torch.device("cpu")))
    assert ours.shape == (n_heads,) and torch.all(ours > 0) and torch.all(ours <= 1)


def test_alibi_slopes_for_other_head_counts_are_two_decreasing_runs():
    expected = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]          # slopes of 4, then every other of 8
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))
    for n in (3, 5, 6, 7, 12, 24):
        c = 2 ** math.floor(math.log2(n))
        slopes = alibi_slopes(n)
        assert not torch.all(slopes[1:] < slopes[:-1])                  # not decreasing overall...
        for run in (slopes[:c], slopes[c:]):
            assert torch.all(run[1:] < run[:-1])                        # ...but within each run


def test_alibi_bias_values_and_alignment():
    bias = alibi_bias(4, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))
    # L < S: the queries are the last L positions, as during cached decoding
    torch.testing.assert_close(alibi_bias(4, 2, 5), bias[:, 3:])
    assert alibi_bias(3, 1, 9).shape == (3, 1, 9)


def test_alibi_causal_attention_matches_bloom():
    # BLOOM adds slope * key_position; softmax ignores a per-row constant, so under a causal
    # mask that equals our -slope * (i - j).
    torch.manual_seed(5)
    h, T = 6, 7
    scores = torch.randn(1, h, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    bloom = build_alibi_tensor(torch.ones(1, T), h, torch.float32).reshape(1, h, 1, T)
    ours = torch.softmax((scores + alibi_bias(h, T)).masked_fill(~causal, float("-inf")), -1)
    ref = torch.softmax((scores + bloom).masked_fill(~causal, float("-inf")), -1)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("call, match", [
    (lambda: alibi_slopes(0), "n_heads must be a positive int, got 0"),
    (lambda: alibi_slopes(2.0), "n_heads must be a positive int, got 2.0"),
    (lambda: alibi_bias(4, 5, 3), "needs S >= L; got L=5, S=3"),
    (lambda: alibi_bias(4, 0), "L must be a positive int, got 0"),
    (lambda: alibi_bias(-1, 4), "n_heads must be a positive int, got -1"),
])
def test_alibi_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------------------
# Devices (CUDA when present; CPU always)
# --------------------------------------------------------------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_on_device(device, dtype):
    torch.manual_seed(6)
    x = torch.randn(2, 4, 33, 64)
    positions = torch.arange(33) + 1000
    rope_cpu = RotaryEmbedding(64, scaling={"kind": "yarn", "factor": 4.0, "original_max_len": 256})
    rope = RotaryEmbedding(64, scaling={"kind": "yarn", "factor": 4.0, "original_max_len": 256}).to(device)
    assert rope.inv_freq.device.type == device
    got = rope(x.to(device, dtype), positions)                 # positions may stay on the CPU
    assert got.device.type == device and got.dtype == dtype
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.float().cpu(), rope_cpu(x, positions), **tol)
    torch.testing.assert_close(alibi_bias(4, 3, 7, device=device).cpu(), alibi_bias(4, 3, 7))


# --------------------------------------------------------------------------------------
# Widgets and figures of notebook 05
# --------------------------------------------------------------------------------------

def test_rotation_widget_keeps_the_score_at_fixed_offset():
    from selfattn_lite.viz import RopeRotationWidget

    w = RopeRotationWidget(q=(1.0, 0.3), k=(0.5, 0.9), theta=0.3, position=5, offset=2)
    score, q_rot, renders = w.score, w.q_rot, w.renders
    w.slider.value = 17                                      # redrawn in place: only the moving artists
    assert w.renders == renders + 1 and not torch.allclose(w.q_rot, q_rot)
    assert w.score == pytest.approx(score, rel=1e-12)
    assert w._artists["q"].xy == pytest.approx(w.q_rot.tolist())
    assert "m = 17, k at n = 15" in w._artists["title"].get_text()
    torch.testing.assert_close(w.q_rot.norm(), torch.tensor([1.0, 0.3], dtype=torch.float64).norm())
    w.offset.value = 5
    assert w.score != pytest.approx(score, rel=1e-3)
    assert w.png()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"q must be a 2D vector.*got shape \(3,\)"):
        RopeRotationWidget(q=(1.0, 0.0, 0.0))


def test_scaling_widget_follows_its_controls():
    from selfattn_lite.viz import RopeScalingWidget

    w = RopeScalingWidget(head_dim=64, original_max_len=1024, kind="linear", factor=4.0)
    torch.testing.assert_close(w.inv_freq, rope_inv_freq(64) / 4)
    w.kind.value = "yarn"
    expected, scaling = scaled_inv_freq(64, 10000.0, {"kind": "yarn", "factor": 4.0, "original_max_len": 1024})
    torch.testing.assert_close(w.inv_freq, expected)
    assert w.attention_scaling == scaling > 1
    w.factor.value = 16.0
    assert w.scaling == {"kind": "yarn", "factor": 16.0, "original_max_len": 1024}
    assert w.renders == 3
    with pytest.raises(ValueError, match="unknown scaling kind 'rope'"):
        RopeScalingWidget(kind="rope")


def test_frequency_chart_draws_every_method():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from selfattn_lite.viz import rope_frequency_chart

    fig = Figure()
    FigureCanvasAgg(fig)
    scalings = {"original": None, "linear": {"kind": "linear", "factor": 8.0}, "ntk": {"kind": "ntk", "factor": 8.0},
                "yarn": {"kind": "yarn", "factor": 8.0, "original_max_len": 4096},
                "llama3": {"kind": "llama3", "factor": 8.0, "original_max_len": 4096}}
    ax_wave, ax_ratio = rope_frequency_chart(scalings, original_max_len=4096, factor=8.0, axes=fig.subplots(1, 2))
    assert len(ax_wave.get_lines()) == 5 + 2                 # five methods, L and s*L
    ratios = {line.get_label(): line.get_ydata() for line in ax_ratio.get_lines()}
    assert ratios["linear"] == pytest.approx([8.0] * 64, rel=1e-5)
    assert ratios["ntk"][0] == pytest.approx(1.0) and ratios["ntk"][-1] == pytest.approx(8.0, rel=1e-4)


def test_notebook_figures_draw():
    from matplotlib.figure import Figure

    from selfattn_lite.course.figures.positions import FIGURES

    assert set(FIGURES) == {"positions_where.png", "rope_pairings.png"}
    for draw in FIGURES.values():
        assert isinstance(draw(), Figure)
