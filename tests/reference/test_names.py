"""Names stay where learners and other code find them: what ``selfattn_lite`` exported before the
house was reorganised (issue 22), and every API an issue named, import from their old paths."""

from __future__ import annotations

import importlib

import pytest

import selfattn_lite

# selfattn_lite.__all__ before the reorganisation, and the submodules notebooks reach as attributes
TOP_LEVEL = ["scaled_dot_product_attention", "causal_mask", "combine_masks", "padding_mask", "to_additive",
             "MultiHeadAttention", "RotaryEmbedding", "sinusoidal_encoding", "alibi_slopes", "alibi_bias",
             "KVCache", "kv_cache_bytes", "TinyDecoder", "load_tiny_decoder", "flash_attention", "gat_attention",
             "GATLayer"]
SUBMODULES = ["attention", "masks", "multihead", "positions", "kv_cache", "presets", "efficient", "graphs",
              "models", "encoder", "explore", "mla", "flex", "streaming", "pitfalls", "distributed",
              "triton_attention", "viz", "exercises"]

# module -> names an issue (or DESIGN.md) named there
NAMED = {
    "attention": ["attention_backward", "scaled_dot_product_attention"],
    "efficient": ["flash_attention", "flash_attention_backward", "sliding_window_attention", "linear_attention",
                  "TileKind", "tile_kind", "LOG2_E"],
    "graphs": ["gat_attention", "GATLayer"],
    "masks": ["document_mask", "causal_mask", "padding_mask"],
    "mla": ["MultiHeadLatentAttention"],
    "distributed": ["ring_attention", "ulysses_attention", "shard", "unshard", "launch"],
    "triton_attention": ["flash_attention"],
    "models": ["load_tiny_decoder", "TinyDecoder", "DecoderConfig"],
    "presets": ["get_preset", "ModelPreset", "PRESETS", "kv_cache_bytes"],
    "positions": ["RotaryEmbedding", "sinusoidal_encoding", "alibi_slopes", "alibi_bias",
                  # positions.__all__ before the context-extension scalings moved to rope_scaling
                  "rope_inv_freq", "scaled_inv_freq", "validate_scaling", "linear_inv_freq", "ntk_base",
                  "yarn_keep", "yarn_inv_freq", "yarn_attention_scaling", "llama3_inv_freq", "apply_rotary",
                  "interleaved_to_half_permutation", "half_to_interleaved_permutation", "permute_qk_rows"],
    "kv_cache": ["kv_cache_bytes", "KVCache", "get_preset", "PRESETS"],
    "explore": ["explore", "explore_decoder", "AttentionMaps"],
    "encoder": ["load_minilm", "tokenize", "sentence_embeddings", "model_dir"],
    "pitfalls": ["PITFALLS", "Demo", "Pitfall", "pitfall", "run_all", "HEATMAP_PITFALLS", "pitfall_weights"],
}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_the_package_still_exports(name):
    assert name in selfattn_lite.__all__
    exec(f"from selfattn_lite import {name}", {})                       # the spelling a notebook uses
    assert callable(getattr(selfattn_lite, name))


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodules_are_attributes_of_the_package(name):
    assert getattr(selfattn_lite, name) is importlib.import_module(f"selfattn_lite.{name}")


@pytest.mark.parametrize("module, name", [(m, n) for m, names in NAMED.items() for n in names])
def test_named_apis_import_from_their_old_paths(module, name):
    namespace = {}
    exec(f"from selfattn_lite.{module} import {name}", namespace)
    assert namespace[name] is not None


def test_one_definition_behind_the_re_exports():
    from selfattn_lite import kv_cache, positions, presets, rope_scaling

    assert kv_cache.kv_cache_bytes is presets.kv_cache_bytes is selfattn_lite.kv_cache_bytes
    assert positions.yarn_keep is rope_scaling.yarn_keep
    assert selfattn_lite.flash_attention is importlib.import_module("selfattn_lite.efficient").flash_attention


def test_the_machinery_lives_in_course():
    for name in ["bench", "bench_backward", "bench_decode", "bench_efficient", "gpu_report", "gpu_sections",
                 "train_tiny", "context_eval", "explorer_data", "student", "assignments", "site", "badges",
                 "figures", "memory"]:
        assert importlib.import_module(f"selfattn_lite.course.{name}").__name__ == f"selfattn_lite.course.{name}"
