"""Train the recall models of notebook 16 and ship them: ``<run>.safetensors`` + ``<run>.json`` per run.

    OMP_NUM_THREADS=1 python -m selfattn_lite.course.train_recall --grid            # everything shipped
    python -m selfattn_lite.course.train_recall --mixer delta --seed 0 --n-heads 4  # one run

Every run trains a ``RecallModel`` on fresh MQAR rows (each step draws a batch with a number of pairs
taken in turn from ``--train-pairs``), from a seeded generator (``seed``), then evaluates it on 512 rows
per number of pairs drawn from another generator (seed ``EVAL_SEED``). The JSON record holds the
config, the recipe, the seeds, the seconds (wall and CPU), the torch version, the losses and the final
accuracies; the safetensors file holds the weights (float32).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..recall import mqar
from ..recall_models import RECALL_DIR, RecallConfig, RecallModel, count_parameters, recall_accuracy

SEQ_LEN = 64
TRAIN_PAIRS = (4, 8, 12, 16)
EVAL_PAIRS = (4, 8, 12, 16)
EVAL_ROWS = 512
EVAL_SEED = 12345
SEEDS = (0, 1, 2)
STEPS = 1000      # the shipped recipe; at 600 steps and lr 1e-2 two seeds of attention in three were still at chance
BATCH = 32
LR = 3e-3


def run_name(config: RecallConfig, seed: int) -> str:
    """attention_s0, delta_h4_s1, s6_n4_s2, window_w16_s0: the defaults are left out of the name."""
    default = RecallConfig()
    parts = [config.mixer]
    if config.n_heads != default.n_heads and config.mixer not in ("s6",):
        parts.append(f"h{config.n_heads}")
    if config.d_state != default.d_state and config.mixer == "s6":
        parts.append(f"n{config.d_state}")
    if config.window != default.window and config.mixer == "window":
        parts.append(f"w{config.window}")
    return "_".join(parts) + f"_s{seed}"


def grid() -> list[tuple[RecallConfig, int]]:
    """The shipped runs, in training order: every mixer at the default shape, three seeds, seed by seed (a, c, and
    a window of 8 tokens, shorter than most queries' distance to their value: d); then, one configuration at a time
    with its three seeds, the state sizes of the recurrent mixers (b: 8 and 1 heads for the delta rule, 8 for
    linear attention), a 32-token window, and s6 with n = 4 (the costliest mixer on a CPU: its scan loops over
    tokens)."""
    main = [RecallConfig(mixer=m) for m in ("attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid")]
    sweep = [RecallConfig(mixer="delta", n_heads=8), RecallConfig(mixer="delta", n_heads=1),
             RecallConfig(mixer="linear", n_heads=8), RecallConfig(mixer="window", window=32),
             RecallConfig(mixer="s6", d_state=4)]
    return [(c, s) for s in SEEDS for c in main] + [(c, s) for c in sweep for s in SEEDS]


def train(config: RecallConfig, seed: int, *, steps: int, batch: int, lr: float, warmup: int = 20,
          weight_decay: float = 0.01, train_pairs=TRAIN_PAIRS, log_every: int = 25) -> tuple[RecallModel, dict]:
    """Train one model; returns it and its JSON record."""
    torch.manual_seed(seed)
    model = RecallModel(config)
    data = torch.Generator().manual_seed(1000 + seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    losses, wall, cpu = [], time.perf_counter(), time.process_time()
    model.train()
    for step in range(steps):
        inputs, targets = mqar(batch, SEQ_LEN, train_pairs[step % len(train_pairs)], config.vocab_size, generator=data)
        loss = F.cross_entropy(model(inputs).transpose(1, 2), targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if (step + 1) % log_every == 0:
            losses.append({"step": step + 1, "loss": round(loss.item(), 4)})
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    evaluation = torch.Generator().manual_seed(EVAL_SEED)
    accuracy = {}
    for n in EVAL_PAIRS:
        inputs, targets = mqar(EVAL_ROWS, SEQ_LEN, n, config.vocab_size, generator=evaluation)
        accuracy[str(n)] = round(recall_accuracy(model, inputs, targets), 4)
    record = {
        "run": run_name(config, seed), "config": config.__dict__.copy(), "n_params": count_parameters(model),
        "recipe": {"steps": steps, "batch": batch, "seq_len": SEQ_LEN, "lr": lr, "warmup": warmup,
                   "schedule": "linear warmup, cosine decay", "weight_decay": weight_decay, "grad_clip": 1.0,
                   "optimizer": "AdamW", "train_pairs": list(train_pairs)},
        "seed": seed, "data_seed": 1000 + seed,
        "eval": {"seed": EVAL_SEED, "rows": EVAL_ROWS, "pairs": list(EVAL_PAIRS)},
        "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "losses": losses, "accuracy": accuracy,
    }
    return model.eval(), record


def save(model: RecallModel, record: dict, out: Path) -> None:
    """<run>.safetensors (float32 weights) and <run>.json beside it."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = out / f"{record['run']}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    weights.chmod(0o644)
    (out / f"{record['run']}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="train every shipped run (skips runs already saved)")
    parser.add_argument("--mixer", default="attention", help="one run: the mixer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-heads", type=int, default=RecallConfig.n_heads)
    parser.add_argument("--d-state", type=int, default=RecallConfig.d_state)
    parser.add_argument("--window", type=int, default=RecallConfig.window)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--out", type=Path, default=RECALL_DIR)
    args = parser.parse_args(argv)
    if args.grid:
        runs = grid()
    else:
        runs = [(RecallConfig(mixer=args.mixer, n_heads=args.n_heads, d_state=args.d_state, window=args.window),
                 args.seed)]
    for config, seed in runs:
        if args.grid and (args.out / f"{run_name(config, seed)}.json").exists():
            continue
        model, record = train(config, seed, steps=args.steps, batch=args.batch, lr=args.lr)
        save(model, record, args.out)
        print(f"{record['run']:<22} {record['cpu_seconds']:7.1f} cpu-s  accuracy {record['accuracy']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
