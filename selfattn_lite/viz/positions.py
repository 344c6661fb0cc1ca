"""Notebooks 05 and 12's figures and widgets: RoPE's rotation of one pair, and the frequency
spectrum under each context-extension method.

* ``draw_rope_rotation`` / ``RopeRotationWidget``: a query at position m and a key at
  m - offset, both rotated; their dot product stays put as m moves.
* ``rope_frequency_chart`` / ``RopeScalingWidget``: wavelength of every pair before and
  after linear, NTK-aware, YaRN or Llama 3.1 scaling.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from ..positions import apply_rotary, scaled_inv_freq
from ..rope_scaling import SCALING_KINDS
from .core import HeatmapWidget

__all__ = ["SCALING_COLORS", "SCALING_LABELS", "rotate_pair", "draw_rope_rotation", "move_rope_rotation",
           "rope_frequency_chart",
           "RopeRotationWidget", "RopeScalingWidget"]

# Okabe-Ito colours plus distinct line styles, so the lines differ without colour too.
SCALING_COLORS = {None: "#000000", "linear": "#0072B2", "ntk": "#E69F00", "yarn": "#009E73", "llama3": "#CC79A7"}
SCALING_STYLES = {None: "-", "linear": "--", "ntk": "-.", "yarn": ":", "llama3": (0, (5, 1, 1, 1, 1, 1))}
SCALING_LABELS = {None: "original", "linear": "linear (PI)", "ntk": "NTK-aware", "yarn": "YaRN",
                  "llama3": "Llama 3.1"}
Q_COLOR, K_COLOR = "#0072B2", "#D55E00"


def rotate_pair(v, position: int, theta: float) -> torch.Tensor:
    """Rotate a 2D vector v by the angle position * theta (RoPE on a single pair)."""
    v = torch.as_tensor(v, dtype=torch.float64).reshape(1, 2)       # (T=1, d=2)
    angle = torch.tensor([[position * theta]], dtype=torch.float64)  # (T=1, d/2=1)
    return apply_rotary(v, angle.cos(), angle.sin())[0]             # (2,)


def draw_rope_rotation(fig: Figure, q, k, theta: float, position: int, offset: int, max_position: int) -> dict:
    """Left: q at position m and k at n = m - offset, rotated, on the plane. Right: q_m . k_n for
    n = m - offset (flat) and for n = 0 (moves with the offset m).

    Returns:
        The artists that change with m ("q", "k": arrows, "marker", "cursor", "title"), for
        redrawing in place.
    """
    q, k = torch.as_tensor(q, dtype=torch.float64), torch.as_tensor(k, dtype=torch.float64)
    ax_plane, ax_score = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.5]})

    radius = 1.15 * max(q.norm().item(), k.norm().item())
    circle = np.linspace(0, 2 * np.pi, 200)
    ax_plane.plot(radius / 1.15 * np.cos(circle), radius / 1.15 * np.sin(circle), color="#cccccc", lw=0.8)
    artists = {}
    for name, vec, color, label in (("q", q, Q_COLOR, "q at m"), ("k", k, K_COLOR, f"k at n = m - {offset}")):
        ax_plane.annotate("", xy=vec.tolist(), xytext=(0, 0),
                          arrowprops=dict(arrowstyle="->", color=color, alpha=0.3, lw=1.2))
        artists[name] = ax_plane.annotate("", xy=vec.tolist(), xytext=(0, 0),
                                          arrowprops=dict(arrowstyle="-|>", color=color, lw=2))
        ax_plane.plot([], [], color=color, lw=2, label=label)
    ax_plane.plot([], [], color="#999999", alpha=0.5, lw=1.2, label="before rotation")
    ax_plane.set(xlim=(-radius, radius), ylim=(-radius, radius), aspect="equal", xlabel="pair dim 1",
                 ylabel="pair dim 2")
    ax_plane.legend(loc="lower left", fontsize=7, framealpha=0.8)
    artists["title"] = ax_plane.set_title("", fontsize=9)

    ms = list(range(max_position + 1))
    same_offset = [float(rotate_pair(q, m, theta) @ rotate_pair(k, m - offset, theta)) for m in ms]
    key_at_zero = [float(rotate_pair(q, m, theta) @ rotate_pair(k, 0, theta)) for m in ms]
    ax_score.plot(ms, same_offset, color=Q_COLOR, lw=2, label=f"k at n = m - {offset}: constant")
    ax_score.plot(ms, key_at_zero, color=K_COLOR, ls="--", label="k at n = 0: changes with m - n")
    artists["marker"], = ax_score.plot([], [], "o", color="black")
    artists["cursor"] = ax_score.axvline(0, color="#999999", lw=0.8)
    ax_score.set(xlabel="query position m", ylabel="q_m . k_n")
    ax_score.set_title("The score depends only on the offset m - n", fontsize=9)
    ax_score.legend(fontsize=7, loc="lower left")
    move_rope_rotation(artists, q, k, theta, position, offset)
    fig.tight_layout()                                  # after the two-line title is set
    return artists


def move_rope_rotation(artists: dict, q, k, theta: float, position: int, offset: int) -> None:
    """Put the artists of ``draw_rope_rotation`` at a new query position m (same offset)."""
    n = position - offset
    q_rot, k_rot = rotate_pair(q, position, theta), rotate_pair(k, n, theta)
    score = float(q_rot @ k_rot)
    artists["q"].xy, artists["k"].xy = q_rot.tolist(), k_rot.tolist()
    artists["marker"].set_data([position], [score])
    artists["cursor"].set_xdata([position, position])
    artists["title"].set_text(f"q at m = {position}, k at n = {n} (theta = {theta:g})\nq.k = {score:.3f}")


def rope_frequency_chart(scalings: dict, *, head_dim: int = 128, base: float = 10000.0,
                         original_max_len: int | None = None, factor: float | None = None, axes=None):
    """Wavelength of every RoPE pair, and how much each method slows it down, on one figure.

    Args:
        scalings: label -> scaling dict (or None for the unscaled frequencies).
        head_dim, base: of the rotary embedding.
        original_max_len, factor: draw the trained context L and the target s * L.
        axes: two Axes (wavelength, slow-down); default a new pyplot figure.

    Returns:
        The two Axes.
    """
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_wave, ax_ratio = axes
    plain, _ = scaled_inv_freq(head_dim, base, None)
    pairs = np.arange(head_dim // 2)
    for label, scaling in scalings.items():
        kind = None if scaling is None else scaling["kind"]
        inv_freq, mscale = scaled_inv_freq(head_dim, base, scaling)
        style = dict(color=SCALING_COLORS[kind], ls=SCALING_STYLES[kind], lw=2 if kind else 1.5)
        extra = f", scores x{mscale ** 2:.2f}" if mscale != 1.0 else ""
        ax_wave.plot(pairs, (2 * math.pi / inv_freq).numpy(), label=label + extra, **style)
        ax_ratio.plot(pairs, (plain / inv_freq).numpy(), label=label, **style)
    if original_max_len is not None:
        ax_wave.axhline(original_max_len, color="#777777", lw=0.8)
        ax_wave.text(0, original_max_len * 1.3, f"trained context L = {original_max_len}", fontsize=8,
                     color="#555555")
        if factor is not None:
            ax_wave.axhline(original_max_len * factor, color="#777777", lw=0.8, ls=":")
            ax_wave.text(0, original_max_len * factor * 1.3, f"target s*L = {int(original_max_len * factor)}",
                         fontsize=8, color="#555555")
    ax_wave.set(yscale="log", xlabel="pair i (0 = fastest)", ylabel="wavelength 2 pi / theta_i (tokens)",
                title="Wavelength of each pair: slow pairs never turn once within L")
    top = max(line.get_ydata().max() for line in ax_ratio.get_lines())
    ticks = [2.0 ** e for e in range(int(math.log2(top)) + 1)]
    ax_ratio.set(yscale="log", xlabel="pair i (0 = fastest)", ylabel="theta_i / theta'_i (slow-down)",
                 title="How much each method slows down each pair")
    ax_ratio.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax_ratio.minorticks_off()
    ax_wave.legend(fontsize=8, loc="lower right")
    ax_ratio.legend(fontsize=8, loc="upper left")
    ax_wave.figure.tight_layout()
    return ax_wave, ax_ratio


class RopeRotationWidget(HeatmapWidget):
    """Slide the query's position m; the key sits ``offset`` tokens earlier.

    Both vectors turn by the same extra angle as m grows, so the angle between them, and
    q . k, stay the same. The right panel shows q_m . k_n over all m for that offset
    (flat) and for a key fixed at n = 0 (which moves).

    Args:
        q, k: 2D vectors (one RoPE pair of a query and a key).
        theta: the pair's frequency, radians per token.
        position, offset: initial m and m - n.
        max_position: largest m on the slider.

    Attributes:
        slider: the position m. offset: the offset m - n.
        q_rot, k_rot: the rotated vectors. score: q_rot . k_rot.
    """

    def __init__(self, q=(1.0, 0.3), k=(0.5, 0.9), theta: float = 0.3, position: int = 5, offset: int = 2,
                 max_position: int = 30):
        import ipywidgets as widgets

        self.q = torch.as_tensor(q, dtype=torch.float64)
        self.k = torch.as_tensor(k, dtype=torch.float64)
        for name, v in (("q", self.q), ("k", self.k)):
            if v.shape != (2,):
                raise ValueError(f"{name} must be a 2D vector (one RoPE pair), got shape {tuple(v.shape)}")
        self.theta, self.max_position = float(theta), max_position
        style = {"description_width": "initial"}
        self.slider = widgets.IntSlider(value=position, min=0, max=max_position, description="query position m",
                                        style=style, continuous_update=True)
        self.offset = widgets.IntSlider(value=offset, min=0, max=10, description="offset m - n", style=style)
        super().__init__([self.slider, self.offset], figsize=(9.0, 3.6))
        self.update()

    @property
    def q_rot(self) -> torch.Tensor:
        return rotate_pair(self.q, self.slider.value, self.theta)

    @property
    def k_rot(self) -> torch.Tensor:
        return rotate_pair(self.k, self.slider.value - self.offset.value, self.theta)

    @property
    def score(self) -> float:
        return float(self.q_rot @ self.k_rot)

    def draw(self, fig: Figure) -> None:
        self._artists = draw_rope_rotation(fig, self.q, self.k, self.theta, self.slider.value, self.offset.value,
                                           self.max_position)
        self._drawn_offset = self.offset.value

    def refresh(self, fig: Figure) -> bool:
        """Moving m only moves the arrows, the marker and the title; a new offset redraws all."""
        if self.offset.value != self._drawn_offset:
            return False
        move_rope_rotation(self._artists, self.q, self.k, self.theta, self.slider.value, self.offset.value)
        return True

    def dynamic_artists(self) -> list:
        return list(self._artists.values())


class RopeScalingWidget(HeatmapWidget):
    """Pick a context-extension method and a factor s; see what it does to every pair.

    Args:
        head_dim, base: of the rotary embedding (default: a Llama 2-like head).
        original_max_len: the trained context L (used by YaRN and Llama 3, and drawn).
        kind, factor: initial method and factor.

    Attributes:
        kind: dropdown of the method. factor: slider of s.
        scaling: the current scaling dict. inv_freq, attention_scaling: its result.
    """

    def __init__(self, head_dim: int = 128, base: float = 10000.0, original_max_len: int = 4096,
                 kind: str = "yarn", factor: float = 8.0):
        import ipywidgets as widgets

        if kind not in SCALING_KINDS:
            raise ValueError(f"unknown scaling kind {kind!r}; expected one of {list(SCALING_KINDS)}")
        self.head_dim, self.base, self.original_max_len = head_dim, base, original_max_len
        style = {"description_width": "initial"}
        self.kind = widgets.Dropdown(options=[(SCALING_LABELS[k], k) for k in SCALING_KINDS], value=kind,
                                     description="method", style=style)
        self.factor = widgets.FloatLogSlider(value=factor, base=2, min=0, max=6, step=0.25, description="factor s",
                                             readout_format=".1f", style=style, continuous_update=False)
        super().__init__([self.kind, self.factor], figsize=(11.0, 3.8))
        self.update()

    @property
    def scaling(self) -> dict:
        scaling = {"kind": self.kind.value, "factor": float(self.factor.value)}
        if self.kind.value in ("yarn", "llama3"):
            scaling["original_max_len"] = self.original_max_len
        return scaling

    @property
    def inv_freq(self) -> torch.Tensor:
        return scaled_inv_freq(self.head_dim, self.base, self.scaling)[0]

    @property
    def attention_scaling(self) -> float:
        return scaled_inv_freq(self.head_dim, self.base, self.scaling)[1]

    def draw(self, fig: Figure) -> None:
        label = f"{SCALING_LABELS[self.kind.value]}, s = {self.factor.value:.1f}"
        rope_frequency_chart({"original": None, label: self.scaling}, head_dim=self.head_dim, base=self.base,
                             original_max_len=self.original_max_len, factor=self.factor.value,
                             axes=fig.subplots(1, 2))
