"""The widgets of notebooks 01-10, 14 and 15, driven the way a learner drives them in the notebook.

Each notebook builds its widget and shows it; the clicks a learner makes there (a slider moved, a
dropdown changed, a toggle flipped) are made here, and the claim the notebook's prose makes about
what they show is asserted. Where a widget is built from a notebook's own data, the test builds it
from the same data (the shipped tiny decoder, the same vectors) or from data of the same kind.
"""

import math

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

from selfattn_lite import masks, viz  # noqa: E402
from selfattn_lite.models import load_tiny_decoder  # noqa: E402
from selfattn_lite.presets import get_preset  # noqa: E402


def mean_entropy(weights):
    return -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean().item()


def test_nb01_temperature_sharpens_below_one_and_flattens_above():
    scores = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
    tokens = ["The", "cat", "sat", "on", "it"]
    widget = viz.TemperatureWidget(scores, tokens, tokens)
    entropy = {}
    for T in (0.1, 1.0, 10.0):
        widget.slider.value = T
        entropy[T] = mean_entropy(widget.weights)
    assert entropy[0.1] < entropy[1.0] < entropy[10.0] < math.log(5)   # sharper ... flatter, never past uniform
    widget.slider.value = 1.0
    torch.testing.assert_close(widget.weights, torch.softmax(scores, dim=-1))


def test_nb02_query_widget_moves_the_weights_and_comes_back():
    K = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])      # notebook 02's keys and values
    V = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    widget = viz.QueryWidget(K, V, query=[1.0, 0.0], key_labels=["token 1", "token 2", "token 3"])
    output = widget.output.clone()
    widget.sliders[0].value, widget.sliders[1].value = 0.0, 1.0   # q = [0, 1]: token 2 (or 3) wins
    assert widget.weights.argmax() in (1, 2) and widget.renders >= 3
    widget.sliders[0].value, widget.sliders[1].value = 1.0, 0.0
    torch.testing.assert_close(widget.output, output)


def test_nb03_mask_widget_controls():
    widget = viz.MaskWidget(max_len=8)
    widget.n_queries.value, widget.real_keys.value = 6, 4               # the notebook's static view
    assert widget.weights.shape == (6, 6)
    assert torch.equal(widget.mask, masks.causal_mask(6) & masks.padding_mask([4], 6))
    before = widget.weights.clone()
    widget.cross.value, widget.n_keys.value = True, 5
    widget.alignment.value = "bottom-right"                             # 6 queries after 5 keys: query 0 sees nothing
    assert widget.weights.shape == (6, 5) and torch.equal(widget.weights[0], torch.zeros(5))
    widget.causal.value = False
    assert widget.mask[:, :4].all() and not widget.mask[:, 4:].any() and widget.renders >= 6
    widget.cross.value, widget.causal.value = False, True               # back to the static view
    torch.testing.assert_close(widget.weights, before)


def test_nb04_head_widget_shows_the_picked_head_and_example():
    weights = torch.softmax(torch.randn(8, 3, 10, 10, generator=torch.Generator().manual_seed(0)), dim=-1)
    names = [f"head {i}" for i in range(3)]
    widget = viz.HeadWidget(weights, tokens=[list("abcdefghij")] * 8, head_names=names)
    assert widget.weights.shape == (3, 10, 10)                          # "all heads" first
    widget.head.value = names[0]
    torch.testing.assert_close(widget.weights, weights[0, 0])
    widget.example.value = 5
    torch.testing.assert_close(widget.weights, weights[5, 0])
    assert widget.renders >= 3


def test_nb05_rope_score_depends_on_the_offset_not_the_position():
    q2 = torch.tensor([1.0, 0.3], dtype=torch.float64)                 # notebook 05's pair
    k2 = torch.tensor([0.5, 0.9], dtype=torch.float64)
    rotation = viz.RopeRotationWidget(q2, k2, theta=0.3, position=5, offset=2)
    score_before, q_before = rotation.score, rotation.q_rot
    rotation.slider.value = 23
    assert not torch.allclose(rotation.q_rot, q_before)                # the vectors turned...
    assert math.isclose(rotation.score, score_before, rel_tol=1e-9)    # ...the score did not
    rotation.offset.value = 6
    assert not math.isclose(rotation.score, score_before, rel_tol=1e-3)


