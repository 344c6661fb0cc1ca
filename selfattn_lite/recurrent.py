"""Mixers with a fixed-size state: the delta rule (plain and gated) and a selective state-space scan.

Each has a recurrent form (one token at a time, a state of constant size) and a parallel or chunked
form (for training), equal in float64, and an *implicit attention matrix*: the weights with which each
output is a sum of past values (inputs), so that it can be drawn beside softmax attention's.

- ``delta_rule``: DeltaNet (Schlag, Irie & Schmidhuber, 2021), chunkwise-parallel through the WY
  representation (Yang et al., 2024), with the gate of Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025).
- ``selective_scan``: Mamba's S6 (Gu & Dao, 2023), in the shapes of its reference implementation.
- Linear attention (Katharopoulos et al., 2020) is ``efficient.linear_attention`` (chunked) and
  ``efficient.linear_attention_step`` (recurrent); ``linear_attention_weights`` here is its matrix.

Taught in notebook 16, sections 2 to 4.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import check_positive_int, check_real, check_same_dtype, check_shape, check_tensor, shape_str
from .efficient import elu_feature_map

__all__ = ["delta_rule", "delta_rule_step", "delta_rule_weights", "linear_attention_weights",
           "selective_scan", "selective_scan_step", "selective_scan_weights"]


# ---------------------------------------------------------------------------------------------
# The delta rule
# ---------------------------------------------------------------------------------------------

def _check_delta(q, k, v, beta, g, initial_state) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dim=4, layout="(B, h, T, d)", floating=True)
    check_tensor("beta", beta, dim=3, layout="(B, h, T)", floating=True)
    B, h, T, dk = k.shape
    if q.shape != k.shape or v.shape[:3] != (B, h, T):
        raise ValueError(f"q {shape_str(q)}, k {shape_str(k)} must be (B, h, T, dk) and v {shape_str(v)} "
                         f"(B, h, T, dv) with the same B, h, T")
    if beta.shape != (B, h, T):
        raise ValueError(f"beta {shape_str(beta)} must be (B, h, T) = {shape_str((B, h, T))}")
    if g is not None:
        check_tensor("g", g, dim=3, layout="(B, h, T)", floating=True)
        if g.shape != (B, h, T):
            raise ValueError(f"g {shape_str(g)} must be (B, h, T) = {shape_str((B, h, T))}")
    if initial_state is not None:
        want = (B, h, dk, v.shape[-1])
        if not isinstance(initial_state, Tensor) or initial_state.shape != want:
            got = shape_str(initial_state) if isinstance(initial_state, Tensor) else type(initial_state).__name__
            raise ValueError(f"initial_state {got} must be (B, h, dk, dv) = {shape_str(want)}")
        check_tensor("initial_state", initial_state, floating=True)
    check_same_dtype(q=q, k=k, v=v, beta=beta, g=g)


def _check_delta_step(state, q, k, v, beta, g) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dim=3, layout="(B, h, d)", floating=True)
    check_tensor("beta", beta, dim=2, layout="(B, h)", floating=True)
    check_tensor("state", state, dim=4, layout="(B, h, dk, dv)", floating=True)
    B, h, dk = k.shape
    against = f"q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}"
    check_shape("q", q, (B, h, dk), layout="(B, h, dk)", against=f"k {shape_str(k)}")
    check_shape("v", v, (B, h, None), layout="(B, h, dv)", against=f"k {shape_str(k)}")
    check_shape("beta", beta, (B, h), layout="(B, h)", against=against)
    if g is not None:
        check_tensor("g", g, dim=2, layout="(B, h)", floating=True)
        check_shape("g", g, (B, h), layout="(B, h)", against=against)
    check_shape("state", state, (B, h, dk, v.shape[-1]), layout="(B, h, dk, dv)", against=against)
    check_same_dtype(state=state, q=q, k=k, v=v, beta=beta, g=g)


def delta_rule_step(state: Tensor, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, g: Tensor | None = None,
                    scale: float | None = None) -> tuple[Tensor, Tensor]:
    """One token of the (gated) delta rule: decay the state, correct what it says about k, read it with q.

        S <- exp(g) S;   S <- S + beta k (v - k^T S)^T;   o = (scale q)^T S

    Args:
        state: (B, h, dk, dv). q, k: (B, h, dk). v: (B, h, dv). beta, g: (B, h) (g a log-decay, or None).
        scale: multiplies q (default dk ** -0.5).

    Returns:
        o (B, h, dv) and the new state (B, h, dk, dv).

    Taught in notebook 16, "2. The mixers, built in the open".
    """
    _check_delta_step(state, q, k, v, beta, g)
    scale = k.shape[-1] ** -0.5 if scale is None else check_real("scale", scale)
    return _delta_step(state, q, k, v, beta, g, scale)


def _delta_step(state, q, k, v, beta, g, scale) -> tuple[Tensor, Tensor]:
    """``delta_rule_step`` on checked arguments."""
    if g is not None:
        state = torch.exp(g)[..., None, None] * state                           # forget a little
    recalled = (k.unsqueeze(-2) @ state).squeeze(-2)                            # (B, h, dv) = k^T S
    state = state + beta[..., None, None] * k.unsqueeze(-1) * (v - recalled).unsqueeze(-2)   # write the error
    o = ((scale * q).unsqueeze(-2) @ state).squeeze(-2)                          # (B, h, dv)
    return o, state


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, g: Tensor | None = None,
               scale: float | None = None, initial_state: Tensor | None = None, chunk_size: int | None = None,
               return_state: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The delta rule (DeltaNet), gated when ``g`` is given (Gated DeltaNet).

    The state S (B, h, dk, dv) starts at ``initial_state`` (zeros if None) and for each t:

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = (scale q_t)^T S_t

    i.e. first S <- exp(g_t) S, then S <- S + beta_t k_t (v_t - k_t^T S)^T: the value the state
    currently returns for k_t is *replaced* by v_t (with beta_t = 1 and a unit k_t exactly), where
    linear attention would add v_t on top. Keys are used as given: the caller L2-normalises them.

    ``chunk_size=None`` runs that recurrence token by token. An integer C runs the chunkwise-parallel
    form (Yang et al., 2024): inside a chunk, with Gamma_t = exp(g_1 + ... + g_t) counted from the chunk's
    start and S_0 the state before it, the corrections u_t = beta_t (v_t - k_t^T exp(g_t) S_{t-1}) solve
    one unit lower-triangular system,

        (I + L) U = diag(beta) V - diag(beta Gamma) K S_0,   L[t, s] = beta_t (Gamma_t / Gamma_s) k_t . k_s  (s < t)

    (U = U~ - W S_0, the WY representation), after which the outputs and the next state are matrix products:

        O = scale (diag(Gamma) Q S_0 + (Q K^T * M) U),   M[t, s] = Gamma_t / Gamma_s (s <= t), 0 above;
        S_C = Gamma_C S_0 + K^T diag(Gamma_C / Gamma) U.

    Only the loop over chunks is sequential. C need not divide T (the last chunk is shorter).

    Args:
        q, k: (B, h, T, dk). v: (B, h, T, dv). beta: (B, h, T) write strengths, usually in (0, 1).
        g: (B, h, T) log-decays (<= 0; exp(g_t) multiplies the state) or None (no decay).
        scale: multiplies q (default dk ** -0.5). initial_state: (B, h, dk, dv) or None (zeros).
        chunk_size: None (recurrence) or a positive int (chunkwise-parallel form).
        return_state: also return the final state.

    Returns:
        o (B, h, T, dv), or (o, S_T) with S_T (B, h, dk, dv) when ``return_state``.

    Taught in notebook 16, "2. The mixers, built in the open".
    """
    _check_delta(q, k, v, beta, g, initial_state)
    B, h, T, dk = k.shape
    scale = dk ** -0.5 if scale is None else check_real("scale", scale)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    state = (torch.zeros(B, h, dk, v.shape[-1], dtype=v.dtype, device=v.device)
             if initial_state is None else initial_state.to(v.dtype))
    if chunk_size is None:
        outs = []
        for t in range(T):
            o, state = _delta_step(state, q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                   None if g is None else g[:, :, t], scale)
            outs.append(o)
        o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, h, 0, v.shape[-1])
    else:
        o, state = _delta_rule_chunked(q, k, v, beta, g, scale, state, check_positive_int("chunk_size", chunk_size))
    return (o, state) if return_state else o


