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

What a model scores without any recall (the floor an accuracy is read against): ``no_recall_floor`` (exact, per
strategy, for either style of rows), ``no_recall_scores`` (each strategy scored on given rows), ``no_recall_loss`` (the
least cross-entropy). ``query_retention``: how much of the asked value a decaying state still holds at each query.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

from ._checks import check_ids, check_positive_int, check_real, check_tensor

__all__ = ["IGNORE_INDEX", "FILLER", "STYLES", "ZOOLOGY_VOCAB", "mqar", "zoology_query_weights", "key_range",
           "value_range", "query_distances", "NO_RECALL_STRATEGIES", "no_recall_floor", "no_recall_loss",
           "no_recall_scores", "query_retention"]

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
    power_a = check_real("power_a", power_a, low=0, low_open=True, high=math.inf, high_open=True)
    p = power_a * torch.arange(1, n_slots + 1, dtype=torch.float64) ** (power_a - 1)
    return p / p.sum()


def key_range(vocab_size: int) -> range:
    """The tokens keys are drawn from: 1 .. vocab_size // 2 - 1.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    return range(1, vocab_size // 2)


def value_range(vocab_size: int) -> range:
    """The tokens values are drawn from: vocab_size // 2 .. vocab_size - 1.

    Taught in notebook 16, "1. The task: multi-query associative recall".
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
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
    _check_style(style)
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


def _check_style(style) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")


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
    inputs = check_ids("inputs", inputs, dim=2, layout="(B, T)", what="integer token ids")
    targets = check_ids("targets", targets, dim=2, layout="(B, T)", what="integer token ids (or -100)")
    if inputs.shape != targets.shape or inputs.dim() != 2:
        raise ValueError(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must both be (B, T)")
    out = torch.full(inputs.shape, -1, dtype=torch.long)
    for b, t in (targets != IGNORE_INDEX).nonzero().tolist():
        key_at = (inputs[b] == inputs[b, t]).nonzero()[0, 0].item()     # the key's first appearance
        if key_at == t:
            raise ValueError(f"targets ask at row {b}, position {t} for key {inputs[b, t].item()}, which appears "
                             f"nowhere before it in inputs: these are not mqar rows")
        out[b, t] = t - (key_at + 1)                                     # its value sits right after it
    return out


# ---------------------------------------------------------------------------------------------
# The floor: what a model scores that recalls nothing
# ---------------------------------------------------------------------------------------------

NO_RECALL_STRATEGIES = {
    "uniform_vocab": "any token, uniformly: 1 / vocab_size",
    "uniform_values": "any value token, uniformly: 1 / m (m value tokens, the upper half of the vocabulary)",
    "seen_distinct": "one of the distinct values of the row's pairs, uniformly: E[1 / D]",
    "seen_slot": "the value of a uniformly chosen pair of the row: (1 + (n - 1) / m) / n",
    "most_frequent": "the most frequent value of the row's pairs (ties uniformly): E[c_max] / n",
}


def _stirling2(n: int, d: int) -> int:
    """Stirling number of the second kind: ways to split n labelled items into d non-empty groups."""
    row = [1] + [0] * d                                  # S(0, j)
    for _ in range(n):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, d + 1)]
    return row[d]


def _expected_max_count(n: int, m: int):
    """E[largest multiplicity] of n values drawn uniformly with replacement from m, as a Fraction.

    P(c_max <= c) = n! [x^n] (sum_{j <= c} x^j / j!)^m / m^n (the exponential generating function of the
    ways to deal n labelled draws into m values, none more than c times).
    """
    def times(a: list, b: list) -> list:                        # polynomial product, truncated at degree n
        out = [Fraction(0)] * min(len(a) + len(b) - 1, n + 1)
        for i, x in enumerate(a):
            for j, y in enumerate(b[:n + 1 - i]):
                out[i + j] += x * y
        return out

    def at_most(c: int) -> Fraction:
        base, power, e = [Fraction(1, math.factorial(j)) for j in range(min(c, n) + 1)], [Fraction(1)], m
        while e:                                               # (egf)^m by repeated squaring
            if e & 1:
                power = times(power, base)
            base, e = times(base, base), e >> 1
        coeff = power[n] if len(power) > n else Fraction(0)
        return coeff * math.factorial(n) / Fraction(m) ** n

    cdf = [at_most(c) for c in range(n + 1)]                      # cdf[0] = 0, cdf[n] = 1
    return sum(c * (cdf[c] - cdf[c - 1]) for c in range(1, n + 1))


