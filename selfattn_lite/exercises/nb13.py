"""Checkers for notebook 13: the MLA cache size, the absorption of W^UK into the query, the slot of a
ring buffer with sinks, and per-document positions of a packed sequence."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor

__all__ = ["check_mla_bytes", "check_absorb_query", "check_sink_slot", "check_document_positions"]


def check_mla_bytes(fn) -> None:
    """``fn(n_layers, kv_lora_rank, qk_rope_head_dim, n_tokens, bytes_per_value) -> int``: MLA cache bytes."""
    try:
        got = attempt(fn, 60, 512, 64, 1, 2)
    except NotAttempted:
        return not_attempted("mla_bytes")
    cases = [(60, 512, 64, 1, 2), (61, 512, 64, 4096, 2), (3, 16, 4, 10, 4), (2, 8, 2, 5, 1)]
    for n_layers, rank, rope, tokens, nbytes in cases:
        got = attempt(fn, n_layers, rank, rope, tokens, nbytes)
        if isinstance(got, torch.Tensor):
            got = got.item()
        want = (rank + rope) * n_layers * tokens * nbytes
        if got == want:
            continue
        if got == 2 * want or got == 2 * rank * n_layers * tokens * nbytes + rope * n_layers * tokens * nbytes:
            raise ExerciseError("there is no separate K and V to count twice: the latent c_KV is cached once and "
                                "both keys and values are computed from it")
        if got == rank * n_layers * tokens * nbytes:
            raise ExerciseError("the decoupled RoPE key is missing: it is cached too, qk_rope_head_dim values "
                                "per token and layer")
        if got == (rank + rope) * tokens * nbytes:
            raise ExerciseError("every layer has its own latent: multiply by n_layers")
        raise ExerciseError(f"mla_bytes{(n_layers, rank, rope, tokens, nbytes)} should be {want}, got {got}")
    return passed("(kv_lora_rank + qk_rope_head_dim) x layers x tokens x bytes: 67.5 KiB per token for DeepSeek-V2")


def _absorption_case():
    """q^C (B=2, h=3, L=4, nope=5), W^UK (h, nope, d_c=7), latents c (B, S=6, d_c): shapes that all differ."""
    gen = torch.Generator().manual_seed(13)
    q_nope = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    w_uk = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    c_kv = torch.randn(2, 6, 7, generator=gen, dtype=torch.float64)
    return q_nope, w_uk, c_kv


def check_absorb_query(fn) -> None:
    """``fn(q_nope (B, h, L, nope), w_uk (h, nope, d_c)) -> (B, h, L, d_c)``: the query that scores the latents.

    Checked against the naive form: with k^C_{j,i} = W^UK_i c_j, the naive score q^C_{t,i} . k^C_{j,i} must
    equal the absorbed one, (W^UK_i^T q^C_{t,i}) . c_j, for every head, query and cached latent.
    """
    q_nope, w_uk, c_kv = _absorption_case()
    try:
        got = attempt(fn, q_nope.clone(), w_uk.clone())
    except NotAttempted:
        return not_attempted("absorb_query")
    except RuntimeError as error:
        raise ExerciseError(f"torch refused the shapes ({str(error).splitlines()[0]}): w_uk is (h, nope, d_c); "
                            "contract q^C's last dim (nope) with w_uk's middle dim, head by head") from None
    B, h, L, nope = q_nope.shape
    d_c = w_uk.shape[-1]
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, L, d_c):
        raise ExerciseError("the heads are gone (summed over?): each head i has its own W^UK_i, so keep the "
                            f"head dim: (B, h, L, d_c) = {(B, h, L, d_c)}")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(q_nope.shape):
        raise ExerciseError("that is still q^C (width nope): the absorbed query lives in the latent space, "
                            "W^UK_i^T q^C, width d_c")
    got = require_tensor("absorb_query(q_nope, w_uk)", got, (B, h, L, d_c))
    k_nope = torch.einsum("hnc,bsc->bhsn", w_uk, c_kv)                     # naive: expand every latent
    naive = q_nope @ k_nope.transpose(-2, -1)                              # (B, h, L, S)
    absorbed = got.to(torch.float64) @ c_kv[:, None].transpose(-2, -1)     # scores against the latents
    if close(absorbed, naive, atol=1e-9):
        return passed("W^UK_i^T q^C_i scores the cached latents exactly as q^C_i scores the expanded keys: "
                      "the key up-projection never runs at decode time")
    for scale in (nope ** -0.5, d_c ** -0.5):
        if close(absorbed, naive * scale, atol=1e-9):
            raise ExerciseError("the scores came out scaled: absorbing W^UK changes no score, so the scale "
                                "1/sqrt(d_nope + d_rope) stays where attention applies it, not here")
    one_head = q_nope @ w_uk[0]
    if close(got, one_head, atol=1e-9):
        raise ExerciseError("every head used head 0's W^UK: head i's query meets head i's up-projection W^UK_i")
    raise ExerciseError("the absorbed scores (W^UK^T q^C) . c differ from the naive q^C . (W^UK c); per head i, "
                        "q_latent[..., c] = sum_n q^C[..., n] W^UK_i[n, c]")


def check_sink_slot(fn) -> None:
    """``fn(position, n_sink, window) -> int``: the slot of a token in a sink + ring-buffer cache."""
    try:
        attempt(fn, 0, 2, 4)
    except NotAttempted:
        return not_attempted("sink_slot")

    def want(p, s, w):
        return p if p < s else s + (p - s) % w
    for s, w in ((2, 4), (0, 5), (4, 3), (1, 1)):
        for p in range(20):
            got = attempt(fn, p, s, w)
            if isinstance(got, torch.Tensor):
                got = got.item()
            if got == want(p, s, w):
                continue
            if p >= s and got == p % w:
                raise ExerciseError(f"position {p} (n_sink={s}, window={w}): p % window writes over the sink "
                                    "slots; the ring starts after them: n_sink + (p - n_sink) % window")
            if p >= s and got == p % (s + w):
                raise ExerciseError(f"position {p} (n_sink={s}, window={w}): p % (n_sink + window) evicts the "
                                    "sinks once it wraps; only the window part rolls")
            if p >= s and got == s + p % w:
                raise ExerciseError(f"position {p} (n_sink={s}, window={w}): count the ring from the first "
                                    "non-sink token, (p - n_sink) % window")
            raise ExerciseError(f"sink_slot({p}, {s}, {w}) should be {want(p, s, w)}, got {got}")
    return passed("sinks in slots 0 .. n_sink-1, then a ring: n_sink + (p − n_sink) mod window")


def check_document_positions(fn) -> None:
    """``fn(doc_ids (T,)) -> (T,) long``: each token's position inside its own document."""
    docs = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    try:
        got = attempt(fn, docs.clone())
    except NotAttempted:
        return not_attempted("doc_positions")
    got = require_tensor("doc_positions(doc_ids)", got, (10,))
    want = torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3, 0])
    if torch.equal(got, torch.arange(10)):
        raise ExerciseError("those are the positions in the packed row: restart at 0 where a new document begins")
    if torch.equal(got, want + 1):
        raise ExerciseError("off by one: a document's first token is at position 0")
    if torch.equal(got, docs):
        raise ExerciseError("that is the document id, not the position inside the document")
    if not torch.equal(got.long(), want):
        raise ExerciseError(f"for doc_ids {docs.tolist()} expected {want.tolist()}, got {got.tolist()}")
    other = torch.tensor([5, 5, 9, 9, 9, 9, 1])
    if not torch.equal(attempt(fn, other.clone()).long(), torch.tensor([0, 1, 0, 1, 2, 3, 0])):
        raise ExerciseError("right for the first example, not for doc_ids [5, 5, 9, 9, 9, 9, 1]: a document is a run "
                            "of equal ids, whatever their values")
    return passed("positions restart at 0 in each document, as if each were run alone")
