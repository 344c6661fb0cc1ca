"""Checkers for notebook 16: what a gate leaves of an old key, the delta rule in chunks (solve and carry),
the no-recall floor of MQAR, and the length at which a real model's KV cache outgrows a fixed-size state."""

from __future__ import annotations

import math

import torch

from ..presets import PRESETS, ModelPreset
from ..recall import no_recall_floor
from ..recurrent import delta_rule
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_old_key_recall", "check_chunked_delta_rule", "check_floor", "check_crossover_length"]


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




# ---------------------------------------------------------------------------------------------
# The delta rule in chunks
# ---------------------------------------------------------------------------------------------

def _chunked(q, k, v, beta, C, *, use_beta=True, triangle="lower", carry=True, own_diagonal=True):
    """The chunked delta rule (one head, no gate), with switches that plant the classic mistakes."""
    T, dk = k.shape
    S = torch.zeros(dk, v.shape[-1], dtype=v.dtype)
    b_all = beta if use_beta else torch.ones_like(beta)
    outs = []
    for start in range(0, T, C):
        K, V, Q, b = k[start:start + C], v[start:start + C], q[start:start + C], b_all[start:start + C]
        gram = b[:, None] * (K @ K.T)
        L = gram.tril(-1) if triangle == "lower" else gram.triu(1)
        inv = torch.linalg.inv(torch.eye(len(b), dtype=v.dtype) + L)
        W, U = inv @ (b[:, None] * K), inv @ (b[:, None] * V)
        if not carry:
            S = torch.zeros_like(S)
        U = U - W @ S
        scores = (Q @ K.T).tril(0 if own_diagonal else -1)
        outs.append((Q @ S + scores @ U) / math.sqrt(dk))
        S = S + K.T @ U
    return torch.cat(outs)


