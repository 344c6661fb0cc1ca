"""Train the recall models of notebook 16 and ship them: ``<run>.safetensors`` + ``<run>.json`` per run.

    OMP_NUM_THREADS=1 python -m selfattn_lite.course.train_recall --grid            # everything shipped
    python -m selfattn_lite.course.train_recall --mixer delta --seed 0 --n-heads 4  # one run
    OMP_NUM_THREADS=1 python -m selfattn_lite.course.train_recall --sweep           # the swept protocol (v2)

Every run trains a ``RecallModel`` on fresh MQAR rows (each step draws a batch with a number of pairs
taken in turn from ``--train-pairs``), from a seeded generator (``seed``), then evaluates it on 512 rows
per number of pairs drawn from another generator (seed ``EVAL_SEED``). The JSON record holds the
config, the recipe, the seeds, the seconds (wall and CPU), the torch version, the losses and the final
accuracies; the safetensors file holds the weights (float32).

``--sweep`` runs the second protocol into ``data/recall_v2/`` (``RECALL_V2_DIR``), the same for every mixer:

* data: Zoology's MQAR rows (``mqar(..., style="zoology")``), vocabulary ``V2_VOCAB`` = 128 (Zoology's
  figures use 8192, whose embedding and output layer, 2 x 8192 x 32 = 524,288 weights, would hold about twenty
  times the parameters of a whole model here and dominate a CPU step;
  128 is the smallest power of two that keeps Zoology's own condition vocab_size > seq_len at 64);
* models: Gated DeltaNet's gate (``gate="gdn"``) and the short convolution inside the mixer, width 4
  (``conv="mixer"``), for the mixers of ``V2_MIXERS`` (``hybrid_1in4`` among them);
* training: ``V2_STEPS`` = 3000 steps (three times the first protocol's), batch 32, AdamW, warmup then
  cosine decay, at every learning rate of ``V2_LRS`` (1e-3, 3e-3, 1e-2: a decade) with seed 0, and at
  ``V2_LR_TOP`` = 3e-2 (Zoology's largest) for the mixers whose best of the three is 1e-2;
* selection (``select_lr``): for each mixer, the learning rate whose seed-0 run has the highest mean
  accuracy over the pair counts on the validation rows (512 rows per pair count from seed ``VAL_SEED``,
  never the evaluation rows of seed ``EVAL_SEED``); a tie goes to the smaller rate;
* then seeds 1 and 2 at the chosen rate. Accuracies are reported on the evaluation rows.

Runs already saved are skipped, so the sweep can be stopped and restarted; the seed-0 runs of every mixer
come first (first at 3e-3, then 1e-2, then 1e-3, then 3e-2 where it is tried), the other seeds once a mixer's
seed-0 runs all exist.

``--budget`` checks the training budget: every mixer's seed-0 run at its chosen rate again, with twice the
steps (``BUDGET_STEPS``; the same recipe, so the cosine decay spans the longer run), into
``data/recall_v2/budget/``; then, the same way, every seed stuck on the plateau at the chosen rate of a mixer where
another seed left it (``stuck_seeds``); then the remaining seeds, so that every mixer's three seeds are trained at
both budgets. Had the 3,000-step runs stopped improving, the longer runs score the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..recall import mqar
from ..recall_models import RECALL_DIR, RECALL_V2_DIR, RecallConfig, RecallModel, count_parameters, recall_accuracy

SEQ_LEN = 64
TRAIN_PAIRS = (4, 8, 12, 16)
EVAL_PAIRS = (4, 8, 12, 16)
EVAL_ROWS = 512
EVAL_SEED = 12345
SEEDS = (0, 1, 2)
STEPS = 1000      # the shipped recipe; at 600 steps and lr 1e-2 two seeds of attention in three were still at chance
BATCH = 32
LR = 3e-3

# the swept protocol (``--sweep``), stored in RECALL_V2_DIR
V2_MIXERS = ("attention", "window", "linear", "delta", "gated_delta", "s6", "hybrid", "hybrid_1in4")
V2_LRS = (3e-3, 1e-2, 1e-3)      # training order; the selection compares all three
V2_LR_TOP = 3e-2                 # Zoology's largest rate (logspace(-3, -1.5, 4)): tried where 1e-2 wins
V2_STEPS = 3000
V2_VOCAB = 128
V2_STYLE = "zoology"
VAL_SEED = 54321
VAL_ROWS = 512
BUDGET_STEPS = 2 * V2_STEPS
BUDGET_ORDER = ("attention", "gated_delta", "s6", "hybrid", "hybrid_1in4", "delta", "linear", "window")
BUDGET_REST_ORDER = ("gated_delta", "linear", "delta", "attention", "hybrid_1in4", "hybrid", "window", "s6")


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


def v2_config(mixer: str) -> RecallConfig:
    """A mixer's model in the swept protocol: Gated DeltaNet's gate, width-4 convolution inside the mixer."""
    return RecallConfig(mixer=mixer, vocab_size=V2_VOCAB, gate="gdn", conv="mixer", conv_width=4)


def lr_tag(lr: float) -> str:
    """3e-3 -> '3e-3', 1e-2 -> '1e-2'."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def v2_run_name(mixer: str, lr: float, seed: int) -> str:
    """gated_delta_lr3e-3_s0: the mixer, the learning rate and the seed of a swept run."""
    return f"{mixer}_lr{lr_tag(lr)}_s{seed}"