def _delta_rule_chunked(q, k, v, beta, g, scale, state, C):
    """The chunkwise-parallel form of ``delta_rule`` (see its docstring): returns (o, final state)."""
    B, h, T, dk = k.shape
    if T == 0:
        return v.new_zeros(B, h, 0, v.shape[-1]), state
    if g is None:
        g = torch.zeros_like(beta)
    pad = (-T) % C                                        # padded tokens: k = v = beta = g = 0 leave S alone
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta, g = (torch.nn.functional.pad(t, (0, pad)) for t in (beta, g))
    N = (T + pad) // C
    q, k, v = (t.reshape(B, h, N, C, t.shape[-1]) for t in (q, k, v))           # (B, h, N, C, d)
    beta, g = beta.reshape(B, h, N, C), g.reshape(B, h, N, C)
    gamma = g.cumsum(dim=-1)                                                     # (B, h, N, C) log Gamma_t
    below = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    decay = torch.exp((gamma[..., :, None] - gamma[..., None, :]).masked_fill(~below, float("-inf")))  # M
    L = (beta[..., :, None] * decay * (k @ k.transpose(-2, -1))).tril(-1)       # (B, h, N, C, C) strictly lower
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    solve = torch.linalg.solve_triangular                                         # (I + L)^-1, unit lower
    u_tilde = solve(eye + L, beta[..., None] * v, upper=False, unitriangular=True)                      # U~
    w = solve(eye + L, (beta * torch.exp(gamma))[..., None] * k, upper=False, unitriangular=True)        # W
    scores = (q @ k.transpose(-2, -1)) * decay                                   # (B, h, N, C, C)
    outs = []
    for n in range(N):                                                           # only this loop is sequential
        u = u_tilde[:, :, n] - w[:, :, n] @ state                                # (B, h, C, dv)
        gam = gamma[:, :, n]                                                     # (B, h, C)
        outs.append(scale * (torch.exp(gam)[..., None] * (q[:, :, n] @ state) + scores[:, :, n] @ u))
        carry = torch.exp(gam[..., -1:] - gam)[..., None] * k[:, :, n]           # (B, h, C, dk)
        state = torch.exp(gam[..., -1])[..., None, None] * state + carry.transpose(-2, -1) @ u
    o = torch.cat(outs, dim=2)[:, :, :T]                                         # (B, h, T, dv)
    return o, state