def _chunk_inputs(seed: int = 16, T: int = 11, dk: int = 4, dv: int = 3):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, dk, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(T, dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(T, dv, generator=gen, dtype=torch.float64)
    beta = 0.2 + 0.7 * torch.rand(T, generator=gen, dtype=torch.float64)
    return q, k, v, beta


def check_chunked_delta_rule(fn) -> None:
    """``fn(q (T, dk), k (T, dk), v (T, dv), beta (T,), chunk_size) -> o (T, dv)``: the delta rule (one head,
    no gate, o_t = q_t^T S_t / sqrt(dk)) computed chunk by chunk: a triangular solve inside each chunk, the
    state carried between chunks. Checked against the token loop for chunk sizes that do and do not divide T."""
    q, k, v, beta = _chunk_inputs()
    T = q.shape[0]
    try:
        attempt(fn, q.clone(), k.clone(), v.clone(), beta.clone(), 4)
    except NotAttempted:
        return not_attempted("chunked_delta_rule")
    want_all = delta_rule(q[None, None], k[None, None], v[None, None], beta[None, None])[0, 0]   # the loop
    for C in (4, 3, 5, T, 1):
        got = require_tensor(f"chunked_delta_rule(q, k, v, beta, chunk_size={C})",
                             attempt(fn, q.clone(), k.clone(), v.clone(), beta.clone(), C), (T, v.shape[-1]))
        if close(got, want_all, atol=1e-9, rtol=1e-9):
            continue
        mistakes = [
            (dict(use_beta=False), "beta is missing: every correction is scaled by its beta_t, in the system "
             "(L[t, s] = beta_t k_t . k_s) and on its right-hand side (diag(beta) V and diag(beta) K)"),
            (dict(triangle="upper"), "wrong triangle: a correction u_t depends on the EARLIER tokens of the chunk "
             "(s < t), so L is strictly lower triangular, L[t, s] = beta_t k_t . k_s for s < t"),
            (dict(carry=False), "the carry is not applied: each chunk must start from the state the previous "
             "chunks left (U = U~ - W S, and S <- S + K^T U after the chunk)"),
            (dict(own_diagonal=False), "token t reads its own correction too: the output mask of Q K^T keeps "
             "the diagonal (s <= t), o_t = q_t^T (S + sum_{s <= t} k_s u_s^T) / sqrt(dk)"),
        ]
        for switches, message in mistakes:
            if close(got, _chunked(q, k, v, beta, C, **switches), atol=1e-9, rtol=1e-9):
                raise ExerciseError(f"chunk_size={C}: {message}")
        if C == T or C == 1:
            raise ExerciseError(f"chunk_size={C}: does not equal the token loop (recurrent.delta_rule)")
        raise ExerciseError(f"chunk_size={C} (T = {T}, so the last chunk is shorter): does not equal the token "
                            "loop; a chunk size that divides T passes? Then the last, shorter chunk is wrong")
    return passed("one triangular solve per chunk, (I + L) U = diag(beta) (V - K S), and the carry "
                  "S <- S + K^T U: the token loop, for any chunk size")


# ---------------------------------------------------------------------------------------------
# The floor
# ---------------------------------------------------------------------------------------------

def check_floor(fn) -> None:
    """``fn(n_pairs, vocab_size) -> float``: the accuracy of answering the value of a uniformly chosen pair of the
    row (values drawn with replacement from the vocab_size // 2 value tokens): (1 + (n - 1) / m) / n."""
    try:
        attempt(fn, 4, 64)
    except NotAttempted:
        return not_attempted("seen_value_floor")
    for n, vocab in ((4, 64), (8, 64), (16, 64), (3, 10), (1, 8), (10, 100), (7, 18)):
        got = attempt(fn, n, vocab)
        got = got.item() if isinstance(got, torch.Tensor) else float(got)
        m = vocab // 2
        want = no_recall_floor(n, vocab)["seen_slot"]
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        if math.isclose(got, 1 / n, rel_tol=1e-9):
            raise ExerciseError(f"n_pairs={n}, vocab_size={vocab}: 1/n counts only the asked pair; values are drawn "
                                "with replacement, so another pair holds the same value with chance 1/m each")
        if math.isclose(got, (1 + (n - 1) / vocab) / n, rel_tol=1e-9):
            raise ExerciseError(f"n_pairs={n}, vocab_size={vocab}: values come from the upper half of the "
                                "vocabulary only, m = vocab_size // 2 tokens")
        if math.isclose(got, (1 + n / m) / n, rel_tol=1e-9) or math.isclose(got, (1 + (n - 1) / (m - 1)) / n,
                                                                             rel_tol=1e-9):
            raise ExerciseError(f"n_pairs={n}, vocab_size={vocab}: off by one: the asked pair is one of the n; "
                                "each of the other n - 1 holds the same value with chance 1/m")
        raise ExerciseError(f"seen_value_floor({n}, {vocab}) should be {want:.6f}, got {got:.6f}")
    return passed("(1 + (n - 1) / m) / n: the asked pair's own value, plus the n - 1 others that share it by chance")


# ---------------------------------------------------------------------------------------------
# State against cache
# ---------------------------------------------------------------------------------------------

def _state_bytes(preset: ModelPreset, bytes_per_value: int) -> int:
    return preset.n_layers * preset.n_heads * preset.head_dim * preset.head_dim * bytes_per_value


CROSSOVER_PRESETS = [name for name, p in PRESETS.items() if p.attention != "MLA" and p.kv_layers is None]


def check_crossover_length(fn) -> None:
    """``fn(preset, bytes_per_value) -> int``: the first number of tokens at which the preset's KV cache (one
    sequence, all layers) needs more bytes than a delta-rule state of the same shape, one head_dim x head_dim
    state per query head in every layer."""
    try:
        attempt(fn, PRESETS["Llama-2-7B"], 2)
    except NotAttempted:
        return not_attempted("crossover_length")
    for name in CROSSOVER_PRESETS:
        p = PRESETS[name]
        for nbytes in (2, 4):
            got = attempt(fn, p, nbytes)
            got = got.item() if isinstance(got, torch.Tensor) else got
            state = _state_bytes(p, nbytes)
            want = next(n for n in range(1, 10**7) if p.kv_bytes(n, bytes_per_value=nbytes) > state)
            if got == want:
                continue
            per_token = p.kv_bytes(1, bytes_per_value=nbytes)
            if got == want - 1:
                raise ExerciseError(f"{name}: off by one: at {got} tokens the cache is not yet larger than the "
                                    "state; the crossover is the first length whose cache EXCEEDS it")
            if p.n_kv_heads != p.n_heads and got == p.head_dim // 2 + 1:
                raise ExerciseError(f"{name} shares its K/V heads ({p.n_heads} query heads, {p.n_kv_heads} K/V "
                                    "heads): the cache holds n_kv_heads heads, the state one per query head")
            if got == next(n for n in range(1, 10**7) if per_token // 2 * n > state):
                raise ExerciseError(f"{name}: a cached token stores a key AND a value per K/V head")
            raise ExerciseError(f"crossover_length({name}, {nbytes}) should be {want}, got {got}")
    return passed("n_heads x head_dim / (2 x n_kv_heads) + 1 tokens: the state is that many tokens of cache, "
                  "and grouped-query attention, with fewer K/V heads, moves the crossover out")
