"""Attention weights precomputed for the kernel-free explorer page of the course website.

    python -m selfattn_lite.course.explorer_data OUT_FOLDER

runs every sentence in ``SENTENCES`` through both models the course explores, the pretrained
encoder all-MiniLM-L6-v2 (``selfattn_lite.explore.explore``) and the course's tiny causal decoder
(``selfattn_lite.explore.explore_decoder``), and writes the weights to ``explorer_data.json`` and,
for pages opened as local files (where a browser will not ``fetch`` a JSON file),
``explorer_data.js`` (``window.SELFATTN_EXPLORER = {...}``). The page's plain JavaScript draws
them (``site/_static/explorer.js``); nothing is computed in the browser but the top keys.

To keep the file small, weights are stored as bytes: ``round(255 * w)``, (n_layers, n_heads, T, T)
in C order, base64-encoded; the page divides by 255 (error at most 1/510 per weight). For the
causal decoder only the lower triangle is stored (row i keeps keys 0..i; the rest is exactly 0).
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import torch

__all__ = ["SENTENCES", "MODELS", "quantize", "dequantize", "precompute", "write"]

# Short enough that the decoder's character-level heatmap (one token per character) stays readable.
SENTENCES = (
    "The cat sat on the mat, it was tired",
    "To be, or not to be",
    "The keys to the cabinet are here",
    "She gave him the book he wanted",
    "The trophy did not fit in the case",
)
MODELS = {   # key -> (label shown on the page, note)
    "minilm": ("all-MiniLM-L6-v2 (pretrained encoder)", "bidirectional: every token attends to every token"),
    "decoder": ("tiny decoder (trained in this course)", "causal, one token per character: no key after the query"),
}
SCALE = 255


def quantize(weights: torch.Tensor, is_causal: bool = False) -> str:
    """(..., T, T) weights in [0, 1] -> base64 of round(255 w) as uint8, C order.

    With ``is_causal`` only the lower triangle (i >= j) is kept, row by row.
    """
    if weights.min() < 0 or weights.max() > 1 + 1e-6:
        raise ValueError(f"weights must lie in [0, 1], got [{float(weights.min())}, {float(weights.max())}]")
    q = (weights.clamp(0, 1) * SCALE).round().to(torch.uint8)
    if is_causal:
        T = q.shape[-1]
        i, j = torch.tril_indices(T, T)
        q = q[..., i, j]                                                # (..., T (T + 1) / 2)
    return base64.b64encode(q.contiguous().numpy().tobytes()).decode("ascii")


def dequantize(data: str, shape: tuple[int, ...], is_causal: bool = False) -> torch.Tensor:
    """The inverse of ``quantize``: a float32 tensor of ``shape`` (..., T, T)."""
    raw = torch.frombuffer(bytearray(base64.b64decode(data)), dtype=torch.uint8).to(torch.float32) / SCALE
    if not is_causal:
        return raw.reshape(shape)
    T = shape[-1]
    out = torch.zeros(shape)
    i, j = torch.tril_indices(T, T)
    out[..., i, j] = raw.reshape(*shape[:-2], T * (T + 1) // 2)
    return out


def _entry(maps, is_causal: bool) -> dict:
    if is_causal and bool(maps.weights.triu(1).abs().max() > 0):
        raise ValueError(f"{maps.model}: weights above the diagonal are not zero, the model is not causal")
    return {"tokens": list(maps.tokens), "weights": quantize(maps.weights, is_causal)}


def precompute(sentences=SENTENCES) -> dict:
    """Every sentence through both models: the dictionary the page reads."""
    from ..explore import explore, explore_decoder
    from ..models import load_tiny_decoder

    decoder = load_tiny_decoder()
    out = {"scale": SCALE, "sentences": list(sentences), "models": {}}
    for key, run in (("minilm", explore), ("decoder", lambda s: explore_decoder(s, decoder))):
        items = [run(s) for s in sentences]
        out["models"][key] = {
            "label": MODELS[key][0], "note": MODELS[key][1],
            "n_layers": items[0].n_layers, "n_heads": items[0].n_heads, "causal": key == "decoder",
            "items": [_entry(m, key == "decoder") for m in items],
        }
    return out


def write(folder: str | Path, data: dict | None = None) -> list[Path]:
    """Write ``explorer_data.json`` and ``explorer_data.js`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = precompute() if data is None else data
    text = json.dumps(data, separators=(",", ":"))
    (folder / "explorer_data.json").write_text(text)
    (folder / "explorer_data.js").write_text(f"window.SELFATTN_EXPLORER = {text};\n")
    return [folder / "explorer_data.json", folder / "explorer_data.js"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.explorer_data",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=".",
                        help="where to write explorer_data.json and .js (default: the current folder)")
    for path in write(parser.parse_args(argv).folder):
        print(f"{path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
