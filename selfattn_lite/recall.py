"""Multi-query associative recall (MQAR): a task whose answer is exact, to measure what a mixer remembers.

A row first lists ``n_pairs`` key-value pairs, ``k1 v1 k2 v2 ...`` at positions 0 .. 2 n_pairs - 1.
The rest of the row asks for them back: each key appears once more, in a random order and at a random
place, followed by its value, and the model must predict that value at the key's position:

    inputs   k1 v1 k2 v2 k3 v3  0  k2 v2  0  0  k1 v1 k3 v3  0
    targets   .  .  .  .  .  .  .  v2  .  .  .  v1  .  v3  .  .      (. = -100, ignored)

Keys are drawn without replacement from ``1 .. vocab_size // 2 - 1`` (distinct within a row), values with
replacement from ``vocab_size // 2 .. vocab_size - 1`` (the two halves of the vocabulary are disjoint, so
a value never looks like a key); token 0 fills the gaps. Arora et al. (2023, "Zoology") introduced the task
to separate attention from fixed-size-state models. Taught in notebook 16, section 1.

``mqar(..., style="zoology")`` draws the rows of Zoology's own generator (``zoology/data/multiquery_ar.py``,
``multiquery_ar`` with its defaults ``power_a=0.01``, ``random_non_queries=True``, one pass) instead:

    inputs   k1 v1 k2 v2 k3 v3  r  r k2  r  r  r k1  r k3  r      (r = a random token of 0 .. vocab_size - 1)
    targets   .  .  .  .  .  .  .  . v2  .  .  .  v1  . v3  .

* values, like keys, are drawn without replacement (distinct within a row);
* after the pairs, the remaining ``seq_len - 2 n_pairs`` positions form ``(seq_len - 2 n_pairs) // 2`` two-token
  slots; the n queries take n distinct slots, slot j (0-based) drawn with weight (j + 1) ** (power_a - 1)
  (a power law: with power_a = 0.01 most queries sit close to the pairs), one after another without
  replacement; a query is its key alone, in the slot's first position (the value is not repeated after it);
* every other position holds a random token drawn uniformly from the whole vocabulary (it may repeat a
  key or a value of the row, as in Zoology), never a fixed filler.

Zoology's figures use ``vocab_size=8192`` and ``seq_len`` 64 to 512 with 4 to 64 pairs (its
``original_mqar_configs.py``; it asserts ``vocab_size > seq_len``, an even ``seq_len`` and ``4 n_pairs <= seq_len``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_positive_int

__all__ = ["IGNORE_INDEX", "FILLER", "STYLES", "ZOOLOGY_VOCAB", "mqar", "zoology_query_weights", "key_range",
           "value_range", "query_distances"]

IGNORE_INDEX = -100   # F.cross_entropy's default ignore_index: no loss where targets hold it
FILLER = 0            # the token between the queries
STYLES = ("notebook", "zoology")
ZOOLOGY_VOCAB = 8192  # the vocabulary of Zoology's MQAR figures


def zoology_query_weights(n_slots: int, power_a: float = 0.01) -> Tensor:
    """Zoology's weights of the query slots 0 .. n_slots - 1: p_j = a (j + 1) ** (a - 1), normalised (float64).

    ``multiquery_ar.py`` draws the queries' slots from these weights without replacement.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    check_positive_int("n_slots", n_slots)
    if not power_a > 0:
        raise ValueError(f"power_a must be > 0, got {power_a}")
    p = power_a * torch.arange(1, n_slots + 1, dtype=torch.float64) ** (power_a - 1)
    return p / p.sum()


def key_range(vocab_size: int) -> range:
    """The tokens keys are drawn from: 1 .. vocab_size // 2 - 1.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    return range(1, vocab_size // 2)


def value_range(vocab_size: int) -> range:
    """The tokens values are drawn from: vocab_size // 2 .. vocab_size - 1.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    return range(vocab_size // 2, vocab_size)


def _check_mqar(batch, seq_len, n_pairs, vocab_size) -> None:
    for name, n in (("batch", batch), ("seq_len", seq_len), ("n_pairs", n_pairs), ("vocab_size", vocab_size)):
        check_positive_int(name, n)
    if seq_len < 4 * n_pairs:
        raise ValueError(f"seq_len={seq_len} is too short for n_pairs={n_pairs}: the pairs take 2 n_pairs = "
                         f"{2 * n_pairs} positions and their queries (key + value) another {2 * n_pairs}, "
                         f"so seq_len must be >= {4 * n_pairs}")
    n_keys = len(key_range(vocab_size))
    if n_pairs > n_keys:
        raise ValueError(f"vocab_size={vocab_size} has only {n_keys} key tokens (1 .. {vocab_size // 2 - 1}), "
                         f"fewer than n_pairs={n_pairs} distinct keys; use vocab_size >= {2 * (n_pairs + 1)}")


