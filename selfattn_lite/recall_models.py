"""Small models that differ only in their token mixer, for multi-query associative recall.

    x_0 = Embed(ids)
    x_l = x_{l-1} + Mixer_l(Conv(Norm(x_{l-1})))    Conv: a short causal depthwise convolution (width 3)
    x_l = x_l + MLP(Norm(x_l))
    logits = Norm(x_L) W_out

Every model has the same embedding, convolutions, MLPs and output layer; only the mixer changes:

    attention    softmax attention (``MultiHeadAttention``), causal
    window       the same, each query seeing only its last ``window`` tokens (``efficient.sliding_window_mask``)
    linear       causal linear attention, elu + 1 features (``efficient.linear_attention``)
    delta        the delta rule (``recurrent.delta_rule``), unit keys and queries, beta = sigmoid(W_beta x)
    gated_delta  the same with a decay g: ``gate="logsigmoid"`` (the default) g = log sigmoid(W_g x + b),
                 GLA's form; ``gate="gdn"`` Gated DeltaNet's own, g = -exp(A_log) softplus(W_a x + dt_bias)
                 (fla's ``fla/layers/gated_deltanet.py``, NVlabs/GatedDeltaNet)
    s6           Mamba's selective scan (``recurrent.selective_scan``) with state size ``d_state``
    hybrid       layer 1 gated_delta, layer 2 attention (half the layers attention)
    hybrid_1in4  four layers: gated_delta, gated_delta, gated_delta, attention (one attention layer in four)
                 the layout of the Gated DeltaNet hybrids in transformers' Qwen3-Next config
                 (``full_attention_interval=4``: three linear layers, then full attention); Jamba's
                 config puts one attention layer in eight (``attn_layer_period=8``)

Where the short convolution sits is ``conv``: ``"block"`` (the default) puts one of width ``conv_width``
(default 3) on every mixer's input, the same for every model; ``"mixer"`` puts it where the papers do,
inside the mixer, width 4, followed by SiLU: on q, k and v after their projections for linear
attention and the delta rules (DeltaNet's and Gated DeltaNet's ``ShortConvolution``, ``conv_size=4``), on
u after the input projection for s6 (``mamba_simple.py``'s ``conv1d``, ``d_conv=4``; delta, B and C are
then read from the convolved u, as there), and on the mixer's input for attention and the window
(Zoology's attention models run a short convolution before attention).

The short convolution lets a token see the one before it (as in Mamba and DeltaNet, and here in every model
alike), so the value after a key can carry that key; recall then needs one mixer that finds the key again.
No positional encoding is used. ``count_parameters`` and ``PARAMETER_TOLERANCE`` state the budget: at the
default width every mixer's model is within 10% of the attention model's parameter count.

Taught in notebook 16, section 5; trained by ``python -m selfattn_lite.course.train_recall``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_choice,
    check_ids,
    check_int,
    check_module_dtype,
    check_positive_int,
    check_real,
    check_same_dtype,
    check_tensor,
    shape_str,
)
from .efficient import linear_attention, sliding_window_mask
from .masks import causal_mask
from .multihead import MultiHeadAttention
from .recall import IGNORE_INDEX, mqar
from .recurrent import delta_rule, delta_rule_weights, linear_attention_weights, selective_scan, selective_scan_weights

__all__ = ["MIXERS", "ALL_MIXERS", "GATES", "CONVS", "CausalConv", "gdn_gate", "RecallConfig", "RecallModel",
           "count_parameters", "state_bytes", "recall_accuracy", "load_recall_model", "recall_runs", "RECALL_DIR",
           "RECALL_V2_DIR", "PARAMETER_TOLERANCE"]

MIXERS = ("attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid")
ALL_MIXERS = MIXERS + ("hybrid_1in4",)   # MIXERS: two layers each, within PARAMETER_TOLERANCE of attention
GATES = ("logsigmoid", "gdn")
CONVS = ("block", "mixer")
RECURRENT = ("linear", "delta", "gated_delta", "s6")
RECALL_DIR = Path(__file__).parent / "data" / "recall"
RECALL_V2_DIR = Path(__file__).parent / "data" / "recall_v2"    # the swept protocol's runs (train_recall --sweep)
PARAMETER_TOLERANCE = 0.10     # every model within 10% of the attention model's parameter count


@dataclass(frozen=True)
class RecallConfig:
    """The shape of a recall model. ``window`` is used by ``window``; ``d_state`` by ``s6``; ``gate`` by the
    gated delta rule ("logsigmoid" or Gated DeltaNet's "gdn"); ``conv`` and ``conv_width`` place and size the
    short convolution ("block": on every mixer's input; "mixer": inside the mixer, as the papers).

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """

    mixer: str = "attention"
    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 2
    d_state: int = 16
    window: int = 8
    d_ff: int = 64
    gate: str = "logsigmoid"
    conv: str = "block"
    conv_width: int = 3

    def __post_init__(self):
        if self.mixer not in ALL_MIXERS:
            raise ValueError(f"mixer must be one of {ALL_MIXERS}, got {self.mixer!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.conv not in CONVS:
            raise ValueError(f"conv must be one of {CONVS}, got {self.conv!r}")
        for name in ("vocab_size", "d_model", "n_heads", "d_state", "window", "d_ff", "conv_width"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The mixer of each layer: two layers, or four for ``hybrid_1in4``."""
        if self.mixer == "hybrid":
            return ("gated_delta", "attention")
        if self.mixer == "hybrid_1in4":
            return ("gated_delta",) * 3 + ("attention",)
        return (self.mixer, self.mixer)


class CausalConv(nn.Module):
    """Depthwise causal convolution: y_t = sum_{j < width} w_j * x_{t-j}, one filter per channel.

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """

    def __init__(self, d_model: int, width: int = 3):
        super().__init__()
        d_model, width = check_positive_int("d_model", d_model), check_positive_int("width", width)
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model, padding=width - 1)

    def forward(self, x: Tensor) -> Tensor:                                   # (B, T, d) -> (B, T, d)
        check_tensor("x", x, dim=3, layout="(B, T, d)", floating=True)
        if x.shape[-1] != self.conv.in_channels or x.shape[1] < 1:
            raise ValueError(f"x {shape_str(x)} must be (B, T >= 1, d={self.conv.in_channels})")
        check_module_dtype("x", x, self.conv.weight.dtype)
        return self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)


