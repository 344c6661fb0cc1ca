"""Train the tiny character-level decoder shipped with the package.

    python -m selfattn_lite.course.train_tiny            # writes selfattn_lite/data/tiny_decoder.*
    python -m selfattn_lite.course.train_tiny --position alibi --name tiny_decoder_alibi
    python -m selfattn_lite.course.train_tiny --init-from selfattn_lite/data/tiny_decoder.safetensors \
        --rope-scaling '{"kind": "linear", "factor": 4}' --seq-len 2048 --steps 40 --name tiny_decoder_pi

It runs once (a few minutes on two CPU cores); the notebooks and tests load its output
instead of training. The text is Shakespeare (``data/shakespeare.txt``, public domain);
its last 10% is held out and never trained on. Training is seeded, so the same machine
and torch version give the same weights.

Recipe: random 512-character windows, next-character cross-entropy, AdamW with linear
warmup and cosine decay, gradient clipping at 1.0, dropout 0.1 on the residual branches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import (
    CONFIG_FILE,
    TEXT_FILE,
    VAL_WINDOWS,
    WEIGHTS_FILE,
    CharTokenizer,
    DecoderConfig,
    TinyDecoder,
    evaluate,
    load_text,
    load_tiny_decoder,
    split_text,
)

#: The shipped model's shape: 4 layers of width 128, 8 heads of 16 dims, context 512.
MODEL = dict(d_model=128, n_layers=4, n_heads=8, n_kv_heads=8, d_ff=512, max_len=512, rope_base=10000.0,
             norm="rmsnorm", tie_embeddings=True, dropout=0.1)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batches(ids: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator):
    """Endless (batch, seq_len + 1) random windows of ``ids``."""
    while True:
        starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=generator)
        yield torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()])


def save(model: TinyDecoder, info: dict, weights: Path, config: Path,
         save_dtype: torch.dtype = torch.float32) -> None:
    """Weights as safetensors (the tied output layer stored once), the rest as JSON."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(save_dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # the same tensor as embed.weight
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors writes 0600; the file ships in the package
    config.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def train(steps: int = 800, batch: int = 8, lr: float = 3e-3, warmup: int = 40, weight_decay: float = 0.1,
          seed: int = 0, eval_every: int = 100, weights: Path = WEIGHTS_FILE, config: Path = CONFIG_FILE,
          progress: bool = True, model_overrides: dict | None = None,
          save_dtype: torch.dtype = torch.float32, *, position: str = "rope", seq_len: int | None = None,
          rope_scaling: dict | None = None, init_from: Path | None = None) -> TinyDecoder:
    """Train from scratch (or fine-tune ``init_from``) and save; returns the trained model (eval mode).

    ``model_overrides`` changes entries of ``MODEL`` (e.g. ``{"n_kv_heads": 2, "max_len": 256}``;
    ``max_len`` is also the training window). ``save_dtype`` bfloat16 halves the file; the final
    held-out loss is then measured on the weights as saved (rounded), so a reload reproduces it.
    ``position`` picks RoPE or ALiBi for a model trained from scratch. ``init_from`` (a
    safetensors file with its JSON beside it) starts from a trained model instead, loaded with
    ``rope_scaling`` and a context of ``seq_len``: the short fine-tune that context extension uses.
    """
    shape = {**MODEL, **(model_overrides or {})}
    torch.manual_seed(seed)
    text = load_text()
    tokenizer = CharTokenizer.from_text(text)
    train_text, val_text = split_text(text)
    train_ids, val_ids = tokenizer.encode(train_text), tokenizer.encode(val_text)

    if position != "rope":
        shape["position"] = position
    if init_from is not None:
        init_from = Path(init_from)
        model = load_tiny_decoder(init_from, init_from.with_suffix(".json"), rope_scaling=rope_scaling,
                                  max_len=seq_len)
        shape = {k: v for k, v in asdict(model.config).items() if k != "vocab_size" and v is not None}
    else:
        if seq_len is not None:
            shape["max_len"] = seq_len
        if rope_scaling is not None:
            shape["rope_scaling"] = rope_scaling
        model = TinyDecoder(DecoderConfig(vocab_size=len(tokenizer), **shape))
    seq_len = model.config.max_len
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99))
    data = batches(train_ids, batch, seq_len, torch.Generator().manual_seed(seed))

    start, history, ema = time.perf_counter(), [], None
    bar = tqdm(range(steps), desc="training tiny decoder", unit="step", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        model.train()
        loss = model.loss(next(data))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            model.eval()
            val = evaluate(model, val_ids, n_windows=VAL_WINDOWS)
            history.append({"step": step + 1, "train_loss": round(ema, 4), "val_loss": round(val["loss"], 4),
                            "val_accuracy": round(val["accuracy"], 4)})
            bar.set_postfix(train=f"{ema:.3f}", val=f"{val['loss']:.3f}")
        else:
            bar.set_postfix(train=f"{ema:.3f}")
    seconds = time.perf_counter() - start

    model.eval()
    if save_dtype != torch.float32:   # round the weights as they will be stored, then measure
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(save_dtype).float())
    final = evaluate(model, val_ids, n_windows=VAL_WINDOWS)
    info = {
        "model": {"vocab_size": len(tokenizer), **shape},
        "vocab": tokenizer.chars,
        "n_params": model.n_params(),
        "data": {"file": TEXT_FILE.name, "chars": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest(),
                 "val_fraction": round(len(val_text) / len(text), 4)},
        "training": {"steps": steps, "batch": batch, "seq_len": seq_len, "tokens": steps * batch * seq_len,
                     "lr": lr, "warmup": warmup, "weight_decay": weight_decay, "seed": seed,
                     "seconds": round(seconds, 1), "threads": torch.get_num_threads(),
                     "torch": torch.__version__, "history": history,
                     **({"weights_dtype": str(save_dtype).removeprefix("torch.")} if save_dtype != torch.float32
                        else {})},
        **({"init_from": {"file": init_from.name,
                          "sha256": hashlib.sha256(init_from.read_bytes()).hexdigest()}} if init_from else {}),
        "val_loss": round(final["loss"], 4),
        "val_accuracy": round(final["accuracy"], 4),
    }
    save(model, info, Path(weights), Path(config), save_dtype)
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.train_tiny",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=WEIGHTS_FILE.parent, help="folder for the two output files")
    # Variants (defaults: the shipped model, unchanged): notebook 11's heads and mask, notebook 12's positions
    parser.add_argument("--name", default=WEIGHTS_FILE.stem, help="file stem: NAME.safetensors and NAME.json")
    parser.add_argument("--n-kv-heads", type=int, default=None, help="K/V heads (8 = MHA, 2 = GQA, 1 = MQA)")
    parser.add_argument("--seq-len", type=int, default=None, help="training window = the model's max_len (512)")
    parser.add_argument("--no-causal", action="store_true", help="train without the causal mask (it sees the future)")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--save-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--position", choices=("rope", "alibi"), default="rope")
    parser.add_argument("--rope-scaling", type=json.loads, default=None,
                        help='RoPE context-extension dict as JSON, e.g. \'{"kind": "linear", "factor": 4}\'')
    parser.add_argument("--init-from", type=Path, default=None,
                        help="fine-tune this safetensors file (its .json beside it) instead of starting from scratch")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {}
    if args.n_kv_heads is not None:
        overrides["n_kv_heads"] = args.n_kv_heads
    if args.no_causal:
        overrides["is_causal"] = False
    weights, config = args.out / f"{args.name}.safetensors", args.out / f"{args.name}.json"
    model = train(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, warmup=args.warmup,
                  eval_every=args.eval_every, weights=weights, config=config, model_overrides=overrides,
                  save_dtype=getattr(torch, args.save_dtype), position=args.position, seq_len=args.seq_len,
                  rope_scaling=args.rope_scaling, init_from=args.init_from)
    info = json.loads(config.read_text())
    print(f"saved {weights} ({model.n_params():,} parameters); "
          f"held-out loss {info['val_loss']:.3f} nats/char, accuracy {info['val_accuracy']:.1%}, "
          f"{info['training']['seconds']:.0f} s")
    tok = CharTokenizer(info["vocab"])
    prompt = "ROMEO:\n"
    new_tokens = min(200, model.config.max_len - len(prompt))   # a short --seq-len leaves less room
    print(prompt + tok.decode(model.generate(tok.encode(prompt), new_tokens)[0, len(prompt):]))


if __name__ == "__main__":
    main()