def mqar(batch: int, seq_len: int, n_pairs: int, vocab_size: int, *,
         generator: torch.Generator | None = None, style: str = "notebook",
         power_a: float = 0.01) -> tuple[Tensor, Tensor]:
    """Draw ``batch`` MQAR rows.

    Args:
        batch: rows to draw. seq_len: tokens per row (>= 4 n_pairs). n_pairs: key-value pairs per row
            (<= vocab_size // 2 - 1, so that the keys can be distinct). vocab_size: tokens 0 .. vocab_size - 1.
        generator: a seeded ``torch.Generator`` for reproducible rows (default: torch's global one).
        style: "notebook" (the rows drawn above: values with replacement, 0 in the gaps, uniform query
            places, each query followed by its value) or "zoology" (Zoology's ``multiquery_ar``: see the
            module docstring). power_a: Zoology's power law for the query slots (style "zoology" only).

    Returns:
        inputs (batch, seq_len) long, and targets (batch, seq_len) long: at each query key the value
        that followed that key in the pairs, ``IGNORE_INDEX`` (-100) everywhere else, so
        ``F.cross_entropy(logits.transpose(1, 2), targets)`` scores only the recalls.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    _check_mqar(batch, seq_len, n_pairs, vocab_size)
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if style == "zoology":
        return _mqar_zoology(batch, seq_len, n_pairs, vocab_size, generator, power_a)
    n_keys, half = len(key_range(vocab_size)), vocab_size // 2
    keys = torch.rand(batch, n_keys, generator=generator).argsort(dim=1)[:, :n_pairs] + 1    # (B, n) distinct
    values = torch.randint(half, vocab_size, (batch, n_pairs), generator=generator)          # (B, n)

    inputs = torch.full((batch, seq_len), FILLER, dtype=torch.long)
    targets = torch.full((batch, seq_len), IGNORE_INDEX, dtype=torch.long)
    inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2] = keys, values                   # k1 v1 k2 v2 ...

    # n non-overlapping 2-token slots among the rest: pick n of (rest - n) places, then spread them apart
    rest = seq_len - 2 * n_pairs
    places = torch.rand(batch, rest - n_pairs, generator=generator).argsort(dim=1)[:, :n_pairs].sort(dim=1).values
    starts = 2 * n_pairs + places + torch.arange(n_pairs)                                    # (B, n) query positions
    order = torch.rand(batch, n_pairs, generator=generator).argsort(dim=1)                   # which key each asks
    rows = torch.arange(batch)[:, None]
    inputs[rows, starts] = keys.gather(1, order)
    inputs[rows, starts + 1] = values.gather(1, order)
    targets[rows, starts] = values.gather(1, order)
    return inputs, targets


def _distinct(batch: int, choices: range, n: int, generator) -> Tensor:
    """(batch, n): n distinct tokens of ``choices`` per row, uniformly (a random permutation's first n)."""
    return torch.rand(batch, len(choices), generator=generator).argsort(dim=1)[:, :n] + choices.start


def _mqar_zoology(batch, seq_len, n_pairs, vocab_size, generator, power_a) -> tuple[Tensor, Tensor]:
    """Zoology's ``multiquery_ar`` (one pass, random non-queries), in torch: see the module docstring."""
    keys = _distinct(batch, key_range(vocab_size), n_pairs, generator)                       # (B, n) distinct
    values = _distinct(batch, value_range(vocab_size), n_pairs, generator)                   # (B, n) distinct
    context = 2 * n_pairs
    n_slots = (seq_len - context) // 2
    p = zoology_query_weights(n_slots, power_a).float().expand(batch, n_slots)
    slots = torch.multinomial(p, n_pairs, replacement=False, generator=generator)            # (B, n): key i's slot

    inputs = torch.randint(vocab_size, (batch, seq_len), generator=generator)                # random everywhere
    targets = torch.full((batch, seq_len), IGNORE_INDEX, dtype=torch.long)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values                            # k1 v1 k2 v2 ...
    rows, starts = torch.arange(batch)[:, None], context + 2 * slots                         # (B, n) query places
    inputs[rows, starts] = keys
    targets[rows, starts] = values
    return inputs, targets


def query_distances(inputs: Tensor, targets: Tensor) -> Tensor:
    """For each query (target != -100), how far back the value it asks for sits: query position - value position.

    The value of a key sits right after the key's first appearance. A causal mixer that sees only the
    last ``w`` tokens (itself included) cannot read that value directly when the distance is >= w.

    Args:
        inputs, targets: (B, T) from ``mqar``.

    Returns:
        (B, T) long: the distance at query positions, -1 elsewhere.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    if inputs.shape != targets.shape or inputs.dim() != 2:
        raise ValueError(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must both be (B, T)")
    out = torch.full(inputs.shape, -1, dtype=torch.long)
    for b, t in (targets != IGNORE_INDEX).nonzero().tolist():
        key_at = (inputs[b] == inputs[b, t]).nonzero()[0, 0].item()     # the key's first appearance
        out[b, t] = t - (key_at + 1)                                     # its value sits right after it
    return out
