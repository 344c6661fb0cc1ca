"""The fixed-state mixers against independent loops written from their formulas (float64, random shapes)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.efficient import linear_attention, linear_attention_step
from selfattn_lite.recurrent import (
    delta_rule,
    delta_rule_step,
    delta_rule_weights,
    linear_attention_weights,
    selective_scan,
    selective_scan_step,
    selective_scan_weights,
)

f64 = dict(dtype=torch.float64)


def loop_delta_rule(q, k, v, beta, g, scale, S0):
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T; o_t = scale q_t^T S_t, one (b, h) at a time."""
    B, h, T, dk = k.shape
    o = torch.zeros(B, h, T, v.shape[-1], **f64)
    S_out = torch.zeros(B, h, dk, v.shape[-1], **f64)
    eye = torch.eye(dk, **f64)
    for b in range(B):
        for j in range(h):
            S = S0[b, j].clone()
            for t in range(T):
                kt = k[b, j, t][:, None]                                  # column (dk, 1)
                decay = 1.0 if g is None else torch.exp(g[b, j, t])
                S = decay * (eye - beta[b, j, t] * kt @ kt.T) @ S + beta[b, j, t] * kt @ v[b, j, t][None, :]
                o[b, j, t] = scale * q[b, j, t] @ S
            S_out[b, j] = S
    return o, S_out


def loop_selective_scan(u, delta, A, B, C, D, x0):
    """x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t, y_t = C_t . x_t + D u_t, one channel at a time."""
    batch, d, T = u.shape
    y = torch.zeros(batch, d, T, **f64)
    x_out = torch.zeros(batch, d, A.shape[1], **f64)
    for b in range(batch):
        for i in range(d):
            x = x0[b, i].clone()
            for t in range(T):
                x = torch.exp(delta[b, i, t] * A[i]) * x + delta[b, i, t] * B[b, :, t] * u[b, i, t]
                y[b, i, t] = (C[b, :, t] * x).sum() + (0.0 if D is None else D[i] * u[b, i, t])
            x_out[b, i] = x
    return y, x_out


def delta_inputs(B, h, T, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T, dk, generator=gen, **f64)
    k = F.normalize(torch.randn(B, h, T, dk, generator=gen, **f64), dim=-1)     # DeltaNet's unit keys
    v = torch.randn(B, h, T, dv, generator=gen, **f64)
    beta = torch.rand(B, h, T, generator=gen, **f64)
    g = -torch.rand(B, h, T, generator=gen, **f64)                               # log-decays in (-1, 0]
    S0 = torch.randn(B, h, dk, dv, generator=gen, **f64)
    return q, k, v, beta, g, S0


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 2), h=st.integers(1, 3), T=st.integers(1, 11), dk=st.integers(1, 5), dv=st.integers(1, 4),
       chunk=st.integers(1, 7), gated=st.booleans(), start=st.booleans(), seed=st.integers(0, 2**16))
def test_delta_rule_matches_the_loop_recurrent_and_chunked(B, h, T, dk, dv, chunk, gated, start, seed):
    q, k, v, beta, g, S0 = delta_inputs(B, h, T, dk, dv, seed)
    g = g if gated else None
    S0 = S0 if start else None
    scale = 0.7
    want_o, want_S = loop_delta_rule(q, k, v, beta, g, scale, torch.zeros(B, h, dk, dv, **f64) if S0 is None else S0)
    for chunk_size in (None, chunk):
        o, S = delta_rule(q, k, v, beta, g=g, scale=scale, initial_state=S0, chunk_size=chunk_size, return_state=True)
        torch.testing.assert_close(o, want_o)
        torch.testing.assert_close(S, want_S)
        torch.testing.assert_close(delta_rule(q, k, v, beta, g=g, scale=scale, initial_state=S0,
                                              chunk_size=chunk_size), want_o)