def no_recall_floor(n_pairs: int, vocab_size: int, *, style: str = "notebook") -> dict[str, float]:
    """What a model scores on ``mqar`` rows without recalling any key's value, exactly, per strategy.

    A model that does not associate a query's key with its value can still use what the row shows: its
    values come from the m = vocab_size - vocab_size // 2 value tokens, and each of the row's n pairs
    is asked once, so the answer is a uniformly chosen pair's value. Values are drawn with replacement,
    so a value can sit in several pairs (D distinct values, the most frequent one c_max times). Per strategy
    (``NO_RECALL_STRATEGIES``), the expected share of queries answered exactly:

        uniform_vocab    1 / vocab_size
        uniform_values   1 / m
        seen_distinct    E[1 / D],    P(D = d) = C(m, d) S(n, d) d! / m^n     (S: Stirling, 2nd kind)
        seen_slot        (1 + (n - 1) / m) / n     (the asked pair, or another pair with the same value)
        most_frequent    E[c_max] / n,  P(c_max <= c) = n! [x^n] (sum_{j<=c} x^j / j!)^m / m^n

    and ``floor``, the largest of them (``most_frequent``: c_max / n >= every other share, row by row).
    In Zoology's rows (``style="zoology"``) the values are distinct within a row (D = n, c_max = 1), so
    seen_distinct = seen_slot = most_frequent = floor = 1 / n exactly; the random tokens in the gaps are drawn
    from the whole vocabulary whatever the pairs hold, so they say nothing about the answer.
    ``no_recall_scores`` measures the same strategies on given rows.

    Args:
        n_pairs: key-value pairs per row. vocab_size: as given to ``mqar`` (>= 2 (n_pairs + 1)).
        style: the rows' form, as given to ``mqar``: "notebook" or "zoology".

    Returns:
        {strategy: expected accuracy} for the five strategies, plus "floor".

    Taught in notebook 16, "The floor: what recalling nothing scores".
    """
    check_positive_int("n_pairs", n_pairs)
    check_positive_int("vocab_size", vocab_size)
    _check_style(style)
    _check_mqar(1, 4 * n_pairs, n_pairs, vocab_size)
    n, m = n_pairs, len(value_range(vocab_size))
    if style == "zoology":
        one = Fraction(1, n)
        out = {"uniform_vocab": Fraction(1, vocab_size), "uniform_values": Fraction(1, m), "seen_distinct": one,
               "seen_slot": one, "most_frequent": one}
        out = {name: float(p) for name, p in out.items()}
        out["floor"] = max(out.values())
        return out
    distinct = sum(Fraction(math.comb(m, d) * _stirling2(n, d) * math.factorial(d), m ** n) / d
                   for d in range(1, min(n, m) + 1))
    out = {"uniform_vocab": Fraction(1, vocab_size), "uniform_values": Fraction(1, m), "seen_distinct": distinct,
           "seen_slot": (1 + Fraction(n - 1, m)) / n, "most_frequent": _expected_max_count(n, m) / n}
    out = {name: float(p) for name, p in out.items()}
    out["floor"] = max(out.values())
    return out


def no_recall_loss(n_pairs: int, vocab_size: int, *, style: str = "notebook") -> float:
    """The smallest cross-entropy (nats per query) a model reaches on ``mqar`` rows without recall.

    Without the key's association, the best a model can say about the answer is what the row's pairs show:
    each of the n values is the answer with chance (its count) / n. That prediction's loss on the asked
    value is log(n / c), c = 1 + B its count (the asked pair and B ~ Binomial(n - 1, 1 / m) others that
    drew the same value), so

        E[loss] = sum_b P(B = b) log(n / (1 + b)).

    In Zoology's rows (``style="zoology"``) the n values are distinct, so the loss is log n exactly.
    A run whose training loss stays above it has not learned any recall; ln m is the loss of a uniform guess
    among the m value tokens.

    Args:
        n_pairs: key-value pairs per row. vocab_size: as given to ``mqar``. style: "notebook" or "zoology".

    Returns:
        The expected loss in nats.

    Taught in notebook 16, "The floor: what recalling nothing scores".
    """
    check_positive_int("n_pairs", n_pairs)
    check_positive_int("vocab_size", vocab_size)
    _check_style(style)
    _check_mqar(1, 4 * n_pairs, n_pairs, vocab_size)
    n, m = n_pairs, len(value_range(vocab_size))
    if style == "zoology":
        return math.log(n)
    return sum(math.comb(n - 1, b) * (1 / m) ** b * (1 - 1 / m) ** (n - 1 - b) * math.log(n / (1 + b))
               for b in range(n))


