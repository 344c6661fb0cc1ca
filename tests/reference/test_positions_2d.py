"""selfattn_lite.positions.apply_rotary_2d (axial 2D RoPE) against complex rotations and the 2D-offset property."""

from __future__ import annotations

import pytest
import torch

from selfattn_lite.positions import apply_rotary, apply_rotary_2d, rope_inv_freq


def grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of every patch of an h x w grid, in raster order: two (h*w,) tensors."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return rows.flatten(), cols.flatten()


def complex_rotation_2d(x, rows, cols, base=10000.0):
    """Independent reference: each half's pair (a, b) -> (a + ib) * exp(i * position * theta)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(d // 4, dtype=torch.float64) * 4 / d)          # (d/4,)
    out = []
    for half, pos in zip(x.double().chunk(2, dim=-1), (rows, cols)):
        a, b = half.chunk(2, dim=-1)
        z = torch.complex(a, b) * torch.polar(torch.ones(len(pos), d // 4, dtype=torch.float64),
                                              pos.double()[:, None] * theta)
        out += [z.real, z.imag]
    return torch.cat([out[0], out[1], out[2], out[3]], dim=-1).to(x.dtype)


def test_matches_complex_rotation():
    rows, cols = grid(3, 5)
    x = torch.randn(2, 4, 15, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(apply_rotary_2d(x, rows, cols), complex_rotation_2d(x, rows, cols))
    torch.testing.assert_close(apply_rotary_2d(x, rows, cols, base=100.0),
                               complex_rotation_2d(x, rows, cols, base=100.0))


def test_score_depends_only_on_the_2d_offset():
    h, w, d = 4, 6, 32
    rows, cols = grid(h, w)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    qr = apply_rotary_2d(q.expand(h * w, d), rows, cols, base=100.0)                # (T, d)
    kr = apply_rotary_2d(k.expand(h * w, d), rows, cols, base=100.0)
    scores = qr @ kr.T                                                                # (T, T)
    seen = {}
    for i in range(h * w):
        for j in range(h * w):
            offset = (int(rows[i] - rows[j]), int(cols[i] - cols[j]))
            seen.setdefault(offset, []).append(scores[i, j])
    assert len(seen) == (2 * h - 1) * (2 * w - 1)
    for values in seen.values():
        values = torch.stack(values)
        assert (values - values[0]).abs().max() < 1e-4
    distinct = torch.stack([v[0] for v in seen.values()])
    assert distinct.std() > 0.1                                # the offsets do change the score


def test_each_half_is_1d_rope():
    rows, cols = grid(2, 3)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
    out = apply_rotary_2d(x, rows, cols)
    theta = rope_inv_freq(4)
    for half, pos, got in zip(x.chunk(2, -1), (rows, cols), out.chunk(2, -1)):
        angles = pos.float()[:, None] * theta
        torch.testing.assert_close(got, apply_rotary(half, angles.cos(), angles.sin()))
    zero = torch.zeros(6, dtype=torch.long)
    torch.testing.assert_close(apply_rotary_2d(x, zero, zero), x)  # patch (0, 0): nothing turns


def test_bad_input_raises_naming_shapes():
    rows, cols = grid(2, 3)
    with pytest.raises(ValueError, match="multiple of 4"):
        apply_rotary_2d(torch.randn(6, 6), rows, cols)
    with pytest.raises(ValueError, match=r"rows must be a \(6,\) tensor"):
        apply_rotary_2d(torch.randn(6, 8), rows[:5], cols)
    with pytest.raises(ValueError, match="floating"):
        apply_rotary_2d(torch.ones(6, 8, dtype=torch.long), rows, cols)