def test_nb06_calculator_kv_heads_and_model_change():
    calc = viz.KVCalculatorWidget("Llama-2-7B", seq_len=4096, batch=16)
    assert calc.cache_bytes == 32 * 1024**3
    calc.kv_heads.value = 8                                             # what GQA buys: a quarter
    assert calc.cache_bytes == 8 * 1024**3
    calc.preset.value = "Llama-3-8B"                                    # a new model resets K/V heads to its own
    assert calc.kv_heads.value == 8 and calc.cache_bytes == get_preset("Llama-3-8B").kv_bytes(4096, 16)


def test_nb07_head_sharing_widget_measures_the_model_cache():
    cfg = load_tiny_decoder().config
    sharing = viz.HeadSharingWidget(n_heads=8, head_dim=cfg.head_dim, n_layers=cfg.n_layers, max_len=cfg.max_len)
    gqa_bytes = 2 * cfg.n_layers * 2 * cfg.head_dim * cfg.max_len * 4   # 2 K/V heads, float32
    assert sharing.cache_bytes[2] == gqa_bytes and sharing.group_size == 4
    sharing.slider.value = 1
    assert sharing.group_size == 8 and sharing.renders == 2
    assert sharing.cache_bytes[8] == 8 * sharing.cache_bytes[1]


def test_nb08_tile_widget_counts_and_steps():
    widget = viz.TileWidget(n=64, block_size=8)
    assert (widget.computed, widget.skipped) == (36, 28)
    widget.block_slider.value = 16
    assert (widget.computed, widget.skipped) == (10, 6)
    widget.causal.value = False
    assert widget.skipped == 0
    widget.causal.value = True
    widget.step_slider.value = 5                                        # the animation's sixth step
    assert widget.current == (1, 1)


def test_nb09_pitfall_widget_toggles_broken_and_fixed():
    widget = viz.PitfallWidget("mask_polarity")
    broken_weights = widget.weights
    widget.fixed.value = True
    assert not torch.equal(widget.weights, broken_weights)
    assert (widget.weights.triu(1) == 0).all()                          # fixed: nothing above the diagonal
    widget.choice.value = "softmax_dim"
    torch.testing.assert_close(widget.weights.sum(-1), torch.ones(6))


def test_nb10_explorer_layer3_head1_it_looks_at_cat():
    explorer = viz.AttentionExplorer("The cat sat on the mat because it was tired")
    before = explorer.image.value
    explorer.layer.value, explorer.head.value = 3, 1
    explorer.query.value = explorer.maps.tokens.index("it")
    assert explorer.image.value != before
    torch.testing.assert_close(explorer.weights, explorer.maps.weights[3, 1])
    assert "cat" in explorer.status.value


def test_nb14_ring_widget_last_step_shows_every_needed_score_once():
    """Notebook 14's widget (W = 4, zig-zag), its step slider moved to the last step."""
    import matplotlib
    matplotlib.use("Agg")
    from selfattn_lite import viz

    w = viz.RingWidget(4, layout="zigzag")
    w.step_slider.value = 3
    assert w.held == [(r - 3) % 4 for r in range(4)]
    assert (w.grid >= 0).sum() == w.L * (w.L + 1) // 2            # every needed score, exactly once
    assert w.work == [34, 34, 34, 34]                              # needed scores: balanced


def test_nb15_block_widget_follows_the_block_size_and_the_mask():
    """Notebook 15's program widget: a larger BLOCK_M means fewer programs and fewer K/V passes; without the
    causal mask no block needs one."""
    from selfattn_lite import triton_attention as ta

    widget = viz.TritonBlockWidget(n=1024, block_m=128, block_n=64, D=128, is_causal=True)
    assert widget.grid == (8, 16) and widget.work["key_blocks"] == 16 and widget.work["masked_blocks"] == 2
    widget.m_slider.value = 256
    assert widget.grid == (4, 16) and widget.traffic["kv"] < ta.hbm_bytes(1024, 1024, 128, 128, 64, H=16,
                                                                           is_causal=True)["kv"]
    widget.causal.value = False
    assert widget.work["masked_blocks"] == 0 and widget.work["key_blocks"] == 1024 // 64
