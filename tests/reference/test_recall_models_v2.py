"""The swept protocol's model options: Gated DeltaNet's gate against fla's formula, the short convolution
inside the mixer (width 4, where DeltaNet, Gated DeltaNet and Mamba put it), and the 1-in-4 hybrid."""

import pytest
import torch
import torch.nn.functional as F

from selfattn_lite.recall_models import (
    ALL_MIXERS,
    MIXERS,
    PARAMETER_TOLERANCE,
    CausalConv,
    RecallConfig,
    RecallModel,
    count_parameters,
    gdn_gate,
)
from selfattn_lite.recurrent import delta_rule_step, selective_scan_step

V2 = {"gate": "gdn", "conv": "mixer", "conv_width": 4}


def test_gdn_gate_is_fla_formula():
    torch.manual_seed(0)
    a, A_log, dt_bias = torch.randn(3, 7, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64), \
        torch.randn(4, dtype=torch.float64)
    g = gdn_gate(a, A_log, dt_bias)
    # fla/layers/gated_deltanet.py: g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
    # in closed form: exp(g) = (1 + exp(a + dt_bias)) ** (-A), A = exp(A_log)
    torch.testing.assert_close(torch.exp(g), (1 + torch.exp(a + dt_bias)) ** (-torch.exp(A_log)))
    assert (g < 0).all()


def test_gated_delta_mixer_uses_the_gdn_gate_and_fla_initialisation():
    torch.manual_seed(0)
    mixer = RecallModel(RecallConfig(mixer="gated_delta", **V2)).double().blocks[0].mixer
    assert mixer.g_proj is None and mixer.a_proj.bias is None            # fla: a_proj has no bias
    A = torch.exp(mixer.A_log)
    assert ((A > 0) & (A < 16)).all()                                    # A ~ U(0, 16)
    dt = F.softplus(mixer.dt_bias)
    assert ((dt >= 1e-3 - 1e-9) & (dt <= 0.1 + 1e-9)).all()              # dt log-uniform in [1e-3, 0.1]
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    beta, g = mixer.gates(x)
    expected = -torch.exp(mixer.A_log) * F.softplus(x @ mixer.a_proj.weight.T + mixer.dt_bias)   # (B, T, h)
    torch.testing.assert_close(g, expected.transpose(1, 2))
    torch.testing.assert_close(beta, torch.sigmoid(mixer.beta_proj(x)).transpose(1, 2))
    default = RecallModel(RecallConfig(mixer="gated_delta")).blocks[0].mixer     # the shipped runs' gate stays
    assert default.gate == "logsigmoid" and not hasattr(default, "A_log")


def test_short_convolution_sits_inside_the_mixer_and_is_four_wide():
    model = RecallModel(RecallConfig(mixer="gated_delta", **V2))
    for block in model.blocks:
        assert isinstance(block.conv, torch.nn.Identity)                # nothing on the block's input
        for conv in (block.mixer.q_conv, block.mixer.k_conv, block.mixer.v_conv):
            assert conv.conv.kernel_size == (4,) and conv.conv.groups == 32
    s6 = RecallModel(RecallConfig(mixer="s6", **V2)).blocks[0].mixer
    assert s6.conv.conv.kernel_size == (4,)
    assert RecallModel(RecallConfig(mixer="attention", **V2)).blocks[0].mixer.conv.conv.kernel_size == (4,)
    old = RecallModel(RecallConfig(mixer="delta"))                      # the shipped runs: width 3 on the input
    assert old.blocks[0].conv.conv.kernel_size == (3,) and old.blocks[0].mixer.q_conv is None


def test_a_width_4_causal_conv_sees_exactly_the_last_four_tokens():
    torch.manual_seed(0)
    conv = CausalConv(5, 4).double()
    x = torch.randn(1, 12, 5, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6] += 1.0
    moved = (conv(changed) - conv(x)).abs().amax(-1)[0]
    assert moved[:6].max() == 0 and moved[10:].max() == 0 and (moved[6:10] > 0).all()


def test_hybrid_1in4_is_three_gated_delta_layers_then_attention():
    config = RecallConfig(mixer="hybrid_1in4", **V2)
    assert config.layer_mixers == ("gated_delta", "gated_delta", "gated_delta", "attention")
    model = RecallModel(config)
    assert [type(b.mixer).__name__ for b in model.blocks] == ["DeltaMixer"] * 3 + ["SoftmaxMixer"]
    assert all(b.mixer.gate == "gdn" for b in model.blocks[:3])
    assert RecallConfig(mixer="hybrid").layer_mixers == ("gated_delta", "attention")
    # four layers: about twice a two-layer model's parameters (the swept protocol's records state n_params)
    assert 1.5 < count_parameters(model) / count_parameters(RecallConfig(mixer="hybrid", **V2)) < 2.0


def test_two_layer_models_of_the_swept_protocol_keep_the_parameter_budget():
    base = count_parameters(RecallConfig(mixer="attention", **V2))
    for mixer in MIXERS:
        n = count_parameters(RecallConfig(mixer=mixer, **V2))
        assert abs(n - base) <= PARAMETER_TOLERANCE * base, f"{mixer}: {n} vs attention {base}"


@pytest.mark.parametrize("mixer", ALL_MIXERS)
def test_swept_models_are_causal(mixer):
    torch.manual_seed(0)
    model = RecallModel(RecallConfig(mixer=mixer, vocab_size=128, **V2)).double().eval()
    ids = torch.randint(0, 128, (2, 20))
    logits = model(ids)
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 128
    torch.testing.assert_close(model(changed)[:, :12], logits[:, :12])
    assert model.mixer_weights(ids).shape[-2:] == (20, 20)


def test_gdn_mixer_with_inner_conv_decodes_token_by_token_like_the_parallel_form():
    torch.manual_seed(0)
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    layer = RecallModel(RecallConfig(mixer="gated_delta", **V2)).double().blocks[0].mixer
    q, k, v = layer.qkv(x)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta, g = layer.gates(x)
    state, outs = torch.zeros(2, 2, 16, 16, dtype=torch.float64), []
    for t in range(11):
        o, state = delta_rule_step(state, q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], g=g[:, :, t])
        outs.append(o)
    torch.testing.assert_close(layer.merge(torch.stack(outs, 2)), layer(x))
    s6 = RecallModel(RecallConfig(mixer="s6", **V2)).double().blocks[0].mixer
    u, delta, A, B, C = s6.scan_inputs(x)
    torch.testing.assert_close(u, F.silu(s6.conv(s6.in_proj(x))).transpose(1, 2))   # Mamba: conv, SiLU, then scan
    state, ys = torch.zeros(2, 32, 16, dtype=torch.float64), []
    for t in range(11):
        y, state = selective_scan_step(state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D=s6.D)
        ys.append(y)
    torch.testing.assert_close(s6.out_proj(torch.stack(ys, -1).transpose(1, 2)), s6(x))


@pytest.mark.parametrize("changes, match", [({"gate": "sigmoid"}, "gate must be one of"),
                                            ({"conv": "inside"}, "conv must be one of"),
                                            ({"conv_width": 0}, "conv_width must be a positive int, got 0")])
def test_bad_options_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        RecallConfig(**changes)