def delta_rule_weights(q: Tensor, k: Tensor, beta: Tensor, *, g: Tensor | None = None,
                       scale: float | None = None) -> Tensor:
    """The delta rule's implicit attention matrix A (B, h, T, T): o_t = sum_s A[t, s] v_s from a zero state.

    One chunk of the chunkwise form with S_0 = 0: O = scale (Q K^T * M) (I + L)^-1 diag(beta) V, so
    A = scale (Q K^T * M) (I + L)^-1 diag(beta), lower triangular. Unlike softmax weights its entries
    can be negative and rows need not sum to 1.

    Args:
        q, k: (B, h, T, dk). beta, g: (B, h, T) (g None = no decay). scale: default dk ** -0.5.

    Returns:
        (B, h, T, T).

    Taught in notebook 16, "4. Implicit attention: each output as a weighted sum of past values".
    """
    for name, t in (("q", q), ("k", k)):
        check_tensor(name, t, dim=4, layout="(B, h, T, dk)", floating=True)
    B, h, T, _ = k.shape
    eye = torch.eye(T, dtype=k.dtype, device=k.device).expand(B, h, T, T)
    return delta_rule(q, k, eye, beta, g=g, scale=scale, chunk_size=max(T, 1))    # feed V = I: O = A


def linear_attention_weights(q: Tensor, k: Tensor, *,
                             feature_map: Callable[[Tensor], Tensor] = elu_feature_map) -> Tensor:
    """Causal linear attention's implicit attention matrix (Katharopoulos et al., 2020).

        A[t, s] = phi(q_t) . phi(k_s) / sum_{s' <= t} phi(q_t) . phi(k_s')  for s <= t, else 0

    so that ``efficient.linear_attention(q, k, v, is_causal=True)`` = A @ v (up to its eps).

    Args:
        q, k: (..., T, E). feature_map: non-negative features (default elu + 1).

    Returns:
        (..., T, T), rows summing to 1.

    Taught in notebook 16, "4. Implicit attention: each output as a weighted sum of past values".
    """
    for name, t in (("q", q), ("k", k)):
        check_tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., T, E), got shape {shape_str(t)}")
    if q.shape != k.shape:
        raise ValueError(f"q {shape_str(q)} and k {shape_str(k)} must have one shape (..., T, E)")
    check_same_dtype(q=q, k=k)
    scores = (feature_map(q) @ feature_map(k).transpose(-2, -1)).tril()          # (..., T, T)
    return scores / scores.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# The selective scan (Mamba's S6)
