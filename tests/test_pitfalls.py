"""selfattn_lite.pitfalls: every broken function shows its symptom, every fix removes it."""

import pytest
import torch
import torch.nn.functional as F

import selfattn_lite as sal
from selfattn_lite import pitfalls


@pytest.mark.parametrize("name", list(pitfalls.PITFALLS))
def test_each_demo_shows_the_symptom_and_the_fix(name):
    demo = pitfalls.PITFALLS[name]()
    assert demo.name == name
    assert demo.symptom_seen, f"{name}: the broken code did not show its symptom: {demo.measured}"
    assert demo.fix_works, f"{name}: the fix did not work: {demo.measured}"
    assert demo.notebook[:2].isdigit() and demo.title and demo.symptom


def test_fourteen_pitfalls_each_linked_to_an_existing_notebook():
    from pathlib import Path

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    demos = pitfalls.run_all()
    assert len(demos) == 14 and all(d.ok for d in demos)
    for demo in demos:
        assert (notebooks / f"{demo.notebook}.ipynb").exists(), demo.notebook


def qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def test_scale_and_softmax_dim_fixes_match_torch():
    q, k, v = qkv(2, 3, 5, 8)
    want = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(pitfalls.fixed_scaled(q, k, v)[0], want)
    torch.testing.assert_close(pitfalls.fixed_softmax_dim(q, k, v)[0], want)
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
        fixed, _ = pitfalls.pitfall_weights(name, True)
        assert broken.shape == fixed.shape and not torch.allclose(broken, fixed)
        torch.testing.assert_close(fixed.sum(-1), torch.ones(fixed.shape[0]))
    with pytest.raises(ValueError, match="missing_scale"):
        pitfalls.pitfall_weights("nope", True)
    w = pitfalls.PitfallWidget("missing_scale")
    renders, before = w.renders, w.weights
    w.fixed.value = True
    assert w.renders == renders + 1 and w.weights.max(-1).values.mean() < before.max(-1).values.mean()
    w.choice.value = "is_causal_with_cache"
    assert w.weights.shape == (3, 8) and w.renders == renders + 2