def mixer_conv(config: RecallConfig, channels: int) -> nn.Module | None:
    """The short convolution inside a mixer when ``config.conv == "mixer"`` (followed by SiLU), else None."""
    return CausalConv(channels, config.conv_width) if config.conv == "mixer" else None


def _conv_silu(conv: nn.Module | None, x: Tensor) -> Tensor:
    return x if conv is None else F.silu(conv(x))


class SoftmaxMixer(nn.Module):
    """Softmax attention, causal, or restricted to the last ``window`` tokens (after a short conv with
    ``conv="mixer"``)."""

    def __init__(self, config: RecallConfig, window: int | None = None):
        super().__init__()
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, bias=False)
        self.window = window
        self.conv = mixer_conv(config, config.d_model)

    def mask(self, T: int, device=None) -> Tensor:
        """(T, T) bool, True = may attend."""
        if self.window is None:
            return causal_mask(T, device=device)
        return sliding_window_mask(T, self.window, device=device)

    def forward(self, x: Tensor) -> Tensor:
        x = _conv_silu(self.conv, x)
        return self.attn(x, attn_mask=self.mask(x.shape[1], x.device))[0]


class _Heads(nn.Module):
    """q, k, v and output projections shared by the linear-attention and delta-rule mixers."""

    def __init__(self, config: RecallConfig):
        super().__init__()
        d = config.d_model
        self.h = config.n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.q_conv, self.k_conv, self.v_conv = (mixer_conv(config, d) for _ in range(3))

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, h, T, d/h): projections, then (``conv="mixer"``) the short convolution and SiLU."""
        q = _conv_silu(self.q_conv, self.q_proj(x))
        k = _conv_silu(self.k_conv, self.k_proj(x))
        v = _conv_silu(self.v_conv, self.v_proj(x))
        return self.split(q), self.split(k), self.split(v)

    def split(self, t: Tensor) -> Tensor:                                     # (B, T, d) -> (B, h, T, d/h)
        B, T, d = t.shape
        return t.view(B, T, self.h, d // self.h).transpose(1, 2)

    def merge(self, t: Tensor) -> Tensor:                                     # (B, h, T, dv) -> (B, T, d)
        B, h, T, dv = t.shape
        return self.out_proj(t.transpose(1, 2).reshape(B, T, h * dv))


class LinearMixer(_Heads):
    """Causal linear attention with elu + 1 features (notebook 08's)."""

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x)
        return self.merge(linear_attention(q, k, v, is_causal=True, chunk_size=16))