# ---------------------------------------------------------------------------------------------

def _check_scan(u, delta, A, B, C, D, initial_state, *, u_name: str = "u") -> None:
    check_tensor(u_name, u, dim=3, layout="(batch, d, T)", floating=True)
    check_tensor("A", A, dim=2, layout="(d, n)", floating=True)
    for name, t in (("B", B), ("C", C)):
        check_tensor(name, t, dim=3, layout="(batch, n, T)", floating=True)
    batch, d, T = u.shape
    n = A.shape[1]
    check_tensor("delta", delta, floating=True)
    if delta.shape != u.shape:
        raise ValueError(f"delta {shape_str(delta)} must be (batch, d, T) like u {shape_str(u)}")
    if A.shape[0] != d:
        raise ValueError(f"A {shape_str(A)} must be (d, n) with d = {d} ({u_name} is {shape_str(u)})")
    for name, t in (("B", B), ("C", C)):
        if t.shape != (batch, n, T):
            raise ValueError(f"{name} {shape_str(t)} must be (batch, n, T) = {shape_str((batch, n, T))} "
                             f"({u_name} {shape_str(u)}, A {shape_str(A)})")
    if D is not None and (not isinstance(D, Tensor) or D.shape != (d,)):
        raise ValueError(f"D {shape_str(D) if isinstance(D, Tensor) else type(D).__name__} must be (d,) = ({d},)")
    if initial_state is not None and (not isinstance(initial_state, Tensor) or initial_state.shape != (batch, d, n)):
        got = shape_str(initial_state) if isinstance(initial_state, Tensor) else type(initial_state).__name__
        raise ValueError(f"initial_state {got} must be (batch, d, n) = {shape_str((batch, d, n))}")
    check_same_dtype(**{u_name: u, "delta": delta, "A": A, "B": B, "C": C, "D": D})


def _check_scan_step(state, u, delta, A, B, C, D) -> None:
    check_tensor("u", u, dim=2, layout="(batch, d)", floating=True)
    check_tensor("delta", delta, floating=True)
    check_tensor("A", A, dim=2, layout="(d, n)", floating=True)
    batch, d = u.shape
    check_shape("delta", delta, (batch, d), layout="(batch, d)", against=f"u {shape_str(u)}")
    check_shape("A", A, (d, None), layout="(d, n)", against=f"u {shape_str(u)}")
    n = A.shape[1]
    against = f"u {shape_str(u)}, A {shape_str(A)}"
    for name, t in (("B", B), ("C", C)):
        check_tensor(name, t, floating=True)
        check_shape(name, t, (batch, n), layout="(batch, n)", against=against)
    if D is not None:
        check_tensor("D", D, floating=True)
        check_shape("D", D, (d,), layout="(d,)", against=against)
    check_tensor("state", state, floating=True)
    check_shape("state", state, (batch, d, n), layout="(batch, d, n)", against=against)
    check_same_dtype(state=state, u=u, delta=delta, A=A, B=B, C=C, D=D)


