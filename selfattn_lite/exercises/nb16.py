"""Checkers for notebook 16: one step of the delta rule, what a gate leaves of an old key, and the
length at which a KV cache outgrows a fixed-size state."""

from __future__ import annotations

import math

import torch

from ..presets import kv_cache_bytes
from ..recurrent import delta_rule
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_delta_step", "check_old_key_recall", "check_crossover_tokens"]


def check_delta_step(fn) -> None:
    """``fn(S (dk, dv), k (dk,), v (dv,), beta) -> S_new (dk, dv)``: one step of the delta rule (no gate)."""
    gen = torch.Generator().manual_seed(16)
    S = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(4, generator=gen, dtype=torch.float64), dim=0)
    v = torch.randn(3, generator=gen, dtype=torch.float64)
    beta = 0.6
    try:
        got = attempt(fn, S.clone(), k.clone(), v.clone(), beta)
    except NotAttempted:
        return not_attempted("delta_step")
    got = require_tensor("delta_step(S, k, v, beta)", got, (4, 3))
    _, want = delta_rule(k.view(1, 1, 1, 4), k.view(1, 1, 1, 4), v.view(1, 1, 1, 3),
                         torch.full((1, 1, 1), beta, dtype=torch.float64), initial_state=S.view(1, 1, 4, 3),
                         return_state=True)
    want = want.view(4, 3)
    err = v - k @ S                                                    # what the state gets wrong about k
    if close(got, want, atol=1e-9, rtol=1e-9):
        return passed("S + beta k (v - k^T S)^T: the state's answer for k moves a fraction beta of the way to v")
    mistakes = [
        (S + beta * torch.outer(k, v), "you added beta k v^T on top of what S already says about k: that is "
         "linear attention's update. The delta rule writes the error: S + beta k (v - k^T S)^T"),
        (S + torch.outer(k, v - k @ S), "beta is missing: it scales the correction, S + beta k (v - k^T S)^T"),
        (S + beta * torch.outer(k, v) - torch.outer(k, k @ S), "beta must scale the erasing term too: "
         "S + beta k (v - k^T S)^T"),
        (S - beta * torch.outer(k, err), "the sign of the error is flipped: it is v - k^T S (target minus "
         "what the state returns now)"),
        (beta * torch.outer(k, err), "the old state is gone: the update adds to S, S + beta k (v - k^T S)^T"),
    ]
    for wrong, message in mistakes:
        if close(got, wrong, atol=1e-9, rtol=1e-9):
            raise ExerciseError(message)
    raise ExerciseError("not the delta rule's step; the state should become S + beta k (v - k^T S)^T "
                        "(k (dk,) a column, v - k^T S (dv,) a row)")


def _old_key_recall_reference(g: torch.Tensor) -> float:
    """Write v for a unit key k at step 0 (beta = 1) into an empty state, then len(g) - 1 steps that write keys
    orthogonal to k, each step t first decaying the state by exp(g[t]); return |k^T S| / |v| at the end."""
    T = len(g)
    k = torch.eye(T, dtype=torch.float64)[None, None]                    # step t writes key e_t: all orthogonal
    v = torch.randn(1, 1, T, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, S = delta_rule(k, k, v, torch.ones(1, 1, T, dtype=torch.float64), g=g.view(1, 1, T).double(),
                      return_state=True)
    return ((k[0, 0, 0] @ S[0, 0]).norm() / v[0, 0, 0].norm()).item()


def check_old_key_recall(fn) -> None:
    """``fn(g (T,)) -> float``: the share of an old value the gated delta rule still returns for its key."""
    try:
        attempt(fn, torch.tensor([-0.1, -0.1]))
    except NotAttempted:
        return not_attempted("old_key_recall")
    for g in (torch.tensor([-0.1, -0.1, -0.1, -0.1]), torch.tensor([-0.5, 0.0, -0.2, -1.0, -0.05]),
              torch.tensor([-2.0]), torch.tensor([0.0, -0.3, -0.3])):
        got = attempt(fn, g.clone())
        got = got.item() if isinstance(got, torch.Tensor) else float(got)
        want = _old_key_recall_reference(g)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            continue
        if math.isclose(got, math.exp(g.sum().item()), rel_tol=1e-6):
            raise ExerciseError(f"g = {g.tolist()}: the gate of step 0 acts before the key is written "
                                "(S <- exp(g_0) S, then the write); only the later steps decay it: exp(g_1 + ...)")
        if math.isclose(got, g[1:].sum().item(), rel_tol=1e-6) or math.isclose(got, g.sum().item(), rel_tol=1e-6):
            raise ExerciseError(f"g = {g.tolist()}: g is a log-decay; the state is multiplied by exp(g_t)")
        if len(g) > 2 and math.isclose(got, math.exp(g[-1].item()), rel_tol=1e-6):
            raise ExerciseError(f"g = {g.tolist()}: every later step decays the state, not only the last one")
        raise ExerciseError(f"old_key_recall({g.tolist()}) should be {want:.6f}, got {got:.6f}")
    return passed("exp(g_1 + ... + g_{T-1}): the gate forgets an old key geometrically, whatever is written "
                  "on orthogonal keys; the delta rule alone (g = 0) would keep it exactly")


def check_crossover_tokens(fn) -> None:
    """``fn(state_bytes, n_layers, n_kv_heads, head_dim, bytes_per_value) -> int``: the first length whose
    KV cache needs more bytes than the state."""
    try:
        attempt(fn, 2 * 64 * 64 * 2, 1, 2, 64, 2)
    except NotAttempted:
        return not_attempted("crossover_tokens")
    cases = [(2 * 64 * 64 * 2, 1, 2, 64, 2), (48 * 16 * 128 * 128 * 2, 48, 8, 128, 2), (1000, 2, 1, 5, 4),
             (640, 2, 1, 5, 4), (7, 1, 1, 1, 1)]
    for state, layers, heads, dim, nbytes in cases:
        got = attempt(fn, state, layers, heads, dim, nbytes)
        got = got.item() if isinstance(got, torch.Tensor) else got
        want = next(n for n in range(1, 10**7) if kv_cache_bytes(layers, heads, dim, n, 1, nbytes) > state)
        if got == want:
            continue
        per_token = kv_cache_bytes(layers, heads, dim, 1, 1, nbytes)
        if got == next(n for n in range(1, 10**7) if per_token // 2 * n > state):
            raise ExerciseError("a cached token stores a key AND a value: 2 x layers x kv_heads x head_dim x bytes")
        if got == want - 1:
            raise ExerciseError(f"off by one for state={state}: at {got} tokens the cache is not yet larger "
                                "than the state (equal or smaller); the first length that exceeds it is one more")
        if got == next(n for n in range(1, 10**7) if per_token // layers * n > state):
            raise ExerciseError("the cache of every layer counts: multiply the per-token bytes by n_layers")
        raise ExerciseError(f"crossover_tokens{(state, layers, heads, dim, nbytes)} should be {want}, got {got}")
    return passed("floor(state / (2 x layers x kv_heads x head_dim x bytes)) + 1 tokens")