def mean_accuracy(accuracy: dict) -> float:
    """The mean over the pair counts of a record's accuracy dict."""
    return sum(accuracy.values()) / len(accuracy)


def _best_lr(records: list[dict], mixer: str, lrs) -> float | None:
    seed0 = {r["recipe"]["lr"]: r for r in records
             if r["config"]["mixer"] == mixer and r["seed"] == 0 and r["recipe"]["lr"] in lrs}
    if len(seed0) < len(lrs):
        return None
    return max(sorted(lrs), key=lambda lr: (mean_accuracy(seed0[lr]["val"]["accuracy"]), -lr))


def mixer_lrs(records: list[dict], mixer: str) -> tuple[float, ...]:
    """The rates swept for ``mixer``: ``V2_LRS``, and ``V2_LR_TOP`` as well where the best of those is the
    largest (a choice at the edge of the sweep says nothing about the rates beyond it)."""
    if _best_lr(records, mixer, V2_LRS) == max(V2_LRS):
        return V2_LRS + (V2_LR_TOP,)
    return V2_LRS


def select_lr(records: list[dict], mixer: str, lrs=None) -> float | None:
    """The selection rule: the learning rate of ``lrs`` (default ``mixer_lrs``: the sweep, extended to
    ``V2_LR_TOP`` where its largest rate wins) whose seed-0 run of ``mixer`` has the highest mean validation
    accuracy (``record["val"]["accuracy"]``); a tie goes to the smaller rate. None until every rate's seed-0
    run is among ``records``."""
    return _best_lr(records, mixer, mixer_lrs(records, mixer) if lrs is None else lrs)


def sweep_plan(out: Path) -> list[tuple[str, float, int]]:
    """The (mixer, lr, seed) runs still to train in ``out``: first the seed-0 sweep of every mixer, then
    seeds 1 and 2 at each mixer's chosen rate (for the mixers whose seed-0 runs are all saved)."""
    done = {p.stem for p in out.glob("*.json")}
    plan = [(m, lr, 0) for lr in V2_LRS for m in V2_MIXERS if v2_run_name(m, lr, 0) not in done]
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*.json"))]
    plan += [(m, V2_LR_TOP, 0) for m in V2_MIXERS
             if V2_LR_TOP in mixer_lrs(records, m) and v2_run_name(m, V2_LR_TOP, 0) not in done]
    for m in V2_MIXERS:
        lr = select_lr(records, m)
        if lr is not None:
            plan += [(m, lr, s) for s in SEEDS[1:] if v2_run_name(m, lr, s) not in done]
    return plan


def loss_tail(record: dict, share: float = 0.1) -> dict:
    """Has training stopped improving? Per number of pairs, the mean loss of the last ``share`` of that pair
    count's steps and of the ``share`` before it (from ``losses_by_pairs``): {n: (previous, last)}."""
    out = {}
    for n, losses in record["losses_by_pairs"].items():
        m = max(1, int(len(losses) * share))
        if len(losses) < 2 * m:
            raise ValueError(f"{record['run']}: {len(losses)} losses at {n} pairs, too few for two shares of {m}")
        out[n] = (sum(losses[-2 * m:-m]) / m, sum(losses[-m:]) / m)
    return out


def rows_sha256(rows: list) -> str:
    """sha256 of the int64 bytes of the given tensors, in order: the fingerprint of a set of rows."""
    digest = hashlib.sha256()
    for t in rows:
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()


