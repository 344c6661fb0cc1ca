"""Decode speed of the shipped tiny decoder: tokens per second of greedy generation with a KV cache.

    python -m selfattn_lite.course.bench_decode                 # prompt 256 + 256 generated, on the CPU
    python -m selfattn_lite.course.bench_decode --prompt 128 --new 128 --device cuda --repeat 5

The prompt is the first ``prompt`` characters of the shipped held-out text; ``generate`` runs
once to warm up, then once timed (prefill + decode). Speed = generated tokens / seconds.
On a shared machine one run varies a lot: ``--repeat`` times it again and prints each run
and the best.

    python -m selfattn_lite.course.bench_decode --targets     # the course's decode targets (CPU)

``--targets`` holds the two speed bounds notebook 06 prints but does not assert (a notebook asserts
correctness; a bound on a wall-clock ratio lives here): greedy generation with the cache at least
``TARGET_SPEEDUP`` times faster than without it (prompt 256 + 256 generated, both timed the same way),
and, from 64 to 511 tokens of context, an uncached decode step slowing by more than ``TARGET_GROWTH``
and by more than ``TARGET_GROWTH_RATIO`` times the cached step's growth. These are the course's own
targets for its tiny model on a CPU, not published figures.

As everywhere in the package, ``OMP_WAIT_POLICY`` is PASSIVE unless set otherwise (idle OpenMP
threads sleep instead of spinning on a shared machine; see ``selfattn_lite/__init__.py``).
"""

from __future__ import annotations

import argparse

import torch

from ..models import TinyDecoder, load_text, load_tiny_decoder, split_text
from . import bench

__all__ = ["decode_speed", "cache_speedup", "step_growth", "check_targets", "main"]

TARGET_SPEEDUP = 5.0          # generate with the cache / without, prompt 256 + 256 new
TARGET_GROWTH = 2.0           # an uncached step at 511 tokens of context / at 64
TARGET_GROWTH_RATIO = 1.5     # ... and that growth / the cached step's growth


def decode_speed(model: TinyDecoder, prompt_len: int = 256, new_tokens: int = 256) -> dict:
    """Time one greedy ``generate`` of ``new_tokens`` after a ``prompt_len``-token prompt (after one warm-up).

    Returns:
        {"prompt": prompt_len, "new": new_tokens, "seconds": wall time, "tokens_per_s": new / seconds}.
    """
    device = model.embed.weight.device
    _, held_out = split_text(load_text())
    ids = model.tokenizer.encode(held_out[:prompt_len]).to(device)        # (T,)
    # the first call apart (the warm-up), then one sample of one call
    seconds = bench.time_stats(lambda: model.generate(ids, new_tokens), device=device, warmup=0,
                               repeat=1, number=1).median
    return {"prompt": prompt_len, "new": new_tokens, "seconds": seconds, "tokens_per_s": new_tokens / seconds}


def cache_speedup(model: TinyDecoder, prompt_len: int = 256, new_tokens: int = 256, repeat: int = 2) -> dict:
    """Best of ``repeat`` timed ``generate`` calls with and without the cache, after one warm-up call each.

    Returns:
        {"cached_s", "uncached_s", "speedup": uncached_s / cached_s}; the tokens are asserted equal.
    """
    device = model.embed.weight.device
    _, held_out = split_text(load_text())
    ids = model.tokenizer.encode(held_out[:prompt_len]).to(device)[None]   # (1, T)
    out = {}
    with torch.no_grad():
        for name, use_cache in (("cached", True), ("uncached", False)):
            out[name + "_s"] = bench.time_stats(lambda: model.generate(ids, new_tokens, use_cache=use_cache),
                                                device=device, warmup=0, repeat=repeat, number=1).min
        if not torch.equal(model.generate(ids, new_tokens), model.generate(ids, new_tokens, use_cache=False)):
            raise AssertionError("generate returned different tokens with and without the cache")
    out["speedup"] = out["uncached_s"] / out["cached_s"]
    return out


