"""selfattn_lite.pitfalls: every broken function shows its symptom, every fix removes it."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import selfattn_lite as sal
from selfattn_lite import pitfalls, viz

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture(scope="module")
def demos():
    """Every demo, run once for all the tests below (run_all is what notebook 09 calls)."""
    return {demo.name: demo for demo in pitfalls.run_all()}


def test_fourteen_pitfalls_run_in_registration_order(demos):
    assert list(demos) == list(pitfalls.PITFALLS) and len(demos) == 14


@pytest.mark.parametrize("name", list(pitfalls.PITFALLS))
def test_each_demo_shows_the_symptom_and_the_fix(demos, name):
    demo, entry = demos[name], pitfalls.PITFALLS[name]
    assert demo.symptom_seen, f"{name}: the broken code did not show its symptom: {demo.measured}"
    assert demo.fix_works, f"{name}: the fix did not work: {demo.measured}"
    assert demo.ok
    assert (demo.title, demo.notebook, demo.symptom) == (entry.title, entry.notebook, entry.symptom)
    assert (NOTEBOOKS / f"{demo.notebook}.ipynb").exists(), demo.notebook


def test_registration_fills_in_the_demo_and_refuses_a_second_name(demos):
    demo = pitfalls.demo_missing_scale(dk=64)                 # the decorated function, called directly
    assert demo.name == "missing_scale" and demo.title == pitfalls.PITFALLS["missing_scale"].title
    assert demo.measured["mean_max_weight_broken"] < demos["missing_scale"].measured["mean_max_weight_broken"]
    with pytest.raises(ValueError, match="'softmax_dim' is already registered"):
        pitfalls.pitfall("softmax_dim", "again", "01_scaled_dot_product_attention", "twice")


def test_every_broken_and_fixed_function_belongs_to_a_pitfall():
    registered = {code for entry in pitfalls.PITFALLS.values() for code in entry.broken + entry.fixed}
    public = {getattr(pitfalls, name) for name in pitfalls.__all__
              if name.lower().startswith(("broken", "fixed"))}
    assert public == registered
    shared = [name for name, entry in pitfalls.PITFALLS.items() if pitfalls.fixed_attention in entry.fixed]
    assert shared == ["missing_scale", "softmax_dim"]            # one correct attention fixes both


def qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def test_scale_and_softmax_dim_fixes_match_torch():
    q, k, v = qkv(2, 3, 5, 8)
    want = F.scaled_dot_product_attention(q, k, v)
    out, weights = pitfalls.fixed_attention(q, k, v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))
    torch.testing.assert_close(pitfalls.broken_no_scale(q * 8 ** -0.25, k * 8 ** -0.25, v)[0], want)  # scale moved
    assert not torch.allclose(pitfalls.broken_softmax_dim(q, k, v)[0], want)


def test_masked_softmax_fix_equals_safe_softmax():
    scores = torch.randn(3, 4, 5)
    mask = torch.rand(3, 4, 5) > 0.5
    mask[0, 1] = False
    got = pitfalls.fixed_masked_softmax(scores, mask)
    torch.testing.assert_close(got, sal.attention.safe_softmax(scores.masked_fill(~mask, float("-inf"))))
    assert torch.isnan(pitfalls.broken_masked_softmax(scores, mask)[0, 1]).all()


def test_merge_heads_functions():
    out = torch.randn(2, 3, 4, 5)
    with pytest.raises(RuntimeError, match="view"):
        pitfalls.broken_merge_heads_view(out)
    merged = pitfalls.fixed_merge_heads(out)
    torch.testing.assert_close(merged[1, 2], out[1, :, 2].reshape(-1))
    assert not torch.equal(pitfalls.broken_merge_heads_no_transpose(out)[1, 2], merged[1, 2])


def test_decode_masks_against_full_recomputation():
    q, k, v = qkv(1, 2, 9, 4, seed=3)
    for L in (1, 2, 5):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., -L:, :]
        torch.testing.assert_close(pitfalls.fixed_decode_bottom_right(q[..., -L:, :], k, v), want)
        assert not torch.allclose(pitfalls.broken_decode_is_causal(q[..., -L:, :], k, v), want)


def test_expand_kv_matches_enable_gqa():
    q = torch.randn(2, 6, 4, 8)
    k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = F.scaled_dot_product_attention(q, pitfalls.fixed_expand_kv(k, 6), pitfalls.fixed_expand_kv(v, 6))
    torch.testing.assert_close(got, want)
    assert pitfalls.broken_expand_kv(k, 6).shape == (2, 6, 4, 8)


def test_dropout_modules_train_and_eval():
    q, k, v = qkv(1, 4, 8)
    fixed = pitfalls.FixedDropoutAttention(0.5)
    torch.testing.assert_close(fixed.eval()(q, k, v), F.scaled_dot_product_attention(q, k, v))
    torch.manual_seed(0)
    assert not torch.allclose(fixed.train()(q, k, v), F.scaled_dot_product_attention(q, k, v))  # still drops in training


def test_fixed_masked_attention_buffer_moves_and_is_not_saved():
    m = pitfalls.FixedMaskedAttention(8, 16)
    assert "mask" in dict(m.named_buffers()) and "mask" not in m.state_dict()
    assert m.to("meta").mask.device.type == "meta"
    b = pitfalls.BrokenMaskedAttention(8, 16).to("meta")
    assert b.mask.device.type == "cpu"
    with pytest.raises(RuntimeError, match="device"):
        b(torch.randn(1, 3, 8, device="meta"))


def test_fp16_functions():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 3, 64, generator=g), torch.randn(1, 4, 64, generator=g)
    got = pitfalls.fixed_fp16_scores(q.half(), k.half())
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), torch.softmax(q.half().float() @ k.half().float().mT / 8, -1),
                               atol=1e-3, rtol=1e-2)


def test_pitfall_weights_and_widget():
    for name in pitfalls.HEATMAP_PITFALLS:
        broken, _ = pitfalls.pitfall_weights(name, False)
        fixed, masked = pitfalls.pitfall_weights(name, True)
        assert broken.shape == fixed.shape and not torch.allclose(broken, fixed)
        torch.testing.assert_close(fixed.sum(-1), torch.ones(fixed.shape[0]))
        if masked is not None:                                    # what the heatmap greys out weighs nothing
            assert (fixed[masked] == 0).all() and (fixed[~masked] > 0).all()
    L, S = 3, 8                                                   # new tokens see every cached key: bottom-right
    torch.testing.assert_close(pitfalls.pitfall_weights("is_causal_with_cache", True)[1],
                               torch.ones(L, S, dtype=torch.bool).triu(S - L + 1))
    with pytest.raises(ValueError, match="missing_scale"):
        pitfalls.pitfall_weights("nope", True)
    w = viz.PitfallWidget("missing_scale")
    renders, before = w.renders, w.weights
    w.fixed.value = True
    assert w.renders == renders + 1 and w.weights.max(-1).values.mean() < before.max(-1).values.mean()
    w.choice.value = "is_causal_with_cache"
    assert w.weights.shape == (3, 8) and w.renders == renders + 2