def selective_scan_step(state: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, *,
                        D: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token of S6: x <- exp(delta A) x + delta B u;  y = C . x + D u.

    Args:
        state x: (batch, d, n). u, delta: (batch, d). A: (d, n). B, C: (batch, n). D: (d,) or None.

    Returns:
        y (batch, d) and the new state (batch, d, n).

    Taught in notebook 16, "2. The mixers, built in the open".
    """
    _check_scan_step(state, u, delta, A, B, C, D)
    return _scan_step(state, u, delta, A, B, C, D)


def _scan_step(state, u, delta, A, B, C, D) -> tuple[Tensor, Tensor]:
    """``selective_scan_step`` on checked arguments."""
    dA = torch.exp(delta[..., None] * A)                                         # (batch, d, n) per-channel decay
    state = dA * state + (delta * u)[..., None] * B[:, None, :]                  # (batch, d, n)
    y = (state * C[:, None, :]).sum(dim=-1)                                      # (batch, d)
    if D is not None:
        y = y + D * u
    return y, state


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, *, D: Tensor | None = None,
                   initial_state: Tensor | None = None,
                   return_state: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba's selective scan (S6; Gu & Dao, 2023), token by token, in its reference shapes.

    Every channel i of u runs its own diagonal state x (n,), with input-dependent step delta:

        x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t,    y_t = C_t . x_t + D u_t

    (per channel: x_t[i] = exp(delta_t[i] A[i]) * x_{t-1}[i] + delta_t[i] u_t[i] B_t, elementwise in n).
    ``delta`` is used as given (Mamba passes it through softplus first); A is usually negative.

    Args:
        u, delta: (batch, d, T). A: (d, n). B, C: (batch, n, T). D: (d,) or None.
        initial_state: (batch, d, n) or None (zeros). return_state: also return the final state.

    Returns:
        y (batch, d, T), or (y, x_T) with x_T (batch, d, n) when ``return_state``.

    Taught in notebook 16, "2. The mixers, built in the open".
    """
    _check_scan(u, delta, A, B, C, D, initial_state)
    batch, d, T = u.shape
    state = (u.new_zeros(batch, d, A.shape[1]) if initial_state is None else initial_state.to(u.dtype))
    ys = []
    for t in range(T):
        y, state = _scan_step(state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D)
        ys.append(y)
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(batch, d, 0)
    return (y, state) if return_state else y


def selective_scan_weights(delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """S6's parallel form: the implicit attention matrix of every channel, (batch, d, T, T).

        y_t[i] = sum_{s <= t} W[i, t, s] u_s[i] + D[i] u_t[i],
        W[i, t, s] = delta_s[i] sum_n C_t[n] exp(A[i, n] (delta_{s+1}[i] + ... + delta_t[i])) B_s[n]

    (a zero initial state). It costs (batch, d, T, T, n) memory: for looking, not for long rows.

    Args:
        delta: (batch, d, T). A: (d, n). B, C: (batch, n, T).

    Returns:
        (batch, d, T, T), zero above the diagonal.

    Taught in notebook 16, "4. Implicit attention: each output as a weighted sum of past values".
    """
    _check_scan(delta, delta, A, B, C, None, None, u_name="delta")
    T = delta.shape[-1]
    cum = delta.cumsum(dim=-1)                                                   # (batch, d, T)
    below = torch.ones(T, T, dtype=torch.bool, device=delta.device).tril()
    span = (cum[..., :, None] - cum[..., None, :]).masked_fill(~below, 0.0)       # (batch, d, t, s) sum delta_(s, t]
    decay = torch.exp(span[..., None] * A[None, :, None, None, :])                # (batch, d, T, T, n)
    mix = C.transpose(1, 2)[:, None, :, None, :] * B.transpose(1, 2)[:, None, None, :, :]   # (batch, 1, T, T, n)
    weights = (decay * mix).sum(dim=-1) * delta[..., None, :]                     # (batch, d, T, T)
    return weights.masked_fill(~below, 0.0)
