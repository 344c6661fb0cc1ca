"""Context extension measured on the tiny decoder (notebook 12).

    python -m selfattn_lite.course.context_eval      # writes selfattn_lite/data/context_eval.json

The shipped decoder was trained on 512-character windows. Loaded with ``max_len=2048`` and
a RoPE ``rope_scaling`` (factor s = 4), it reads held-out windows four times longer; the
loss at each position, averaged over windows and over buckets of 256 positions, shows how
well each method carries the model past its trained length:

* zero-shot: no scaling, linear (position interpolation), NTK-aware, YaRN, Llama 3.1;
* fine-tuned: the PI and YaRN models trained a little more at 2048
  (``tiny_decoder_pi`` and ``tiny_decoder_yarn``, see ``data/README.md``);
* ALiBi: a decoder trained from scratch with ALiBi instead of RoPE, same recipe and budget
  (``tiny_decoder_alibi``), read at 2048 as it is (ALiBi has nothing to rescale);
* ``yarn_no_t``: zero-shot YaRN's frequencies without its temperature (cos and sin not scaled),
  to test what the temperature does to the loss, inside and past 512.

``loss_with_context_cut`` asks whether a model uses the context past its trained length: the same
targets past position 512, each predicted from only the most recent characters (at most 512, at
least 512 - CUT_STRIDE + 1), against the same targets read with the whole window before them. It is
run for ALiBi, for the fine-tuned YaRN model (a RoPE control) and for the unscaled RoPE model, for
which it is a sliding window: every target read inside the trained length, the baseline a context
extension must beat if it is to use the characters beyond 512.

``attention_entropy`` measures the mean entropy of the attention rows as the context grows,
for YaRN with and without its attention temperature.

``window_losses`` and ``paired_difference`` read the saved record back window by window: a ranking
of two methods is claimed only when the mean of their per-window differences is larger than the
standard deviation of those differences (``is_ranked``); otherwise the notebook says
"indistinguishable here".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import Tensor

from ..models import DATA_DIR, CharTokenizer, TinyDecoder, load_text, load_tiny_decoder, split_text

__all__ = ["TRAINED_LEN", "TARGET_LEN", "FACTOR", "BUCKET", "ZERO_SHOT", "FINE_TUNED", "ALIBI", "RESULTS_FILE",
           "CUT_STRIDE", "CUT_METHODS", "NO_TEMPERATURE", "scalings", "held_out_ids", "eval_windows",
           "load_method", "loss_per_position", "bucket_means", "loss_with_context_cut", "attention_entropy",
           "loss_record", "window_losses", "paired_difference", "is_ranked", "run"]

TRAINED_LEN = 512       # the shipped model's training window
TARGET_LEN = 2048       # the longer context we ask of it
FACTOR = TARGET_LEN / TRAINED_LEN
BUCKET = 256            # positions per bucket
CUT_STRIDE = 32         # context cut: targets are read in groups of 32, each from at most TRAINED_LEN characters
ZERO_SHOT = ("none", "pi", "ntk", "yarn", "llama3")
FINE_TUNED = {"pi_ft": "tiny_decoder_pi", "yarn_ft": "tiny_decoder_yarn"}
ALIBI = {"alibi": "tiny_decoder_alibi"}
NO_TEMPERATURE = "yarn_no_t"  # zero-shot YaRN's frequencies, cos and sin not multiplied by its factor
CUT_METHODS = ("alibi", "yarn_ft", "none")   # the models read again with the context cut to TRAINED_LEN
RESULTS_FILE = DATA_DIR / "context_eval.json"


def scalings(factor: float = FACTOR, original_max_len: int = TRAINED_LEN) -> dict[str, dict | None]:
    """The ``rope_scaling`` dict of each zero-shot method (None: plain RoPE, no scaling)."""
    return {"none": None,
            "pi": {"kind": "linear", "factor": factor},
            "ntk": {"kind": "ntk", "factor": factor},
            "yarn": {"kind": "yarn", "factor": factor, "original_max_len": original_max_len},
            "llama3": {"kind": "llama3", "factor": factor, "original_max_len": original_max_len}}


def held_out_ids(tokenizer: CharTokenizer) -> Tensor:
    """(N,) ids of the held-out 10% of the shipped text (never trained on)."""
    return tokenizer.encode(split_text(load_text())[1])


def eval_windows(ids: Tensor, length: int = TARGET_LEN, n_windows: int | None = None) -> Tensor:
    """Consecutive, non-overlapping (n, length + 1) windows from the start of ``ids``.

    Args:
        ids: (N,) token ids.
        length: positions predicted per window.
        n_windows: how many (default: as many as fit, N // (length + 1)).

    Returns:
        (n, length + 1) long: inputs are [:, :-1], targets [:, 1:].
    """
    fit = len(ids) // (length + 1)
    n = fit if n_windows is None else n_windows
    if not 1 <= n <= fit:
        raise ValueError(f"{len(ids)} ids hold {fit} windows of {length + 1}, asked for {n_windows}")
    return ids[: n * (length + 1)].reshape(n, length + 1)


def load_method(method: str, max_len: int = TARGET_LEN, factor: float = FACTOR) -> TinyDecoder:
    """The model a method names: a zero-shot scaling of the shipped decoder, or a fine-tuned one."""
    if method in ZERO_SHOT:
        return load_tiny_decoder(rope_scaling=scalings(factor)[method], max_len=max_len)
    if method == NO_TEMPERATURE:
        model = load_tiny_decoder(rope_scaling=scalings(factor)["yarn"], max_len=max_len)
        model.rope.attention_scaling = 1.0                            # YaRN's frequencies, no temperature
        return model
    if method in FINE_TUNED or method in ALIBI:
        stem = DATA_DIR / {**FINE_TUNED, **ALIBI}[method]
        return load_tiny_decoder(stem.with_suffix(".safetensors"), stem.with_suffix(".json"), max_len=max_len)
    known = list(ZERO_SHOT) + [NO_TEMPERATURE] + list(FINE_TUNED) + list(ALIBI)
    raise ValueError(f"unknown method {method!r}; expected one of {known}")


@torch.no_grad()
def loss_per_position(model: TinyDecoder, windows: Tensor) -> Tensor:
    """Cross-entropy (nats) of predicting token t + 1 from tokens 0..t, per window and position.

    Args:
        windows: (n, T + 1) token ids.

    Returns:
        (n, T) float64 losses; column t had t + 1 tokens of context.
    """
    logits = model(windows[:, :-1]).double()                          # (n, T, V)
    return -logits.log_softmax(-1).gather(-1, windows[:, 1:, None])[..., 0]


@torch.no_grad()
def loss_with_context_cut(model: TinyDecoder, windows: Tensor, context: int = TRAINED_LEN,
                          stride: int = CUT_STRIDE) -> Tensor:
    """Losses of the targets past ``context``, each predicted from the most recent characters only.

    Column t of ``loss_per_position`` predicts token t + 1 from tokens 0..t. Here the targets of
    columns t >= context are read in groups of ``stride``: a group ending at column e - 1 is read
    from the ``context`` tokens e - context .. e - 1 alone, so each of its targets sees between
    context - stride + 1 and context tokens (the last one exactly ``context``).

    Args:
        windows: (n, T + 1) token ids, with T - context a multiple of ``stride``.

    Returns:
        (n, T - context) float64 losses, column j for column context + j of ``loss_per_position``.
    """
    n, T = windows.shape[0], windows.shape[1] - 1
    if (T - context) % stride or not 0 < stride <= context < T:
        raise ValueError(f"need 0 < stride <= context < T and T - context a multiple of stride, "
                         f"got T = {T}, context = {context}, stride = {stride}")
    out = torch.empty(n, T - context, dtype=torch.float64)
    for end in range(context + stride, T + 1, stride):                # this group: columns end - stride .. end - 1
        losses = loss_per_position(model, windows[:, end - context:end + 1])   # (n, context)
        out[:, end - stride - context:end - context] = losses[:, -stride:]
    return out


def bucket_means(losses: Tensor, bucket: int = BUCKET) -> Tensor:
    """Mean of (..., T) losses over consecutive buckets of ``bucket`` positions -> (..., T // bucket)."""
    if losses.shape[-1] % bucket:
        raise ValueError(f"T = {losses.shape[-1]} is not a multiple of bucket = {bucket}")
    return losses.reshape(*losses.shape[:-1], -1, bucket).mean(-1)


@torch.no_grad()
def attention_entropy(model: TinyDecoder, windows: Tensor, last: int = 64) -> float:
    """Mean entropy (nats) of the attention rows of the last ``last`` queries, over layers and heads.

    A row p_j (j <= i) has entropy H = -sum_j p_j ln p_j: ln(i + 1) when spread evenly,
    0 when all on one key.

    Args:
        windows: (n, T) token ids (the model reads all T).
        last: how many of the final query positions to average over.
    """
    rows = []
    for window in windows:
        _, weights = model(window[None], need_weights=True)          # n_layers x (1, h, T, T)
        for w in weights:
            p = w[..., -last:, :].double()                             # (1, h, last, T)
            rows.append(-(p * p.clamp_min(1e-300).log()).sum(-1).mean().item())
    return sum(rows) / len(rows)


def loss_record(method: str, windows: Tensor) -> dict:
    """One method's losses on ``windows``: per window and bucket, per bucket, first 512 and past 512."""
    losses = loss_per_position(load_method(method), windows)          # (n, T)
    return {
        "per_window_bucket": [[round(x, 5) for x in row] for row in bucket_means(losses).tolist()],
        "bucket": [round(x, 5) for x in bucket_means(losses.mean(0)).tolist()],
        "first_512": round(losses[:, :TRAINED_LEN].mean().item(), 5),
        "past_512": round(losses[:, TRAINED_LEN:].mean().item(), 5),
    }


def window_losses(results: dict, method: str, part: str) -> Tensor:
    """(n,) float64: one method's mean loss on each window, over ``part`` = "first_512" or "past_512".

    Read back from a saved record (``run``'s dict): the mean of the window's buckets inside
    (first_512) or past (past_512) the trained length. Every bucket holds the same number of
    positions, so this is the plain mean over those positions.
    """
    per_window = torch.tensor(results["loss"][method]["per_window_bucket"], dtype=torch.float64)   # (n, buckets)
    inside = results["trained_len"] // results["bucket"]
    if part == "first_512":
        return per_window[:, :inside].mean(-1)
    if part == "past_512":
        return per_window[:, inside:].mean(-1)
    raise ValueError(f"part must be 'first_512' or 'past_512', got {part!r}")


def paired_difference(a: Tensor, b: Tensor) -> dict:
    """Paired comparison of two (n,) per-window (or per-seed) measurements, a - b.

    Returns:
        dict with ``diffs`` (n,), their ``mean``, their standard deviation ``sd`` (n - 1 in the
        denominator) and ``n``.
    """
    if a.shape != b.shape or a.dim() != 1 or len(a) < 2:
        raise ValueError(f"need two (n,) measurements with n >= 2, got {tuple(a.shape)} and {tuple(b.shape)}")
    diffs = (a - b).double()
    return {"diffs": diffs, "mean": diffs.mean().item(), "sd": diffs.std().item(), "n": len(diffs)}


def is_ranked(mean: float, spread: float) -> bool:
    """A difference counts as a ranking only when it is larger than its spread: |mean| > spread."""
    return abs(mean) > spread


def run(n_windows: int | None = None, entropy_lengths=(128, 256, 512, 1024, 2048), entropy_windows: int = 4,
        progress: bool = True) -> dict:
    """Every measurement of notebook 12, as a JSON-ready dict."""
    start = time.perf_counter()
    base = load_tiny_decoder()
    ids = held_out_ids(base.tokenizer)
    windows = eval_windows(ids, TARGET_LEN, n_windows)
    out = {"trained_len": TRAINED_LEN, "target_len": TARGET_LEN, "factor": FACTOR, "bucket": BUCKET,
           "held_out_chars": len(ids), "n_windows": len(windows), "scalings": scalings(),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "loss": {}}
    trained = {**FINE_TUNED, **ALIBI}
    methods = list(ZERO_SHOT) + [NO_TEMPERATURE] + [m for m in trained if (DATA_DIR / f"{trained[m]}.json").exists()]
    for method in methods:
        out["loss"][method] = loss_record(method, windows)
        if progress:
            print(f"{method:8s} loss by bucket: {out['loss'][method]['bucket']}")
    out["context_cut"] = {"context": TRAINED_LEN, "stride": CUT_STRIDE, "per_window_past_512": {}}
    for method in (m for m in CUT_METHODS if m in out["loss"]):      # do they use the context past 512?
        cut = loss_with_context_cut(load_method(method), windows)     # (n, T - 512)
        out["context_cut"]["per_window_past_512"][method] = [round(x, 5) for x in cut.mean(-1).tolist()]
        if progress:
            print(f"{method}, context cut to 512, past 512 per window:",
                  out["context_cut"]["per_window_past_512"][method])
    out["entropy"] = _entropy_record(ids, entropy_lengths, entropy_windows)
    out["seconds"] = round(time.perf_counter() - start, 1)
    if progress:
        print("entropy:", out["entropy"])
    return out


def _entropy_record(ids: Tensor, lengths, n_windows: int) -> dict:
    """Mean attention entropy per window at each length, for no scaling, YaRN and YaRN without its temperature.

    The windows at length n are the first n characters of the same ``n_windows`` windows of the
    largest length: nested prefixes, so every comparison across lengths is paired window by window.
    """
    keys = ("none", "yarn", "yarn_no_temperature")
    entropy = {"lengths": list(lengths), "nested": True, **{key: [] for key in keys},
               "per_window": {key: [] for key in keys}}
    longest = eval_windows(ids, max(lengths), n_windows)               # (k, max + 1)
    for n in lengths:
        w = longest[:, :n]                                            # (k, n): prefixes of the same windows
        none = load_tiny_decoder(max_len=n)
        yarn = load_method("yarn", max_len=max(n, TRAINED_LEN))
        rows = {"none": [attention_entropy(none, w[j:j + 1]) for j in range(len(w))],
                "yarn": [attention_entropy(yarn, w[j:j + 1]) for j in range(len(w))]}
        yarn.rope.attention_scaling = 1.0                             # the same frequencies, no temperature
        rows["yarn_no_temperature"] = [attention_entropy(yarn, w[j:j + 1]) for j in range(len(w))]
        for key in keys:                                              # every window has as many rows: mean of means
            entropy[key].append(round(sum(rows[key]) / len(rows[key]), 5))
            entropy["per_window"][key].append([round(x, 5) for x in rows[key]])
    entropy["score_factor"] = round(load_method("yarn").rope.attention_scaling ** 2, 6)   # 1/t on q.k
    return entropy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.context_eval",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_FILE)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = run()
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