def evaluate(model: RecallModel, vocab_size: int, seed: int, rows: int, style: str) -> tuple[dict, str]:
    """Accuracy per number of pairs on ``rows`` rows each, drawn from seed ``seed``; and the rows' sha256."""
    generator, accuracy, drawn = torch.Generator().manual_seed(seed), {}, []
    for n in EVAL_PAIRS:
        inputs, targets = mqar(rows, SEQ_LEN, n, vocab_size, generator=generator, style=style)
        accuracy[str(n)] = round(recall_accuracy(model, inputs, targets), 4)
        drawn += [inputs, targets]
    return accuracy, rows_sha256(drawn)


def train(config: RecallConfig, seed: int, *, steps: int, batch: int, lr: float, warmup: int = 20,
          weight_decay: float = 0.01, train_pairs=TRAIN_PAIRS, log_every: int = 25, style: str = "notebook",
          name: str | None = None, validate: bool = False) -> tuple[RecallModel, dict]:
    """Train one model; returns it and its JSON record.

    ``style`` is the MQAR form of the training, validation and evaluation rows. ``validate`` (the swept
    protocol) adds the accuracies on the validation rows, the rows' sha256 and every step's loss grouped by
    number of pairs (``losses_by_pairs[str(n)]``: the losses of steps with n pairs, in order)."""
    torch.manual_seed(seed)
    model = RecallModel(config)
    data = torch.Generator().manual_seed(1000 + seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    losses, wall, cpu = [], time.perf_counter(), time.process_time()
    by_pairs = {str(n): [] for n in train_pairs}
    model.train()
    for step in range(steps):
        n = train_pairs[step % len(train_pairs)]
        if style == "notebook":     # the first protocol's call, unchanged (same rows from the same stream)
            inputs, targets = mqar(batch, SEQ_LEN, n, config.vocab_size, generator=data)
        else:
            inputs, targets = mqar(batch, SEQ_LEN, n, config.vocab_size, generator=data, style=style)
        loss = F.cross_entropy(model(inputs).transpose(1, 2), targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if validate:
            by_pairs[str(n)].append(round(loss.item(), 4))
        if (step + 1) % log_every == 0:
            losses.append({"step": step + 1, "loss": round(loss.item(), 4)})
            if validate:
                losses[-1]["pairs"] = n
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    accuracy, eval_sha = evaluate(model, config.vocab_size, EVAL_SEED, EVAL_ROWS, style)
    record = {
        "run": name or run_name(config, seed), "config": config.__dict__.copy(), "n_params": count_parameters(model),
        "recipe": {"steps": steps, "batch": batch, "seq_len": SEQ_LEN, "lr": lr, "warmup": warmup,
                   "schedule": "linear warmup, cosine decay", "weight_decay": weight_decay, "grad_clip": 1.0,
                   "optimizer": "AdamW", "train_pairs": list(train_pairs)},
        "seed": seed, "data_seed": 1000 + seed,
        "eval": {"seed": EVAL_SEED, "rows": EVAL_ROWS, "pairs": list(EVAL_PAIRS)},
        "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "losses": losses, "accuracy": accuracy,
    }
    if validate:
        val_accuracy, val_sha = evaluate(model, config.vocab_size, VAL_SEED, VAL_ROWS, style)
        record["protocol"] = "v2"
        record["recipe"]["mqar_style"] = style
        record["eval"]["sha256"] = eval_sha
        record["val"] = {"seed": VAL_SEED, "rows": VAL_ROWS, "pairs": list(EVAL_PAIRS), "sha256": val_sha,
                         "accuracy": val_accuracy}
        record["selection"] = ("per mixer, the learning rate whose seed-0 run has the highest mean validation "
                               "accuracy over the pair counts (1e-3, 3e-3, 1e-2, and 3e-2 where 1e-2 "
                               "wins); a tie goes to the smaller rate")
        record["command"] = "OMP_NUM_THREADS=1 python -m selfattn_lite.course.train_recall --sweep"
        record["losses_by_pairs"] = by_pairs
    return model.eval(), record


def save(model: RecallModel, record: dict, out: Path) -> None:
    """<run>.safetensors (float32 weights) and <run>.json beside it."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = out / f"{record['run']}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    weights.chmod(0o644)
    record = dict(record)
    by_pairs = record.pop("losses_by_pairs", None)
    text = json.dumps(record, indent=1)
    if by_pairs is not None:       # every step's loss: one line per number of pairs
        lines = ",\n".join(f"  {json.dumps(n)}: {json.dumps(v)}" for n, v in by_pairs.items())
        text = text[:-2] + ',\n "losses_by_pairs": {\n' + lines + "\n }\n}"
    (out / f"{record['run']}.json").write_text(text + "\n", encoding="utf-8")


def run_sweep(out: Path, steps: int = V2_STEPS, batch: int = BATCH) -> None:
    """Train the swept protocol's runs still missing in ``out`` (see the module docstring)."""
    while plan := sweep_plan(out):
        mixer, lr, seed = plan[0]
        name = v2_run_name(mixer, lr, seed)
        model, record = train(v2_config(mixer), seed, steps=steps, batch=batch, lr=lr, style=V2_STYLE,
                              name=name, validate=True)
        save(model, record, out)
        print(f"{name:<26} {record['cpu_seconds']:7.1f} cpu-s  val {record['val']['accuracy']}  "
              f"eval {record['accuracy']}", flush=True)


def stuck_seeds(records: list[dict], mixer: str, lr: float) -> list[int]:
    """The seeds of ``mixer`` at rate ``lr`` stuck on the plateau (mean validation accuracy below 0.5) while
    another seed of the same mixer and rate left it (above 0.5): the runs a longer budget might rescue."""
    means = {r["seed"]: mean_accuracy(r["val"]["accuracy"]) for r in records
             if r["config"]["mixer"] == mixer and r["recipe"]["lr"] == lr}
    if not any(m > 0.5 for m in means.values()):
        return []
    return sorted(s for s, m in means.items() if m < 0.5)


def budget_plan(sweep_dir: Path, out: Path) -> list[tuple[str, float, int]]:
    """The (mixer, chosen rate, seed) runs of the budget check still missing in ``out``: every mixer's seed 0,
    then the stuck seeds (``stuck_seeds``) of the mixers where another seed learned, then every other seed (so
    each mixer's three seeds are compared at both budgets)."""
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(sweep_dir.glob("*.json"))]
    done = {p.stem for p in out.glob("*.json")}
    chosen = {m: select_lr(records, m) for m in BUDGET_ORDER}
    runs = [(m, lr, 0) for m, lr in chosen.items() if lr is not None]
    runs += [(m, lr, s) for m, lr in chosen.items() if lr is not None for s in stuck_seeds(records, m, lr) if s != 0]
    runs += [(m, chosen[m], s) for m in BUDGET_REST_ORDER if chosen[m] is not None for s in SEEDS[1:]
             if (m, chosen[m], s) not in runs]
    return [(m, lr, s) for m, lr, s in runs if budget_run_name(m, lr, s) not in done]


def budget_run_name(mixer: str, lr: float, seed: int) -> str:
    """attention_lr3e-3_s2_steps6000: a budget-check run's name."""
    return f"{v2_run_name(mixer, lr, seed)}_steps{BUDGET_STEPS}"


def run_budget(sweep_dir: Path, batch: int = BATCH, only_stuck: bool = False) -> None:
    """Train the budget check's runs still missing in ``sweep_dir / "budget"`` (see the module docstring)."""
    out = sweep_dir / "budget"
    for mixer, lr, seed in budget_plan(sweep_dir, out):
        if only_stuck and seed == 0:
            continue
        name = budget_run_name(mixer, lr, seed)
        claim = out / f"{name}.claim"              # another process trains it: two processes can share the plan
        if (out / f"{name}.json").exists() or claim.exists():
            continue
        claim.touch()
        try:
            model, record = train(v2_config(mixer), seed, steps=BUDGET_STEPS, batch=batch, lr=lr, style=V2_STYLE,
                                  name=name, validate=True)
            record["command"] = "OMP_NUM_THREADS=1 python -m selfattn_lite.course.train_recall --budget"
            save(model, record, out)
        finally:
            claim.unlink()
        print(f"{name:<36} {record['cpu_seconds']:7.1f} cpu-s  eval {record['accuracy']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="train every shipped run (skips runs already saved)")
    parser.add_argument("--sweep", action="store_true",
                        help="the swept protocol into data/recall_v2 (skips runs already saved)")
    parser.add_argument("--mixer", default="attention", help="one run: the mixer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-heads", type=int, default=RecallConfig.n_heads)
    parser.add_argument("--d-state", type=int, default=RecallConfig.d_state)
    parser.add_argument("--window", type=int, default=RecallConfig.window)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", action="store_true",
                        help="the budget check: seed 0 at each mixer's chosen rate, twice the steps")
    args = parser.parse_args(argv)
    if args.budget:
        run_budget(args.out or RECALL_V2_DIR, batch=args.batch)
        return 0
    if args.sweep:
        run_sweep(args.out or RECALL_V2_DIR, steps=args.steps if args.steps != STEPS else V2_STEPS,
                  batch=args.batch)
        return 0
    args.out = args.out or RECALL_DIR
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