def step_growth(model: TinyDecoder, contexts=(64, 511), budget_s: float = 0.2) -> dict:
    """One decode step's time at each context length, with the cache and without; growth = last / first.

    Returns:
        {"contexts", "cache_ms", "no_cache_ms", "growth": {"cache": ..., "no cache": ...}}.
    """
    device = model.embed.weight.device
    _, held_out = split_text(load_text())
    ids = model.tokenizer.encode(held_out[:max(contexts) + 1]).to(device)[None]
    ms = {"cache": [], "no cache": []}
    with torch.no_grad():
        for c in contexts:
            caches = model.new_caches(1, c + 1)
            model(ids[:, :c], caches=caches)                       # prefill c tokens

            def cached_step(c=c, caches=caches):
                model(ids[:, c:c + 1], caches=caches)
                for layer_cache in caches:
                    layer_cache.crop(c)

            ms["cache"].append(1e3 * min(bench.time_fn(cached_step, budget_s=budget_s / 2) for _ in range(3)))
            ms["no cache"].append(1e3 * min(bench.time_fn(lambda c=c: model(ids[:, :c + 1]), budget_s=budget_s)
                                            for _ in range(3)))
    return {"contexts": list(contexts), "cache_ms": ms["cache"], "no_cache_ms": ms["no cache"],
            "growth": {k: v[-1] / v[0] for k, v in ms.items()}}


def check_targets(model: TinyDecoder | None = None) -> dict:
    """Measure ``cache_speedup`` and ``step_growth`` and compare them with the targets (CPU, float32).

    Returns:
        {"speedup": ..., "growth": ..., "passed": {"speedup": bool, "growth": bool}}.
    """
    model = load_tiny_decoder() if model is None else model
    speed, growth = cache_speedup(model), step_growth(model)["growth"]
    return {"speedup": speed, "growth": growth,
            "passed": {"speedup": speed["speedup"] >= TARGET_SPEEDUP,
                       "growth": growth["no cache"] > TARGET_GROWTH
                       and growth["no cache"] > TARGET_GROWTH_RATIO * growth["cache"]}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.bench_decode",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=256, help="prompt length in tokens (default 256)")
    parser.add_argument("--new", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs (default 1); prints each and the best")
    parser.add_argument("--targets", action="store_true",
                        help="check the course's decode targets (cache speed-up, step growth); exit 1 if missed")
    args = parser.parse_args(argv)
    model = load_tiny_decoder(device=args.device)
    where = f"{bench.device_name(torch.device(args.device))}, {torch.get_num_threads()} threads"
    if args.targets:
        result = check_targets(model)
        g = result["growth"]
        print(f"{where}: speed-up with the cache {result['speedup']['speedup']:.1f}x "
              f"(target >= {TARGET_SPEEDUP:g}x): {'met' if result['passed']['speedup'] else 'MISSED'}")
        print(f"{where}: a step from 64 to 511 tokens of context: {g['no cache']:.2f}x slower without the cache, "
              f"{g['cache']:.2f}x with it (target: > {TARGET_GROWTH:g}x and > {TARGET_GROWTH_RATIO:g}x the cached "
              f"growth): {'met' if result['passed']['growth'] else 'MISSED'}")
        if not all(result["passed"].values()):
            raise SystemExit(1)
        return result
    runs = [decode_speed(model, args.prompt, args.new) for _ in range(max(args.repeat, 1))]
    for r in runs:
        print(f"{where}: prompt {r['prompt']} + {r['new']} generated in {r['seconds']:.3f} s = "
              f"{r['tokens_per_s']:.1f} tokens/s")
    best = max(runs, key=lambda r: r["tokens_per_s"])
    if len(runs) > 1:
        print(f"best of {len(runs)}: {best['tokens_per_s']:.1f} tokens/s")
    return best


if __name__ == "__main__":
    main()