def no_recall_scores(inputs: Tensor, targets: Tensor, vocab_size: int, *,
                     style: str = "notebook") -> dict[str, Tensor]:
    """Each no-recall strategy's chance of answering each query of given ``mqar`` rows.

    The strategies of ``no_recall_floor``, each scored by its exact chance on the row (no random draw), plus one
    that goes beyond the floor without associating a key with its value (it is not part of the floor):

    * notebook rows, ``strike_asked``: the most frequent value among the pairs *not yet asked* (each earlier
      query is followed by its value, so the row shows which values are gone);
    * Zoology's rows, ``query_order``: the r-th query of the row (in position order) answered with the value
      of the r-th pair. Zoology draws the first key's query slot first, from a power law that favours early
      slots, then the next key's, so the order of the queries follows the order of the pairs more often than
      chance; this strategy reads the queries' order, not their keys.

    Args:
        inputs, targets: (B, T) from ``mqar``. vocab_size: as given to ``mqar``.
        style: the rows' form, as given to ``mqar``: "notebook" or "zoology".

    Returns:
        {strategy: (B, T) float64}, the chance at each query position, 0 elsewhere; the mean over the
        queries, ``scores[s][targets != -100].mean()``, is the strategy's accuracy on these rows.

    Taught in notebook 16, "The floor: what recalling nothing scores".
    """
    check_positive_int("vocab_size", vocab_size)
    _check_style(style)
    inputs = check_ids("inputs", inputs, vocab_size, dim=2, layout="(B, T)", what="integer token ids")
    targets = check_ids("targets", targets, dim=2, layout="(B, T)", what="integer token ids (or -100)")
    if inputs.shape != targets.shape:
        raise ValueError(f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} must both be (B, T)")
    m = len(value_range(vocab_size))
    asked = targets != IGNORE_INDEX
    beyond = "strike_asked" if style == "notebook" else "query_order"
    scores = {name: torch.zeros(inputs.shape, dtype=torch.float64) for name in (*NO_RECALL_STRATEGIES, beyond)}
    for b in range(inputs.shape[0]):
        queries = asked[b].nonzero().flatten().tolist()
        n = len(queries)
        values = inputs[b, 1:2 * n:2].tolist()                        # the pairs' values
        counts = {value: values.count(value) for value in values}
        c_max = max(counts.values())
        remaining = dict(counts)
        for r, t in enumerate(queries):                              # in the order the row asks them
            target = targets[b, t].item()
            if target not in counts:
                raise ValueError(f"targets ask at row {b}, position {t} for value {target}, which no pair of "
                                 f"the row holds: inputs and targets must come from one mqar draw")
            c = counts[target]
            scores["uniform_vocab"][b, t] = 1 / vocab_size
            scores["uniform_values"][b, t] = 1 / m
            scores["seen_distinct"][b, t] = (target in counts) / len(counts)
            scores["seen_slot"][b, t] = c / n
            scores["most_frequent"][b, t] = (c == c_max) / sum(x == c_max for x in counts.values())
            if style == "zoology":
                scores["query_order"][b, t] = float(values[r] == target)
                continue
            top = max(remaining.values())
            tied = [value for value, x in remaining.items() if x == top]
            scores["strike_asked"][b, t] = (target in tied) / len(tied)
            if target in remaining:                                  # this pair is asked now: gone
                remaining[target] -= 1
                if remaining[target] == 0:
                    del remaining[target]
    return scores


def query_retention(log_decay: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
    """How much of the value each query asks for a decaying state still holds: exp(g_{p+1} + ... + g_t).

    A gated state is multiplied by exp(g_r) at every step r (Gated DeltaNet's exp(g), S6's exp(delta A));
    what was written at the value's position p is left, at the query t, times exp(g_{p+1} + ... + g_t)
    (notebook 16, exercise 1), whatever else is written on orthogonal keys.

    Args:
        log_decay: (B, c, T) log-decays g <= 0 of c heads or channels. inputs, targets: (B, T) from ``mqar``.

    Returns:
        (B, c, T): the retention of the asked value at each query position, 0 elsewhere.

    Taught in notebook 16, "How far back a decaying state reaches".
    """
    inputs = check_ids("inputs", inputs, dim=2, layout="(B, T)", what="integer token ids")
    check_tensor("log_decay", log_decay, floating=True)
    if log_decay.dim() != 3 or log_decay.shape[0] != inputs.shape[0] or log_decay.shape[-1] != inputs.shape[-1]:
        raise ValueError(f"log_decay {tuple(log_decay.shape)} must be (B, c, T) with (B, T) = "
                         f"{tuple(inputs.shape)} of inputs")
    distance = query_distances(inputs, targets)                          # (B, T), -1 off the queries
    cumulative = log_decay.double().cumsum(dim=-1)                       # (B, c, T): g_1 + ... + g_t
    t = torch.arange(inputs.shape[-1])
    p = torch.where(distance >= 0, t - distance, t)                      # the value's position (t off the queries)
    at_value = cumulative.gather(-1, p[:, None, :].expand_as(cumulative))
    out = torch.exp(cumulative - at_value)
    return out * (distance >= 0)[:, None, :]
