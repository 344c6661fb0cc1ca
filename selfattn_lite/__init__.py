"""selfattn_lite: the package behind the selfattn-course notebooks.

Self-attention written out in plain PyTorch: a transparent twin of torch's APIs that
also returns what torch hides (the attention weights), checked against torch in tests.

The package has three wings (the README's "Layout" says why; import-linter enforces it):

* the reference, what the notebooks teach, one module per subject in reading order: attention,
  masks, multihead, positions (with rope_scaling), kv_cache, presets, efficient, pitfalls, graphs,
  models, encoder, explore; Part II: mla, flex, streaming, distributed, triton_attention. It imports
  nothing else of the package but ``_checks`` (the input checks every module shares);
* the learner layer: ``viz`` (figures and widgets) and ``exercises`` (the checkers), on the reference;
* the course machinery, ``course``: benchmarks, the GPU report, training and evaluation commands,
  the student build, assignments, site, badges and figure scripts, on both.

The main names of the reference are importable from here.
"""

from __future__ import annotations

import importlib
import os

# Idle OpenMP threads sleep instead of spinning, however the course was started (make, conda, Binder,
# `python -m selfattn_lite.course.bench_efficient`): CPU timings then do not depend on the route. OpenMP
# reads the variable when torch loads it, so this only counts where torch is not imported yet; the
# notebooks set it in their first cell for that reason.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Triton's interpreter or its compiler: the one place that decides. Without CUDA, notebook 15's kernels run
# under Triton's CPU interpreter. Triton reads TRITON_INTERPRET once, when it is first imported, and torch
# imports it lazily (its profiler does; so does the GPU report's version check), so the choice is made here,
# when the package is first imported, before anything of ours or torch's can import Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
