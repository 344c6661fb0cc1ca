"""Decode speed of the shipped tiny decoder: tokens per second of greedy generation with a KV cache.

    python -m selfattn_lite.course.bench_decode                 # prompt 256 + 256 generated, on the CPU
    python -m selfattn_lite.course.bench_decode --prompt 128 --new 128 --device cuda --repeat 5

The prompt is the first ``prompt`` characters of the shipped held-out text; ``generate`` runs
once to warm up, then once timed (prefill + decode). Speed = generated tokens / seconds.
On a shared machine one run varies a lot: ``--repeat`` times it again and prints each run
and the best.

As everywhere in the package, ``OMP_WAIT_POLICY`` is PASSIVE unless set otherwise (idle OpenMP
threads sleep instead of spinning on a shared machine; see ``selfattn_lite/__init__.py``).
"""

from __future__ import annotations

import argparse

import torch

from ..models import TinyDecoder, load_text, load_tiny_decoder, split_text
from . import bench

__all__ = ["decode_speed", "main"]


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.bench_decode",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=256, help="prompt length in tokens (default 256)")
    parser.add_argument("--new", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs (default 1); prints each and the best")
    args = parser.parse_args(argv)
    model = load_tiny_decoder(device=args.device)
    where = f"{bench.device_name(torch.device(args.device))}, {torch.get_num_threads()} threads"
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
