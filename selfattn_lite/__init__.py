"""selfattn_lite: the package behind the selfattn-course notebooks.

Self-attention written out in plain PyTorch: a transparent twin of torch's APIs that
also returns what torch hides (the attention weights), checked against torch in tests.

Modules: attention, masks, multihead, positions, kv_cache, presets, efficient, graphs, models,
encoder, explore, viz, bench, distributed, triton_attention, gpu_report, exercises, figures.
The main names are importable from here.
"""

from __future__ import annotations

import importlib
import os

# Idle OpenMP threads sleep instead of spinning, however the course was started (make, conda, Binder,
# `python -m selfattn_lite.bench_efficient`): CPU timings then do not depend on the route. OpenMP
# reads the variable when torch loads it, so this only counts where torch is not imported yet; the
# notebooks set it in their first cell for that reason.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .attention import scaled_dot_product_attention  # noqa: E402
from .masks import causal_mask, combine_masks, padding_mask, to_additive  # noqa: E402

__version__ = "0.1.0"

# Names that live in heavier modules, imported on first use.
_LAZY = {
    "MultiHeadAttention": "multihead",
    "RotaryEmbedding": "positions",
    "sinusoidal_encoding": "positions",
    "alibi_slopes": "positions",
    "alibi_bias": "positions",
    "KVCache": "kv_cache",
    "kv_cache_bytes": "presets",
    "TinyDecoder": "models",
    "load_tiny_decoder": "models",
    "flash_attention": "efficient",
    "gat_attention": "graphs",
    "GATLayer": "graphs",
}

__all__ = ["scaled_dot_product_attention", "causal_mask", "combine_masks", "padding_mask", "to_additive",
           *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    try:
        return importlib.import_module(f".{name}", __name__)  # submodules: selfattn_lite.viz, ...
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":   # the submodule exists but needs something missing
            raise
        raise AttributeError(f"module 'selfattn_lite' has no attribute {name!r}") from None