@pytest.mark.parametrize("T, chunk", [(10, 3), (10, 4), (7, 16), (12, 12), (1, 5)])
def test_chunk_sizes_that_do_not_divide_T(T, chunk):
    q, k, v, beta, g, S0 = delta_inputs(2, 2, T, 4, 3, seed=T * chunk)
    want_o, want_S = loop_delta_rule(q, k, v, beta, g, 4 ** -0.5, S0)              # default scale dk^-1/2
    o, S = delta_rule(q, k, v, beta, g=g, initial_state=S0, chunk_size=chunk, return_state=True)
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(S, want_S)


def test_delta_rule_overwrites_where_linear_attention_adds():
    k = torch.eye(4, **f64)[None, None, [0, 1, 0]]                                # key 0 written twice
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], **f64)[None, None]
    o = delta_rule(k, k, v, torch.ones(1, 1, 3, **f64), scale=1.0)
    torch.testing.assert_close(o[0, 0, 2], v[0, 0, 2])                           # the new value, not v0 + v2


def test_an_empty_sequence_keeps_the_state():
    q, k, v, beta, g, S0 = delta_inputs(1, 2, 0, 3, 2, seed=0)
    for chunk_size in (None, 4):
        o, S = delta_rule(q, k, v, beta, g=g, initial_state=S0, chunk_size=chunk_size, return_state=True)
        assert o.shape == (1, 2, 0, 2)
        torch.testing.assert_close(S, S0)


def test_one_step_and_the_gate():
    q, k, v, beta, g, S0 = delta_inputs(1, 2, 1, 3, 2, seed=5)
    o, S = delta_rule_step(S0, q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0], g=g[:, :, 0], scale=1.0)
    want_o, want_S = loop_delta_rule(q, k, v, beta, g, 1.0, S0)
    torch.testing.assert_close(o, want_o[:, :, 0])
    torch.testing.assert_close(S, want_S)


def test_implicit_matrices_reproduce_the_outputs():
    q, k, v, beta, g, _ = delta_inputs(2, 2, 9, 4, 3, seed=1)
    for gate in (None, g):
        A = delta_rule_weights(q, k, beta, g=gate)
        assert A.shape == (2, 2, 9, 9) and (A.triu(1) == 0).all()
        torch.testing.assert_close(A @ v, loop_delta_rule(q, k, v, beta, gate, 0.5, torch.zeros(2, 2, 4, 3, **f64))[0])
    W = linear_attention_weights(q, k)
    torch.testing.assert_close(W.sum(-1), torch.ones(2, 2, 9, **f64))
    torch.testing.assert_close(W @ v, linear_attention(q, k, v, is_causal=True, eps=0.0))
    state, outs = None, []                                                       # and the recurrent form
    for t in range(9):
        o, state = linear_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t], eps=0.0)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, 2), W @ v)


def scan_inputs(batch, d, n, T, seed):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, d, T, generator=gen, **f64)
    delta = F.softplus(torch.randn(batch, d, T, generator=gen, **f64))
    A = -torch.rand(d, n, generator=gen, **f64) * 2
    B, C = torch.randn(batch, n, T, generator=gen, **f64), torch.randn(batch, n, T, generator=gen, **f64)
    D = torch.randn(d, generator=gen, **f64)
    x0 = torch.randn(batch, d, n, generator=gen, **f64)
    return u, delta, A, B, C, D, x0


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 2), d=st.integers(1, 4), n=st.integers(1, 5), T=st.integers(1, 9),
       with_D=st.booleans(), start=st.booleans(), seed=st.integers(0, 2**16))
