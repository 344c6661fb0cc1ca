"""Checkers for notebook 13: the MLA cache size, the slot of a ring buffer with sinks, and
per-document positions of a packed sequence."""

from __future__ import annotations

import torch

from . import ExerciseError, NotAttempted, attempt, not_attempted, passed, require_tensor

__all__ = ["check_mla_bytes", "check_sink_slot", "check_document_positions"]


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
