"""Small two-layer models that differ only in their token mixer, for multi-query associative recall.

    x_0 = Embed(ids)
    x_l = x_{l-1} + Mixer_l(Conv(Norm(x_{l-1})))    Conv: a short causal depthwise convolution (width 3)
    x_l = x_l + MLP(Norm(x_l))
    logits = Norm(x_2) W_out

Every model has the same embedding, convolutions, MLPs and output layer; only the mixer changes:

    attention    softmax attention (``MultiHeadAttention``), causal
    window       the same, each query seeing only its last ``window`` tokens (``efficient.sliding_window_mask``)
    linear       causal linear attention, elu + 1 features (``efficient.linear_attention``)
    delta        the delta rule (``recurrent.delta_rule``), unit keys and queries, beta = sigmoid(W_beta x)
    gated_delta  the same with a decay g = log sigmoid(W_g x + b)  (Gated DeltaNet's gate)
    s6           Mamba's selective scan (``recurrent.selective_scan``) with state size ``d_state``
    hybrid       layer 1 gated_delta, layer 2 attention

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

from ._checks import check_choice, check_ids, check_int, check_positive_int, check_real, shape_str
from .efficient import linear_attention, sliding_window_mask
from .masks import causal_mask
from .multihead import MultiHeadAttention
from .recall import IGNORE_INDEX, mqar
from .recurrent import delta_rule, delta_rule_weights, linear_attention_weights, selective_scan, selective_scan_weights

__all__ = ["MIXERS", "RecallConfig", "RecallModel", "count_parameters", "state_bytes", "recall_accuracy",
           "load_recall_model", "recall_runs", "RECALL_DIR", "PARAMETER_TOLERANCE"]

MIXERS = ("attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid")
RECURRENT = ("linear", "delta", "gated_delta", "s6")
RECALL_DIR = Path(__file__).parent / "data" / "recall"
PARAMETER_TOLERANCE = 0.10     # every model within 10% of the attention model's parameter count


@dataclass(frozen=True)
class RecallConfig:
    """The shape of a recall model. ``window`` is used by ``window``; ``d_state`` by ``s6``.

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
    """

    mixer: str = "attention"
    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 2
    d_state: int = 16
    window: int = 8
    d_ff: int = 64

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {self.mixer!r}")
        for name in ("vocab_size", "d_model", "n_heads", "d_state", "window", "d_ff"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    @property
    def layer_mixers(self) -> tuple[str, str]:
        """The mixer of each of the two layers."""
        return ("gated_delta", "attention") if self.mixer == "hybrid" else (self.mixer, self.mixer)


class CausalConv(nn.Module):
    """Depthwise causal convolution: y_t = sum_{j < width} w_j * x_{t-j}, one filter per channel."""

    def __init__(self, d_model: int, width: int = 3):
        super().__init__()
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model, padding=width - 1)

    def forward(self, x: Tensor) -> Tensor:                                   # (B, T, d) -> (B, T, d)
        return self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)


class SoftmaxMixer(nn.Module):
    """Softmax attention, causal, or restricted to the last ``window`` tokens."""

    def __init__(self, config: RecallConfig, window: int | None = None):
        super().__init__()
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, bias=False)
        self.window = window

    def mask(self, T: int, device=None) -> Tensor:
        """(T, T) bool, True = may attend."""
        if self.window is None:
            return causal_mask(T, device=device)
        return sliding_window_mask(T, self.window, device=device)

    def forward(self, x: Tensor) -> Tensor:
        return self.attn(x, attn_mask=self.mask(x.shape[1], x.device))[0]


class _Heads(nn.Module):
    """q, k, v and output projections shared by the linear-attention and delta-rule mixers."""

    def __init__(self, config: RecallConfig):
        super().__init__()
        d = config.d_model
        self.h = config.n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def split(self, t: Tensor) -> Tensor:                                     # (B, T, d) -> (B, h, T, d/h)
        B, T, d = t.shape
        return t.view(B, T, self.h, d // self.h).transpose(1, 2)

    def merge(self, t: Tensor) -> Tensor:                                     # (B, h, T, dv) -> (B, T, d)
        B, h, T, dv = t.shape
        return self.out_proj(t.transpose(1, 2).reshape(B, T, h * dv))


class LinearMixer(_Heads):
    """Causal linear attention with elu + 1 features (notebook 08's)."""

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.split(self.q_proj(x)), self.split(self.k_proj(x)), self.split(self.v_proj(x))
        return self.merge(linear_attention(q, k, v, is_causal=True, chunk_size=16))


class DeltaMixer(_Heads):
    """The delta rule on unit queries and keys, beta_t = sigmoid(W_beta x_t); gated: g_t = log sigmoid(W_g x_t + b)."""

    def __init__(self, config: RecallConfig, gated: bool):
        super().__init__(config)
        self.beta_proj = nn.Linear(config.d_model, config.n_heads)
        self.g_proj = nn.Linear(config.d_model, config.n_heads) if gated else None
        if gated:
            nn.init.constant_(self.g_proj.bias, 5.0)      # start at exp(g) = sigmoid(5) = 0.993 per token: remember

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """beta and g, (B, h, T) each (g None when not gated)."""
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)
        g = None if self.g_proj is None else F.logsigmoid(self.g_proj(x)).transpose(1, 2)
        return beta, g

    def forward(self, x: Tensor, chunk_size: int | None = 16) -> Tensor:
        q = F.normalize(self.split(self.q_proj(x)), dim=-1)
        k = F.normalize(self.split(self.k_proj(x)), dim=-1)
        v = self.split(self.v_proj(x))
        beta, g = self.gates(x)
        return self.merge(delta_rule(q, k, v, beta, g=g, chunk_size=chunk_size))


class S6Mixer(nn.Module):
    """Mamba's selective scan: u = W_u x, delta = softplus(W_dt x + b), B = W_B x, C = W_C x, A = -exp(A_log)."""

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

    def scan_inputs(self, x: Tensor) -> tuple[Tensor, ...]:
        """u, delta (B, d, T); A (d, n); B, C (B, n, T): ``selective_scan``'s arguments."""
        u = self.in_proj(x).transpose(1, 2)
        delta = F.softplus(self.dt_proj(x)).transpose(1, 2)
        return u, delta, -torch.exp(self.A_log), self.B_proj(x).transpose(1, 2), self.C_proj(x).transpose(1, 2)

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
        self.conv = CausalConv(d)
        self.mixer = make_mixer(kind, config)
        self.mlp = nn.Sequential(nn.Linear(d, config.d_ff, bias=False), nn.GELU(),
                                 nn.Linear(config.d_ff, d, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.conv(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Embedding, two ``RecallBlock``s, a final norm and an output layer: ids (B, T) -> logits (B, T, vocab).

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
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
            return mixer.attn(x, attn_mask=mixer.mask(x.shape[1], x.device), need_weights=True)[1]
        if isinstance(mixer, S6Mixer):
            _, delta, A, B, C = mixer.scan_inputs(x)
            return selective_scan_weights(delta, A, B, C)
        q, k = mixer.split(mixer.q_proj(x)), mixer.split(mixer.k_proj(x))
        if isinstance(mixer, LinearMixer):
            return linear_attention_weights(q, k)
        beta, g = mixer.gates(x)
        return delta_rule_weights(F.normalize(q, dim=-1), F.normalize(k, dim=-1), beta, g=g)


def count_parameters(model_or_config: nn.Module | RecallConfig) -> int:
    """Trainable parameters of a model (or of the model a config builds).

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
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

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
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

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
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

    Taught in notebook 16, "5. The experiment: trained models, three seeds each".
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