def test_selective_scan_matches_the_loop(batch, d, n, T, with_D, start, seed):
    u, delta, A, B, C, D, x0 = scan_inputs(batch, d, n, T, seed)
    D = D if with_D else None
    want_y, want_x = loop_selective_scan(u, delta, A, B, C, D, x0 if start else torch.zeros(batch, d, n, **f64))
    y, x = selective_scan(u, delta, A, B, C, D=D, initial_state=x0 if start else None, return_state=True)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(x, want_x)
    torch.testing.assert_close(selective_scan(u, delta, A, B, C, D=D, initial_state=x0 if start else None), want_y)
    if not start:                                                                # the parallel form
        W = selective_scan_weights(delta, A, B, C)
        par = (W @ u[..., None])[..., 0] + (0.0 if D is None else D[:, None] * u)
        torch.testing.assert_close(par, want_y)


def test_selective_scan_step():
    u, delta, A, B, C, D, x0 = scan_inputs(2, 3, 4, 1, seed=2)
    y, x = selective_scan_step(x0, u[..., 0], delta[..., 0], A, B[..., 0], C[..., 0], D=D)
    want_y, want_x = loop_selective_scan(u, delta, A, B, C, D, x0)
    torch.testing.assert_close(y, want_y[..., 0])
    torch.testing.assert_close(x, want_x)


def test_gradients_flow_through_the_chunked_form():
    q, k, v, beta, g, _ = delta_inputs(1, 2, 10, 4, 3, seed=3)
    for t in (q, k, v, beta, g):
        t.requires_grad_(True)
    delta_rule(q, k, v, beta, g=g, chunk_size=4).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v, beta, g))


def test_bad_shapes_are_named():
    q, k, v, beta, g, S0 = delta_inputs(2, 2, 5, 4, 3, seed=0)
    with pytest.raises(ValueError, match=r"q \(2, 2, 5\) must have 4 dims"):
        delta_rule(q[..., 0], k, v, beta)
    with pytest.raises(ValueError, match=r"q \(2, 2, 5, 3\), k \(2, 2, 5, 4\)"):
        delta_rule(q[..., :3], k, v, beta)
    with pytest.raises(ValueError, match=r"v \(2, 2, 4, 3\)"):
        delta_rule(q, k, v[:, :, :4], beta)
    with pytest.raises(ValueError, match=r"beta \(2, 2, 4\) must be \(B, h, T\) = \(2, 2, 5\)"):
        delta_rule(q, k, v, beta[..., :4])
    with pytest.raises(ValueError, match=r"g \(2, 5\) must have 3 dims"):
        delta_rule(q, k, v, beta, g=g[0])
    with pytest.raises(ValueError, match=r"initial_state \(2, 2, 3, 4\) must be \(B, h, dk, dv\) = \(2, 2, 4, 3\)"):
        delta_rule(q, k, v, beta, initial_state=S0.transpose(-2, -1))
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int, got 0"):
        delta_rule(q, k, v, beta, chunk_size=0)
    u, delta, A, B, C, D, x0 = scan_inputs(2, 3, 4, 6, seed=0)
    with pytest.raises(ValueError, match=r"delta \(2, 3, 5\) must be \(batch, d, T\) like u \(2, 3, 6\)"):
        selective_scan(u, delta[..., :5], A, B, C)
    with pytest.raises(ValueError, match=r"A \(4, 4\) must be \(d, n\) with d = 3"):
        selective_scan(u, delta, torch.zeros(4, 4, **f64), B, C)
    with pytest.raises(ValueError, match=r"C \(2, 3, 6\) must be \(batch, n, T\) = \(2, 4, 6\)"):
        selective_scan(u, delta, A, B, C[:, :3])
    with pytest.raises(ValueError, match=r"D \(4,\) must be \(d,\) = \(3,\)"):
        selective_scan(u, delta, A, B, C, D=torch.zeros(4, **f64))
    with pytest.raises(ValueError, match=r"initial_state \(2, 4, 3\) must be \(batch, d, n\) = \(2, 3, 4\)"):
        selective_scan(u, delta, A, B, C, initial_state=x0.transpose(1, 2))
    with pytest.raises(ValueError, match=r"u \(3, 6\) must have 3 dims"):
        selective_scan(u[0], delta, A, B, C)