def gdn_gate(a: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """Gated DeltaNet's log decay per head: g = -exp(A_log) * softplus(a + dt_bias), a = W_a x (..., h).

    exp(g) = exp(-A dt) with dt = softplus(a + dt_bias): Mamba-2's discretised decay, in (0, 1).
    As fla's ``fla/layers/gated_deltanet.py`` (Yang, Kautz & Hatamizadeh, 2025).

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """
    for name, t in (("a", a), ("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, t, floating=True)
    if a.dim() < 1 or A_log.shape != (a.shape[-1],) or dt_bias.shape != (a.shape[-1],):
        raise ValueError(f"A_log {shape_str(A_log)} and dt_bias {shape_str(dt_bias)} must be (h,) for a "
                         f"{shape_str(a)} (..., h)")
    check_same_dtype(a=a, A_log=A_log, dt_bias=dt_bias)
    return -torch.exp(A_log) * F.softplus(a + dt_bias)


class DeltaMixer(_Heads):
    """The delta rule on unit queries and keys, beta_t = sigmoid(W_beta x_t); gated: g_t = log sigmoid(W_g x_t + b)
    (``gate="logsigmoid"``), or Gated DeltaNet's g_t = -exp(A_log) softplus(W_a x_t + dt_bias) (``gate="gdn"``)."""

    def __init__(self, config: RecallConfig, gated: bool):
        super().__init__(config)
        h = config.n_heads
        self.beta_proj = nn.Linear(config.d_model, h)
        self.gate = config.gate if gated else None
        self.g_proj = None
        if self.gate == "logsigmoid":
            self.g_proj = nn.Linear(config.d_model, h)
            nn.init.constant_(self.g_proj.bias, 5.0)      # start at exp(g) = sigmoid(5) = 0.993 per token: remember
        elif self.gate == "gdn":                          # fla's initialisation: A ~ U(0, 16), dt log-uniform
            self.a_proj = nn.Linear(config.d_model, h, bias=False)
            self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(0, 16)))
            with torch.no_grad():
                dt = torch.exp(torch.rand(h) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))              # softplus^-1(dt)

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """beta and g, (B, h, T) each (g None when not gated)."""
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)
        if self.gate is None:
            return beta, None
        if self.gate == "gdn":
            return beta, gdn_gate(self.a_proj(x), self.A_log, self.dt_bias).transpose(1, 2)
        return beta, F.logsigmoid(self.g_proj(x)).transpose(1, 2)

    def forward(self, x: Tensor, chunk_size: int | None = 16) -> Tensor:
        q, k, v = self.qkv(x)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta, g = self.gates(x)
        return self.merge(delta_rule(q, k, v, beta, g=g, chunk_size=chunk_size))


class S6Mixer(nn.Module):
    """Mamba's selective scan: u = W_u x, delta = softplus(W_dt x + b), B = W_B x, C = W_C x, A = -exp(A_log).

    With ``conv="mixer"``, u = SiLU(Conv(W_u x)) and delta, B, C are read from that u (``mamba_simple.py``).
    """

    def __init__(self, config: RecallConfig):
        super().__init__()
        d, n = config.d_model, config.d_state
        self.in_proj, self.dt_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.B_proj, self.C_proj = nn.Linear(d, n, bias=False), nn.Linear(d, n, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(d, 1))   # S4D-real
        with torch.no_grad():                         # as Mamba: initial steps delta log-uniform in [0.001, 0.1]
            dt = torch.exp(torch.empty(d).uniform_(math.log(1e-3), math.log(1e-1)))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))               # softplus^-1(dt)
        self.D = nn.Parameter(torch.ones(d))
        self.out_proj = nn.Linear(d, d, bias=False)
        self.conv = mixer_conv(config, d)

    def scan_inputs(self, x: Tensor) -> tuple[Tensor, ...]:
        """u, delta (B, d, T); A (d, n); B, C (B, n, T): ``selective_scan``'s arguments."""
        u = self.in_proj(x)
        if self.conv is not None:                     # Mamba: the projections read the convolved input
            x = u = F.silu(self.conv(u))
        delta = F.softplus(self.dt_proj(x)).transpose(1, 2)
        return (u.transpose(1, 2), delta, -torch.exp(self.A_log), self.B_proj(x).transpose(1, 2),
                self.C_proj(x).transpose(1, 2))

    def forward(self, x: Tensor) -> Tensor:
        u, delta, A, B, C = self.scan_inputs(x)
        return self.out_proj(selective_scan(u, delta, A, B, C, D=self.D).transpose(1, 2))


def make_mixer(kind: str, config: RecallConfig) -> nn.Module:
    """The mixer module of one layer."""
    if kind == "attention":
        return SoftmaxMixer(config)
    if kind == "window":
        return SoftmaxMixer(config, window=config.window)
    if kind == "linear":
        return LinearMixer(config)
    if kind in ("delta", "gated_delta"):
        return DeltaMixer(config, gated=kind == "gated_delta")
    return S6Mixer(config)


class RecallBlock(nn.Module):
    """x + Mixer(Conv(Norm(x))), then x + MLP(Norm(x))."""

    def __init__(self, kind: str, config: RecallConfig):
        super().__init__()
        d = config.d_model
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.conv = CausalConv(d, config.conv_width) if config.conv == "block" else nn.Identity()
        self.mixer = make_mixer(kind, config)
        self.mlp = nn.Sequential(nn.Linear(d, config.d_ff, bias=False), nn.GELU(),
                                 nn.Linear(config.d_ff, d, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.conv(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Embedding, ``RecallBlock``s (two; four for ``hybrid_1in4``), a final norm and an output layer:
    ids (B, T) -> logits (B, T, vocab).

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """

    def __init__(self, config: RecallConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(RecallBlock(kind, config) for kind in config.layer_mixers)
        self.norm = nn.RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(self._check_ids(ids))                                  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))                                        # (B, T, vocab)

    def _check_ids(self, ids, name: str = "ids") -> Tensor:
        """ids (B, T), integers in [0, vocab_size), on the model's device."""
        ids = check_ids(name, ids, self.config.vocab_size, dim=2, layout="(B, T)")
        if ids.shape[1] == 0:
            raise ValueError(f"{name} {shape_str(ids)} need at least one token per row")
        device = self.embed.weight.device
        if ids.device != device:
            raise ValueError(f"ids are on {ids.device} but the model is on {device}: move them first")
        return ids

    @torch.no_grad()
    def mixer_weights(self, ids: Tensor, layer: int = -1) -> Tensor:
        """The implicit attention matrix of one layer's mixer on ``ids`` (B, T): (B, heads, T, T).

        Each head's (or, for s6, each channel's) output is sum_s W[t, s] v_s over the values it mixes:
        softmax weights for attention, ``recurrent.linear_attention_weights`` for linear attention,
        ``recurrent.delta_rule_weights`` for the delta rules, ``recurrent.selective_scan_weights`` for s6
        (one matrix per channel, d of them).
        """
        x = self.embed(self._check_ids(ids))
        n = len(self.blocks)
        layer = check_int("layer", layer, low=-n, high=n - 1) % n
        for block in self.blocks[:layer]:
            x = block(x)
        block = self.blocks[layer]
        x = block.conv(block.norm1(x))                                        # what the mixer reads
        mixer = block.mixer
        if isinstance(mixer, SoftmaxMixer):
            x = _conv_silu(mixer.conv, x)
            return mixer.attn(x, attn_mask=mixer.mask(x.shape[1], x.device), need_weights=True)[1]
        if isinstance(mixer, S6Mixer):
            _, delta, A, B, C = mixer.scan_inputs(x)
            return selective_scan_weights(delta, A, B, C)
        q, k, _ = mixer.qkv(x)
        if isinstance(mixer, LinearMixer):
            return linear_attention_weights(q, k)
        beta, g = mixer.gates(x)
        return delta_rule_weights(F.normalize(q, dim=-1), F.normalize(k, dim=-1), beta, g=g)


def count_parameters(model_or_config: nn.Module | RecallConfig) -> int:
    """Trainable parameters of a model (or of the model a config builds).

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """
    if not isinstance(model_or_config, nn.Module | RecallConfig):
        raise ValueError(f"model_or_config must be a model or a RecallConfig, got {type(model_or_config).__name__}")
    model = RecallModel(model_or_config) if isinstance(model_or_config, RecallConfig) else model_or_config
    return sum(p.numel() for p in model.parameters())


def state_bytes(config: RecallConfig, kind: str | None = None, bytes_per_value: float = 4) -> int:
    """What one layer of mixer ``kind`` (default the config's) keeps per sequence while decoding, when constant.

    delta, gated_delta: h x dk x dv;  linear: h x (dk x dv + dk) (the sums of phi(k) v^T and phi(k));
    s6: d x n;  window: keys and values of the last ``window`` tokens, 2 x window x d. Attention's cache
    grows with the sequence (see ``presets.kv_cache_bytes``) and has no constant size: ValueError.

    Taught in notebook 16, "6. Memory per token in decoding: a state against a cache".
    """
    if not isinstance(config, RecallConfig):
        raise ValueError(f"config must be a RecallConfig, got {type(config).__name__}")
    kind = config.mixer if kind is None else check_choice("kind", kind, MIXERS)
    check_real("bytes_per_value", bytes_per_value, low=0, low_open=True)
    dk = config.d_model // config.n_heads
    values = {"delta": config.n_heads * dk * dk, "gated_delta": config.n_heads * dk * dk,
              "linear": config.n_heads * (dk * dk + dk), "s6": config.d_model * config.d_state,
              "window": 2 * config.window * config.d_model}
    if kind not in values:
        raise ValueError(f"a {kind!r} layer has no constant-size state; its KV cache grows with the tokens")
    return int(values[kind] * bytes_per_value)


@torch.no_grad()
def recall_accuracy(model: RecallModel, inputs: Tensor, targets: Tensor, batch_size: int = 256) -> float:
    """Share of the queries (targets != -100) whose value the model predicts exactly (argmax).

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """
    if not isinstance(model, RecallModel):
        raise ValueError(f"model must be a RecallModel, got {type(model).__name__}")
    inputs = model._check_ids(inputs, "inputs")
    targets = check_ids("targets", targets, dim=2, layout="(B, T)")
    if targets.shape != inputs.shape:
        raise ValueError(f"targets {shape_str(targets)} must have the shape of inputs {shape_str(inputs)}")
    batch_size = check_positive_int("batch_size", batch_size)
    asked = targets != IGNORE_INDEX
    if not asked.any():
        raise ValueError(f"targets hold no query (every entry is {IGNORE_INDEX}): there is nothing to score")
    if ((targets[asked] < 0) | (targets[asked] >= model.config.vocab_size)).any():
        raise ValueError(f"targets must be {IGNORE_INDEX} or in [0, vocab_size={model.config.vocab_size})")
    model.eval()
    right = total = 0
    for i in range(0, inputs.shape[0], batch_size):
        logits = model(inputs[i:i + batch_size])
        asked = targets[i:i + batch_size] != IGNORE_INDEX
        right += (logits.argmax(-1)[asked] == targets[i:i + batch_size][asked]).sum().item()
        total += asked.sum().item()
    return right / total


def load_recall_model(run: str, directory: str | Path | None = None) -> RecallModel:
    """Load a shipped run (``<run>.safetensors`` + ``<run>.json``) in eval mode, with its record as ``.info``.

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """
    from safetensors.torch import load_file

    if not isinstance(run, str):
        raise ValueError(f"run must be a run's name (a str), got {type(run).__name__}")
    directory = Path(directory) if directory is not None else RECALL_DIR
    weights, record = directory / f"{run}.safetensors", directory / f"{run}.json"
    for path in (weights, record):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found; train it with `python -m selfattn_lite.course.train_recall`")
    info = json.loads(record.read_text(encoding="utf-8"))
    model = RecallModel(RecallConfig(**info["config"]))
    model.load_state_dict(load_file(str(weights)))
    model.info = info
    return model.eval()


def recall_runs(directory: str | Path | None = None) -> list[dict]:
    """Every shipped run's JSON record, sorted by name.

    Taught in notebook 16, "5. The experiment: one protocol for every mixer, three seeds each".
    """
    directory = Path(directory) if directory is not None else RECALL_DIR
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]


def draw_eval_rows(n_rows: int, seq_len: int, n_pairs: int, vocab_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """``mqar`` rows from their own seeded generator (evaluation never shares the training stream)."""
    return mqar(n_rows, seq_len, n_pairs, vocab_size, generator=torch.Generator().manual_seed(seed))


def config_dict(config: RecallConfig) -> dict:
    """The config as the JSON record stores it."""
    return asdict(config)


def with_mixer(config: RecallConfig, mixer: str, **changes) -> RecallConfig:
    """A copy of ``config`` with another mixer (and other changes)."""
    return replace(config, mixer=mixer, **changes)
