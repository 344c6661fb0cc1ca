"""One valid call of every public callable of the reference, for ``test_fuzz_inputs``.

``CASES`` maps a callable's key ("module.name", "module.Class.method") to a ``Case``: a function that
builds the call afresh (fn, args, kwargs) each time it is asked (so that a method that changes its
object, ``KVCache.update`` say, starts from the same state every time), and what the fuzz needs to
know that the valid call cannot tell it: which arguments are token ids (and their vocabulary), which
are indices (and their range), which derived calls are in fact valid here. ``NOT_FUZZED`` names the
public callables that take no input to check, each with the reason.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import selfattn_lite as sal
import selfattn_lite.distributed.launch  # noqa: F401  (the module, which distributed's launch shadows)
from selfattn_lite import (
    attention,
    efficient,
    encoder,
    explore,
    flex,
    graphs,
    kv_cache,
    masks,
    mla,
    models,
    multihead,
    pitfall_registry,
    pitfalls,
    positions,
    presets,
    recall,
    recall_models,
    recurrent,
    rope_scaling,
    streaming,
    triton_attention,
)
from selfattn_lite.distributed import comm, cost, ring, sharding, ulysses


@dataclass
class Case:
    make: Callable[[], tuple[Callable, list, dict]]
    ids: dict = field(default_factory=dict)       # argument -> vocabulary size (its values are token ids)
    index: dict = field(default_factory=dict)     # argument -> n (an index in [-n, n))
    valid: set = field(default_factory=set)       # "argument:mutation" pairs that are valid input here
    positive: tuple = ()                          # arguments (besides the usual sizes) that must be >= 1
    mutate: bool = True                           # False: the valid call only (a loader reading files)


def fake_props():
    """What torch.cuda.get_device_properties returns, for an RTX 4090 (the fields gpu_limits reads)."""
    from types import SimpleNamespace

    return SimpleNamespace(name="NVIDIA GeForce RTX 4090", major=8, minor=9, shared_memory_per_block_optin=101_376,
                           regs_per_multiprocessor=65_536, multi_processor_count=128, total_memory=24 * 2**30)


def C(make, **options) -> Case:
    return Case(make, **options)


def R(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)), dtype=dtype)


def ints(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def M(*shape):
    return torch.ones(*shape, dtype=torch.bool).tril()


# ------------------------------------------------------------------------------- shared, built once
@functools.cache
def tiny():
    return models.load_tiny_decoder().eval()


@functools.cache
def minilm():
    return encoder.load_minilm()


@functools.cache
def tokenizer():
    return encoder.load_tokenizer()


@functools.cache
def maps():
    return explore.AttentionMaps(["[CLS]", "the", "cat", "[SEP]"], torch.softmax(R(2, 3, 4, 4), -1), "test")


@functools.cache
def recall_model():
    return recall_models.RecallModel(recall_models.RecallConfig(mixer="hybrid", vocab_size=16, d_model=8,
                                                                n_heads=2, d_state=4, window=4, d_ff=16)).eval()


def mha():
    return multihead.MultiHeadAttention(8, 2)


def mla_layer():
    torch.manual_seed(0)
    return mla.MultiHeadLatentAttention(8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)


def small_decoder():
    torch.manual_seed(0)
    return models.TinyDecoder(models.DecoderConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, max_len=16))


def bert_cfg():
    return encoder.BertConfig(vocab_size=20, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_len=16)


def preset():
    return presets.get_preset("Llama-2-7B")


def flash_saved():
    q, k, v = R(1, 2, 5, 4), R(1, 2, 6, 4, seed=1), R(1, 2, 6, 3, seed=2)
    out, lse = efficient.flash_attention(q, k, v, return_lse=True)
    return q, k, v, out, lse, R(1, 2, 5, 3, seed=3)


@functools.cache
def block_mask_of(L=8):
    return flex.block_mask(flex.causal_mod, L, block_size=4)


def triton_saved():
    q, k, v = R(1, 1, 16, 16), R(1, 1, 16, 16, seed=1), R(1, 1, 16, 16, seed=2)
    out, lse = triton_attention.forward(q, k, v, block_m=16, block_n=16)
    return q, k, v, out, lse, R(1, 1, 16, 16, seed=3)


TEXT = "to be, or not to be"
TINY_VOCAB = 62             # the shipped tiny decoder's characters


launch = sys.modules["selfattn_lite.distributed.launch"]


def cases() -> dict[str, Case]:
    q, k, v = R(2, 3, 4), R(2, 5, 4, seed=1), R(2, 5, 3, seed=2)
    q4, k4, v4 = R(1, 2, 5, 4), R(1, 2, 5, 4, seed=1), R(1, 2, 5, 3, seed=2)
    beta = torch.sigmoid(R(1, 2, 5))
    scan = dict(u=R(1, 3, 5), delta=torch.nn.functional.softplus(R(1, 3, 5, seed=1)), A=-R(3, 2).abs(),
                B=R(1, 2, 5, seed=2), C=R(1, 2, 5, seed=3))
    return {
        # ------------------------------------------------------------------ attention
        "attention.scaled_dot_product_attention": C(lambda: (sal.scaled_dot_product_attention, [q, k, v],
                                                             dict(attn_mask=M(3, 5), dropout_p=0.0))),
        "attention.attention_backward": C(lambda: (attention.attention_backward, [q, k, v, R(2, 3, 3, seed=4)], {})),
        "attention.safe_softmax": C(lambda: (attention.safe_softmax, [R(2, 3)], dict(dim=-1)),
                                    index={"dim": 2}),
        "attention.upcast_dtype": C(lambda: (attention.upcast_dtype, [torch.float16], {})),
        "attention.validate_qkv": C(lambda: (attention.validate_qkv, [q, k, v], {})),
        "attention.validate_mask": C(lambda: (attention.validate_mask, [M(3, 5), torch.Size((2, 3, 5))], {})),
        # ------------------------------------------------------------------ masks
        "masks.causal_mask": C(lambda: (masks.causal_mask, [3, 4], dict(bottom_right=True))),
        "masks.combine_masks": C(lambda: (masks.combine_masks, [M(3, 4), M(3, 4).flip(-1)], {})),
        "masks.padding_mask": C(lambda: (masks.padding_mask, [torch.tensor([2, 3])], dict(max_len=4))),
        "masks.to_additive": C(lambda: (masks.to_additive, [M(3, 4)], dict(dtype=torch.float32))),
        "masks.key_padding_to_attn_mask": C(lambda: (masks.key_padding_to_attn_mask, [torch.tensor([[True, False]])],
                                                     {})),
        "masks.is_fully_masked": C(lambda: (masks.is_fully_masked, [M(3, 4)], {})),
        "masks.sink_window_mask": C(lambda: (masks.sink_window_mask, [6, 1, 2], {})),
        "masks.window_mask_2d": C(lambda: (masks.window_mask_2d, [4, 4, 2], dict(shift=1))),
        "masks.document_mask": C(lambda: (masks.document_mask, [torch.tensor([0, 0, 1, 1, 1])], dict(is_causal=True))),
        "masks.document_positions": C(lambda: (masks.document_positions, [torch.tensor([0, 0, 1, 1, 1])], {})),
        # ------------------------------------------------------------------ multihead
        "multihead.MultiHeadAttention": C(lambda: (multihead.MultiHeadAttention, [8, 2, 1], dict(is_causal=True))),
        "multihead.MultiHeadAttention.forward": C(lambda: (mha().forward, [R(2, 3, 8)],
                                                           dict(key_padding_mask=torch.zeros(2, 3, dtype=torch.bool),
                                                                need_weights=True))),
        "multihead.MultiHeadAttention.extra_repr": C(lambda: (mha().extra_repr, [], {})),
        "multihead.MultiHeadAttention.from_torch": C(lambda: (multihead.MultiHeadAttention.from_torch,
                                                              [torch.nn.MultiheadAttention(8, 2, batch_first=True)],
                                                              {})),
        # ------------------------------------------------------------------ positions
        "positions.sinusoidal_encoding": C(lambda: (positions.sinusoidal_encoding, [5, 8], {})),
        "positions.RotaryEmbedding": C(lambda: (positions.RotaryEmbedding, [8], dict(base=100.0))),
        "positions.RotaryEmbedding.forward": C(lambda: (positions.RotaryEmbedding(4).forward, [R(1, 2, 3, 4)],
                                                        dict(positions=torch.arange(3)))),
        "positions.RotaryEmbedding.angles": C(lambda: (positions.RotaryEmbedding(4).angles, [torch.arange(3)], {})),
        "positions.RotaryEmbedding.extra_repr": C(lambda: (positions.RotaryEmbedding(4).extra_repr, [], {})),
        "positions.alibi_slopes": C(lambda: (positions.alibi_slopes, [4], {})),
        "positions.alibi_bias": C(lambda: (positions.alibi_bias, [2, 3, 4], {})),
        "positions.rope_inv_freq": C(lambda: (positions.rope_inv_freq, [8], dict(base=100.0))),
        "positions.scaled_inv_freq": C(lambda: (positions.scaled_inv_freq, [8],
                                                dict(scaling={"kind": "linear", "factor": 2.0}))),
        "positions.apply_rotary": C(lambda: (positions.apply_rotary,
                                             [R(1, 3, 4), *positions.RotaryEmbedding(4).angles(torch.arange(3))], {})),
        "positions.interleaved_to_half_permutation": C(lambda: (positions.interleaved_to_half_permutation, [4], {})),
        "positions.half_to_interleaved_permutation": C(lambda: (positions.half_to_interleaved_permutation, [4], {})),
        "positions.permute_qk_rows": C(lambda: (positions.permute_qk_rows, [R(8, 8), 2], dict(to="half"))),
        "positions.apply_rotary_2d": C(lambda: (positions.apply_rotary_2d, [R(1, 4, 8), torch.tensor([0, 0, 1, 1]),
                                                                             torch.tensor([0, 1, 0, 1])], {})),
        # ------------------------------------------------------------------ rope_scaling
        "rope_scaling.linear_inv_freq": C(lambda: (rope_scaling.linear_inv_freq, [positions.rope_inv_freq(8), 2.0],
                                                   {})),
        "rope_scaling.ntk_base": C(lambda: (rope_scaling.ntk_base, [10000.0, 2.0, 8], {})),
        "rope_scaling.yarn_keep": C(lambda: (rope_scaling.yarn_keep, [8, 10000.0, 64], {})),
        "rope_scaling.yarn_inv_freq": C(lambda: (rope_scaling.yarn_inv_freq,
                                                 [positions.rope_inv_freq(8), 2.0, rope_scaling.yarn_keep(8, 1e4, 64)],
                                                 {})),
        "rope_scaling.yarn_attention_scaling": C(lambda: (rope_scaling.yarn_attention_scaling, [2.0], {})),
        "rope_scaling.llama3_inv_freq": C(lambda: (rope_scaling.llama3_inv_freq, [positions.rope_inv_freq(8), 2.0, 64],
                                                   {})),
        "rope_scaling.validate_scaling": C(lambda: (rope_scaling.validate_scaling, [{"kind": "ntk", "factor": 2.0}],
                                                    dict(head_dim=8))),
        # ------------------------------------------------------------------ kv_cache, presets
        "kv_cache.TokenCache": C(lambda: (kv_cache.TokenCache, [2, 4], {})),
        "kv_cache.TokenCache.reset": C(lambda: (kv_cache.TokenCache(2, 4).reset, [], {})),
        "kv_cache.TokenCache.crop": C(lambda: (kv_cache.KVCache(1, 1, 4, 2).crop, [0], {})),
        "kv_cache.KVCache": C(lambda: (kv_cache.KVCache, [1, 2, 4, 3], dict(dtype=torch.float32))),
        "kv_cache.KVCache.update": C(lambda: (kv_cache.KVCache(1, 2, 4, 3).update, [R(1, 2, 2, 3), R(1, 2, 2, 3, seed=1)],
                                              {})),
        "kv_cache.Int8KVCache": C(lambda: (kv_cache.Int8KVCache, [1, 2, 4, 3], {})),
        "kv_cache.Int8KVCache.update": C(lambda: (kv_cache.Int8KVCache(1, 2, 4, 3).update,
                                                  [R(1, 2, 2, 3), R(1, 2, 2, 3, seed=1)], {})),
        "kv_cache.SinkKVCache": C(lambda: (kv_cache.SinkKVCache, [1, 2, 3], dict(window=2, n_sink=1))),
        "kv_cache.SinkKVCache.update": C(lambda: (kv_cache.SinkKVCache(1, 2, 3, window=2, n_sink=1).update,
                                                  [R(1, 2, 2, 3), R(1, 2, 2, 3, seed=1)], {})),
        "kv_cache.SinkKVCache.slot": C(lambda: (kv_cache.SinkKVCache(1, 2, 3, window=2, n_sink=1).slot, [5], {})),
        "kv_cache.SinkKVCache.kept_positions": C(lambda: (kv_cache.SinkKVCache(1, 2, 3, window=2).kept_positions, [],
                                                          {})),
        "kv_cache.SinkKVCache.reset": C(lambda: (kv_cache.SinkKVCache(1, 2, 3, window=2).reset, [], {})),
        "kv_cache.RollingKVCache": C(lambda: (kv_cache.RollingKVCache, [1, 2, 3], dict(window=2))),
        "kv_cache.PagedKVCache": C(lambda: (kv_cache.PagedKVCache, [4, 2, 2, 3], {})),
        "kv_cache.PagedKVCache.blocks_needed": C(lambda: (kv_cache.PagedKVCache(4, 2, 2, 3).blocks_needed, ["a", 3],
                                                          {})),
        "kv_cache.PagedKVCache.append": C(lambda: (kv_cache.PagedKVCache(4, 2, 2, 3).append,
                                                   ["a", R(2, 3, 3), R(2, 3, 3, seed=1)], {}),
                                          valid={"seq_id:str", "seq_id:int"}),
        "kv_cache.PagedKVCache.gather": C(lambda: (paged_with("a").gather, ["a"], {})),
        "kv_cache.PagedKVCache.free": C(lambda: (paged_with("a").free, ["a"], {})),
        "kv_cache.paging_waste": C(lambda: (kv_cache.paging_waste, [[3, 5], 8, 4], {})),
        "kv_cache.quantize_int8": C(lambda: (kv_cache.quantize_int8, [R(2, 3, 4)], {})),
        "kv_cache.dequantize_int8": C(lambda: (kv_cache.dequantize_int8, [*kv_cache.quantize_int8(R(2, 3, 4))], {})),
        "presets.kv_cache_bytes": C(lambda: (presets.kv_cache_bytes, [32, 32, 128], dict(n_tokens=4, batch=2,
                                                                                         bytes_per_value=2))),
        "presets.ModelPreset": C(lambda: (presets.ModelPreset, ["toy", 2, 8, 2, 1, 4, 16, 10, 32, 1000, "MQA"], {})),
        "presets.ModelPreset.values_per_token_layer": C(lambda: (preset().values_per_token_layer, [8], {})),
        "presets.ModelPreset.kv_bytes": C(lambda: (preset().kv_bytes, [4, 2, 2], {})),
        "presets.ModelPreset.weight_bytes": C(lambda: (preset().weight_bytes, [2], {})),
        "presets.get_preset": C(lambda: (presets.get_preset, ["llama-2-7b"], {})),
        "presets.format_bytes": C(lambda: (presets.format_bytes, [524288], {}), valid={"n:0"}),
        # ------------------------------------------------------------------ efficient
        "efficient.default_block_size": C(lambda: (efficient.default_block_size, ["cpu"], {})),
        "efficient.TileKind": C(lambda: (efficient.TileKind, [1], {})),
        "efficient.tile_kind": C(lambda: (efficient.tile_kind, [0, 4, 0, 4, 10, 0], {})),
        "efficient.online_softmax": C(lambda: (efficient.online_softmax, [R(3, 8), 3], {})),
        "efficient.tile_plan": C(lambda: (efficient.tile_plan, [8, 8, 4], dict(is_causal=True))),
        "efficient.flash_attention": C(lambda: (sal.flash_attention, [q, k, v], dict(block_size=2, is_causal=True))),
        "efficient.flash_attention_backward": C(lambda: (efficient.flash_attention_backward, [*flash_saved()], {})),
        "efficient.sliding_window_mask": C(lambda: (efficient.sliding_window_mask, [5, 2], {})),
        "efficient.sliding_window_attention": C(lambda: (efficient.sliding_window_attention, [q4, k4, v4, 2], {})),
        "efficient.elu_feature_map": C(lambda: (efficient.elu_feature_map, [R(2, 3)], {})),
        "efficient.random_feature_map": C(lambda: (efficient.random_feature_map, [R(2, 3, 4), R(6, 4, seed=1)], {})),
        "efficient.linear_attention": C(lambda: (efficient.linear_attention, [q4, k4, v4],
                                                 dict(is_causal=True, chunk_size=2))),
        "efficient.linear_attention_step": C(lambda: (efficient.linear_attention_step,
                                                      [step_state(), R(2, 4), R(2, 4, seed=1), R(2, 3, seed=2)], {})),
        # ------------------------------------------------------------------ pitfalls
        **pitfall_cases(q4, k4, v4),
        # ------------------------------------------------------------------ graphs
        "graphs.gat_attention": C(lambda: (graphs.gat_attention, [R(4, 3), M(4, 4), R(2, 3, seed=1), R(2, seed=2),
                                                                 R(2, seed=3)], {})),
        "graphs.GATLayer": C(lambda: (graphs.GATLayer, [3, 2, 2], {})),
        "graphs.GATLayer.forward": C(lambda: (graphs.GATLayer(3, 2, 2).forward, [R(4, 3), M(4, 4)], {})),
        "graphs.GATLayer.reset_parameters": C(lambda: (graphs.GATLayer(3, 2).reset_parameters, [], {})),
        "graphs.GATLayer.extra_repr": C(lambda: (graphs.GATLayer(3, 2).extra_repr, [], {})),
        # ------------------------------------------------------------------ models
        "models.DecoderConfig": C(lambda: (models.DecoderConfig, [10], dict(d_model=8, n_layers=1, n_heads=2))),
        "models.DecoderConfig.from_dict": C(lambda: (models.DecoderConfig.from_dict,
                                                     [{"vocab_size": 10, "d_model": 8, "n_heads": 2}], {})),
        "models.CharTokenizer": C(lambda: (models.CharTokenizer, ["abc"], {})),
        "models.CharTokenizer.from_text": C(lambda: (models.CharTokenizer.from_text, ["abcab"], {})),
        "models.CharTokenizer.encode": C(lambda: (models.CharTokenizer("abc").encode, ["cab"], {})),
        "models.CharTokenizer.decode": C(lambda: (models.CharTokenizer("abc").decode, [torch.tensor([2, 0, 1])], {}),
                                         ids={"ids": 3}),
        "models.DecoderBlock": C(lambda: (models.DecoderBlock, [small_decoder().config, None], {})),
        "models.DecoderBlock.forward": C(lambda: (small_decoder().blocks[0].forward, [R(1, 3, 8)], {})),
        "models.TinyDecoder": C(lambda: (models.TinyDecoder, [small_decoder().config], {})),
        "models.TinyDecoder.reset_parameters": C(lambda: (small_decoder().reset_parameters, [], {})),
        "models.TinyDecoder.n_params": C(lambda: (small_decoder().n_params, [], {})),
        "models.TinyDecoder.new_caches": C(lambda: (small_decoder().new_caches, [2, 8], {})),
        "models.TinyDecoder.forward": C(lambda: (small_decoder().forward, [ints(10, 2, 5)], dict(need_weights=True)),
                                        ids={"ids": 10}, valid={"ids:list", "ids:rank-"}),
        "models.TinyDecoder.loss": C(lambda: (small_decoder().loss, [ints(10, 2, 5)], {}), ids={"ids": 10},
                                     valid={"ids:list", "ids:rank-"}),
        "models.TinyDecoder.generate": C(lambda: (small_decoder().generate, [ints(10, 1, 3), 2], {}), ids={"ids": 10},
                                         valid={"ids:list", "ids:rank-"}),
        "models.TinyDecoder.complete": C(lambda: (tiny().complete, ["to be", 2], {})),
        "models.to_gqa": C(lambda: (models.to_gqa, [small_decoder(), 1], {})),
        "models.load_tiny_decoder": C(lambda: (models.load_tiny_decoder, [], dict(max_len=64)), mutate=False),
        "models.load_text": C(lambda: (models.load_text, [], {})),
        "models.split_text": C(lambda: (models.split_text, [TEXT, 0.25], {})),
        "models.evaluate": C(lambda: (models.evaluate, [small_decoder(), ints(10, 40), 8, 2], {}), ids={"ids": 10},
                             valid={"ids:list"}),
        # ------------------------------------------------------------------ encoder
        "encoder.model_dir": C(lambda: (encoder.model_dir, [], {})),
        "encoder.BertConfig": C(lambda: (encoder.BertConfig, [20, 8, 2, 2, 16, 16], {})),
        "encoder.BertConfig.from_json": C(lambda: (encoder.BertConfig.from_json, [encoder.model_dir() / "config.json"],
                                                   {}), mutate=False),
        "encoder.BertEmbeddings": C(lambda: (encoder.BertEmbeddings, [bert_cfg()], {})),
        "encoder.BertEmbeddings.forward": C(lambda: (encoder.BertEmbeddings(bert_cfg()).forward, [ints(20, 2, 5)], {}),
                                            ids={"input_ids": 20}),
        "encoder.BertLayer": C(lambda: (encoder.BertLayer, [bert_cfg()], {})),
        "encoder.BertLayer.forward": C(lambda: (encoder.BertLayer(bert_cfg()).forward, [R(2, 5, 8)],
                                                dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)))),
        "encoder.BertEncoder": C(lambda: (encoder.BertEncoder, [bert_cfg()], {})),
        "encoder.BertEncoder.forward": C(lambda: (encoder.BertEncoder(bert_cfg()).forward, [ints(20, 2, 5)],
                                                  dict(need_weights=True)), ids={"input_ids": 20}),
        "encoder.load_bert_weights": C(lambda: (encoder.load_bert_weights,
                                                [encoder.BertEncoder(encoder.BertConfig()),
                                                 encoder.model_dir() / "model.safetensors"], {}), mutate=False),
        "encoder.load_tokenizer": C(lambda: (encoder.load_tokenizer, [], {}), mutate=False),
        "encoder.load_minilm": C(lambda: (encoder.load_minilm, [], {}), mutate=False),
        "encoder.tokenize": C(lambda: (encoder.tokenize, [["the cat", "a dog sat"]], dict(tokenizer=tokenizer()))),
        "encoder.mean_pool": C(lambda: (encoder.mean_pool, [R(2, 3, 4), torch.tensor([[False, False, True]] * 2)], {}),
                               valid={"key_padding_mask:int"}),
        "encoder.sentence_embeddings": C(lambda: (encoder.sentence_embeddings, [["the cat"]],
                                                  dict(model=minilm(), tokenizer=tokenizer()))),
        # ------------------------------------------------------------------ explore
        "explore.AttentionMaps": C(lambda: (explore.AttentionMaps, [["a", "b", "c"], torch.softmax(R(2, 2, 3, 3), -1)],
                                            {})),
        "explore.AttentionMaps.head": C(lambda: (maps().head, [1, 2], {}), index={"layer": 2, "head": 3}),
        "explore.explore": C(lambda: (explore.explore, ["the cat sat"], dict(model=minilm(), tokenizer=tokenizer()))),
        "explore.explore_decoder": C(lambda: (explore.explore_decoder, ["to be"], dict(model=tiny()))),
        "explore.decoder_attention": C(lambda: (explore.decoder_attention, [small_decoder(), ints(10, 1, 4)], {}),
                                       ids={"ids": 10}, valid={"ids:list", "ids:rank-"}),
        "explore.token_index": C(lambda: (explore.token_index, [["a", "b", "a"], "a", 1], {})),
        "explore.token_scores": C(lambda: (explore.token_scores, [maps(), "cat", "the"], {})),
        "explore.previous_token_scores": C(lambda: (explore.previous_token_scores, [torch.softmax(R(2, 3, 4, 4), -1)],
                                                    {})),
        "explore.column_scores": C(lambda: (explore.column_scores, [maps(), "the"], {})),
        # ------------------------------------------------------------------ mla
        "mla.mla_cache_bytes": C(lambda: (mla.mla_cache_bytes, [60, 512, 64], dict(n_tokens=2, batch=1))),
        "mla.mla_decode_bytes": C(lambda: (mla.mla_decode_bytes, [100], dict(
            d_model=32, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
            form="naive"))),
        "mla.mla_weight_values": C(lambda: (mla.mla_weight_values, [], dict(
            d_model=32, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8, form="folded"))),
        "mla.mla_decode_flops": C(lambda: (mla.mla_decode_flops, [1, 100], dict(
            d_model=32, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8))),
        "mla.MLACache": C(lambda: (mla.MLACache, [1, 4, 4, 2], {})),
        "mla.MLACache.update": C(lambda: (mla.MLACache(1, 4, 4, 2).update, [R(1, 2, 4), R(1, 2, 2, seed=1)], {})),
        "mla.MultiHeadLatentAttention": C(lambda: (mla.MultiHeadLatentAttention, [8, 2], dict(
            kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2))),
        "mla.MultiHeadLatentAttention.forward": C(lambda: mla_forward(), valid={"cache:list"}),
        "mla.MultiHeadLatentAttention.new_cache": C(lambda: (mla_layer().new_cache, [1, 4], {})),
        "mla.MultiHeadLatentAttention.queries": C(lambda: (mla_layer().queries, [R(1, 3, 8), torch.arange(3)], {})),
        "mla.MultiHeadLatentAttention.latents": C(lambda: (mla_layer().latents, [R(1, 3, 8), torch.arange(3)], {})),
        "mla.MultiHeadLatentAttention.up_projections": C(lambda: (mla_layer().up_projections, [], {})),
        "mla.MultiHeadLatentAttention.fold_output": C(lambda: (mla_layer().fold_output, [], {})),
        "mla.MultiHeadLatentAttention.extra_repr": C(lambda: (mla_layer().extra_repr, [], {})),
        # ------------------------------------------------------------------ flex
        "flex.causal_mod": C(lambda: (flex.causal_mod, [0, 0, torch.tensor(2), torch.tensor(1)], {}),
                             valid={"b:str", "h:str", "b:int", "h:int"}),
        "flex.sliding_window_mod": C(lambda: (flex.sliding_window_mod, [3], {})),
        "flex.sink_window_mod": C(lambda: (flex.sink_window_mod, [1, 3], {})),
        "flex.document_mod": C(lambda: (flex.document_mod, [torch.tensor([0, 0, 1, 1])], dict(is_causal=True))),
        "flex.alibi_score_mod": C(lambda: (flex.alibi_score_mod, [4], {})),
        "flex.block_mask": C(lambda: (flex.block_mask, [flex.causal_mod, 8], dict(block_size=4))),
        "flex.flex_attention": C(lambda: (flex.flex_attention, [R(1, 2, 8, 4), R(1, 2, 8, 4, seed=1),
                                                                R(1, 2, 8, 4, seed=2)],
                                          dict(block_mask=block_mask_of(8)))),
        "flex.block_counts": C(lambda: (flex.block_counts, [block_mask_of(8)], {})),
        # ------------------------------------------------------------------ streaming
        "streaming.masked_logits": C(lambda: (streaming.masked_logits, [small_decoder(), ints(10, 1, 5), M(5, 5)], {}),
                                     ids={"ids": 10}, valid={"ids:list", "ids:rank-"}),
        "streaming.sink_caches": C(lambda: (streaming.sink_caches, [small_decoder(), 1], dict(window=3, n_sink=1))),
        "streaming.decode_logits": C(lambda: (streaming.decode_logits, [small_decoder(), ints(10, 1, 5),
                                                                        streaming.sink_caches(small_decoder(), 1,
                                                                                              window=3, n_sink=1)], {}),
                                     ids={"ids": 10}, valid={"ids:list", "ids:rank-"}),
        "streaming.window_loss": C(lambda: (streaming.window_loss, [small_decoder(), ints(10, 1, 8)],
                                            dict(window=3, n_sink=1, start=2)), ids={"ids": 10},
                                   valid={"ids:list", "ids:rank-"}),
        "streaming.first_key_attention": C(lambda: (streaming.first_key_attention,
                                                    [torch.softmax(R(1, 2, 4, 4), -1)], dict(start=1))),
        # ------------------------------------------------------------------ recall
        "recall.mqar": C(lambda: (recall.mqar, [2, 16, 3, 16], dict(generator=torch.Generator().manual_seed(0)))),
        "recall.key_range": C(lambda: (recall.key_range, [16], {})),
        "recall.value_range": C(lambda: (recall.value_range, [16], {})),
        "recall.zoology_query_weights": C(lambda: (recall.zoology_query_weights, [5], dict(power_a=0.01))),
        "recall_models.CausalConv": C(lambda: (recall_models.CausalConv, [4], dict(width=4))),
        "recall_models.CausalConv.forward": C(lambda: (recall_models.CausalConv(4, 4).forward, [R(2, 5, 4)], {})),
        "recall_models.gdn_gate": C(lambda: (recall_models.gdn_gate, [R(2, 5, 3), R(3, seed=1), R(3, seed=2)], {})),
        "recall.no_recall_floor": C(lambda: (recall.no_recall_floor, [4, 64], {})),
        "recall.no_recall_loss": C(lambda: (recall.no_recall_loss, [4, 64], {})),
        "recall.no_recall_scores": C(lambda: (recall.no_recall_scores, [*recall.mqar(2, 16, 3, 16), 16], {})),
        "recall.query_retention": C(lambda: (recall.query_retention, [-torch.rand(2, 3, 16), *recall.mqar(2, 16, 3, 16)],
                                             {})),
        "recall.query_distances": C(lambda: (recall.query_distances, [*recall.mqar(2, 16, 3, 16)], {})),
        "recall_models.RecallConfig": C(lambda: (recall_models.RecallConfig, ["delta", 16, 8, 2, 4, 4, 16], {})),
        "recall_models.RecallModel": C(lambda: (recall_models.RecallModel, [recall_model().config], {})),
        "recall_models.RecallModel.forward": C(lambda: (recall_model().forward, [ints(16, 2, 6)], {}), ids={"ids": 16},
                                               valid={"ids:list"}),
        "recall_models.RecallModel.mixer_weights": C(lambda: (recall_model().mixer_weights, [ints(16, 2, 6), 0], {}),
                                                     ids={"ids": 16}, index={"layer": 2}, valid={"ids:list"}),
        "recall_models.count_parameters": C(lambda: (recall_models.count_parameters, [recall_model().config], {})),
        "recall_models.state_bytes": C(lambda: (recall_models.state_bytes, [recall_model().config, "delta", 2], {})),
        "recall_models.recall_accuracy": C(lambda: (recall_models.recall_accuracy,
                                                    [recall_model(), *recall.mqar(4, 16, 3, 16), 2], {}),
                                           ids={"inputs": 16}, valid={"inputs:list", "targets:list"}),
        "recall_models.load_recall_model": C(lambda: (recall_models.load_recall_model,
                                                      [recall_models.recall_runs()[0]["run"]], {}), mutate=False),
        "recall_models.recall_runs": C(lambda: (recall_models.recall_runs, [], {})),
        # ------------------------------------------------------------------ recurrent
        "recurrent.delta_rule": C(lambda: (recurrent.delta_rule, [q4, k4, v4, beta], dict(chunk_size=2))),
        "recurrent.delta_rule_step": C(lambda: (recurrent.delta_rule_step, [R(1, 2, 4, 3), R(1, 2, 4), R(1, 2, 4, seed=1),
                                                                            R(1, 2, 3, seed=2),
                                                                            torch.sigmoid(R(1, 2))], {})),
        "recurrent.delta_rule_weights": C(lambda: (recurrent.delta_rule_weights, [q4, k4, beta], {})),
        "recurrent.linear_attention_weights": C(lambda: (recurrent.linear_attention_weights, [q4, k4], {})),
        "recurrent.selective_scan": C(lambda: (recurrent.selective_scan, [*scan.values()], dict(D=R(3)))),
        "recurrent.selective_scan_step": C(lambda: (recurrent.selective_scan_step,
                                                    [R(1, 3, 2), R(1, 3), R(1, 3, seed=1).abs(), -R(3, 2).abs(),
                                                     R(1, 2, seed=2), R(1, 2, seed=3)], {})),
        "recurrent.selective_scan_weights": C(lambda: (recurrent.selective_scan_weights,
                                                       [scan["delta"], scan["A"], scan["B"], scan["C"]], {})),
        # ------------------------------------------------------------------ triton_attention
        "triton_attention.gpu_limits": C(lambda: (triton_attention.gpu_limits, [fake_props()], {}), mutate=False),
        "triton_attention.matmul_instruction": C(lambda: (triton_attention.matmul_instruction,
                                                          [dict(triton_attention.GPU_LIMITS[80])], {})),
        "triton_attention.expected_instruction": C(lambda: (triton_attention.expected_instruction,
                                                            ["attn_fwd_kernel", dict(triton_attention.FWD_CONFIGS[0]),
                                                             dict(triton_attention.GPU_LIMITS[90])], {})),
        "triton_attention.precision_for": C(lambda: (triton_attention.precision_for,
                                                     [dict(triton_attention.GPU_LIMITS[80]), torch.float32], {})),
        "triton_attention.tma_for": C(lambda: (triton_attention.tma_for,
                                               [dict(triton_attention.GPU_LIMITS[90]), torch.bfloat16, 64], {})),
        "triton_attention.smem_estimate": C(lambda: (triton_attention.smem_estimate,
                                                     ["attn_fwd_kernel", dict(triton_attention.FWD_CONFIGS[0]),
                                                      torch.bfloat16, 64], {})),
        "triton_attention.config_fits": C(lambda: (triton_attention.config_fits,
                                                   ["attn_fwd_kernel", dict(triton_attention.FWD_CONFIGS[0]),
                                                    dict(triton_attention.GPU_LIMITS[86]), torch.float16, 64], {})),
        "triton_attention.kept_configs": C(lambda: (triton_attention.kept_configs,
                                                    ["attn_bwd_dkdv_kernel", dict(triton_attention.GPU_LIMITS[75]),
                                                     torch.float16, 128], {})),
        "triton_attention.dq_methods_for": C(lambda: (triton_attention.dq_methods_for,
                                                      [dict(triton_attention.GPU_LIMITS[90]), torch.bfloat16, 128],
                                                      {})),
        "triton_attention.available": C(lambda: (triton_attention.available, [], {})),
        "triton_attention.interpreting": C(lambda: (triton_attention.interpreting, [], {})),
        "triton_attention.best_device": C(lambda: (triton_attention.best_device, [], {})),
        "triton_attention.key_block_bounds": C(lambda: (triton_attention.key_block_bounds, [16, 16, 16, 64, True], {}),
                                               valid={"q0:0"}),
        "triton_attention.key_blocks_visited": C(lambda: (triton_attention.key_blocks_visited, [16, 16, 16, 64, True],
                                                          {}), valid={"q0:0"}),
        "triton_attention.query_block_bounds": C(lambda: (triton_attention.query_block_bounds, [16, 16, 16, 64, True],
                                                          {}), valid={"k0:0"}),
        "triton_attention.program_grid": C(lambda: (triton_attention.program_grid, [1, 2, 64, 16], {})),
        "triton_attention.launch_grid": C(lambda: (triton_attention.launch_grid, [1, 2, 64, 16], {})),
        "triton_attention.hbm_bytes": C(lambda: (triton_attention.hbm_bytes, [64, 64, 16, 16, 16], dict(is_causal=True))),
        "triton_attention.program_work": C(lambda: (triton_attention.program_work, [16, 16, 16, 64],
                                                    dict(is_causal=True, q0=16)), valid={"q0:0"}),
        "triton_attention.tma_supported": C(lambda: (triton_attention.tma_supported, [R(1, 1, 16, 16)], {})),
        "triton_attention.tma_by_default": C(lambda: (triton_attention.tma_by_default, [R(1, 1, 16, 16)], {})),
        "triton_attention.dq_method_timings": C(lambda: (triton_attention.dq_method_timings, [], {})),
        "triton_attention.forward": C(lambda: (triton_attention.forward, [R(1, 1, 16, 16), R(1, 1, 16, 16, seed=1),
                                                                          R(1, 1, 16, 16, seed=2)],
                                               dict(block_m=16, block_n=16)), mutate=False),
        "triton_attention.backward": C(lambda: (triton_attention.backward, [*triton_saved()],
                                                dict(block_m=16, block_n=16)), mutate=False),
        "triton_attention.flash_attention": C(lambda: (triton_attention.flash_attention,
                                                       [R(1, 1, 16, 16), R(1, 1, 16, 16, seed=1),
                                                        R(1, 1, 16, 16, seed=2)], {}), mutate=False),
        # ------------------------------------------------------------------ distributed
        "distributed.sharding.split_sizes": C(lambda: (sharding.split_sizes, [10, 4], {})),
        "distributed.sharding.shard_segments": C(lambda: (sharding.shard_segments, [8, 1, 2], dict(layout="zigzag")),
                                                 index={"rank": 2}),
        "distributed.sharding.shard_indices": C(lambda: (sharding.shard_indices, [8, 1, 2], {}), index={"rank": 2}),
        "distributed.sharding.shard_lengths": C(lambda: (sharding.shard_lengths, [9, 2], {})),
        "distributed.sharding.shard": C(lambda: (sharding.shard, [R(1, 2, 8, 3), 1, 2], dict(layout="zigzag")),
                                        index={"rank": 2, "dim": 4}, valid={"x:int", "x:float64"}),
        "distributed.sharding.unshard": C(lambda: (sharding.unshard, [[R(1, 4, 3), R(1, 4, 3, seed=1)]], {}),
                                          index={"dim": 3}),
        "distributed.sharding.check_layout": C(lambda: (sharding.check_layout, ["zigzag"], {})),
        "distributed.comm.Counters": C(lambda: (comm.Counters, [], {})),
        "distributed.comm.Counters.add": C(lambda: (comm.Counters().add, ["kv", 64], {})),
        "distributed.comm.Counters.hold": C(lambda: (comm.Counters().hold, [R(2, 3), R(3)], {}),
                                            valid={"tensors[0]:int", "tensors[0]:float64", "tensors[0]:rank-",
                                                   "tensors[0]:rank+", "tensors[0]:size", "tensors[0]:empty",
                                                   "tensors[1]:int", "tensors[1]:float64", "tensors[1]:rank-",
                                                   "tensors[1]:rank+", "tensors[1]:size"}),
        "distributed.comm.Counters.snapshot": C(lambda: (comm.Counters().snapshot, [], {})),
        "distributed.comm.reset_counters": C(lambda: (comm.reset_counters, [], {})),
        "distributed.comm.exchange": C(lambda: (comm.exchange, [[], [], "kv", None], {})),
        "distributed.comm.wait_all": C(lambda: (comm.wait_all, [[]], {})),
        "distributed.comm.group_rank_size": C(lambda: (comm.group_rank_size, [None], {})),
        "distributed.comm.exchange_shapes": C(lambda: (comm.exchange_shapes, [q4, k4, v4, "contiguous", False, None,
                                                                              "test", None], {})),
        "distributed.comm.check_floats": C(lambda: (comm.check_floats, [q4, k4, v4, "test"], {})),
        "distributed.ring.block_attention": C(lambda: (ring.block_attention, [q4, k4, v4], dict(scale=0.5))),
        "distributed.ring.block_attention_backward": C(lambda: (ring.block_attention_backward,
                                                                [q4, k4, v4, R(1, 2, 5), R(1, 2, 5, seed=2), R(1, 2, 5, 3, seed=3)],
                                                                dict(scale=0.5))),
        "distributed.ring.merge_partials": C(lambda: (ring.merge_partials,
                                                      [*ring.block_attention(q4, k4, v4, scale=0.5),
                                                       *ring.block_attention(q4, R(1, 2, 3, 4), R(1, 2, 3, 3),
                                                                             scale=0.5)], {})),
        "distributed.ring.ring_attention": C(lambda: (ring.ring_attention, [q4, k4, v4], dict(is_causal=True))),
        "distributed.ring.ring_tiles": C(lambda: (lambda *a, **kw: list(ring.ring_tiles(*a, **kw)),
                                                  [[(0, 4)], [(0, 4)]], dict(is_causal=True))),
        "distributed.ulysses.ulysses_attention": C(lambda: (ulysses.ulysses_attention, [q4, k4, v4],
                                                            dict(is_causal=True))),
        "distributed.ulysses.kv_replication": C(lambda: (ulysses.kv_replication, [8, 2, 4], {})),
        "distributed.cost.ring_bytes_per_rank": C(lambda: (cost.ring_bytes_per_rank, [16, 2], dict(head_dim=4))),
        "distributed.cost.ring_kv_held_bytes": C(lambda: (cost.ring_kv_held_bytes, [16, 2], dict(head_dim=4))),
        "distributed.cost.ulysses_bytes_per_rank": C(lambda: (cost.ulysses_bytes_per_rank, [16, 2],
                                                              dict(heads=4, head_dim=4))),
        "distributed.cost.causal_work": C(lambda: (cost.causal_work, [16, 2], dict(layout="zigzag"))),
        "distributed.cost.ring_schedule": C(lambda: (cost.ring_schedule, [3], {})),
        "distributed.cost.max_sequence_length": C(lambda: (cost.max_sequence_length, [8, 80.0],
                                                           dict(d_model=4096, n_layers=32, n_heads=32, ffn_dim=14336))),
        "distributed.cost.activation_values_per_token": C(lambda: (cost.activation_values_per_token, [],
                                                                   dict(d_model=4096, n_heads=32, n_kv_heads=8,
                                                                        ffn_dim=14336))),
        "distributed.launch.device": C(lambda: (launch.device, [], {})),
        "distributed.launch.choose_backend": C(lambda: (launch.choose_backend, [2], {})),
        "distributed.launch.free_port": C(lambda: (launch.free_port, [], {})),
        "distributed.launch.under_torchrun": C(lambda: (launch.under_torchrun, [], {})),
        "distributed.launch.attention_worker": C(lambda: (launch.attention_worker, [[]], {})),
    }


def paged_with(seq_id):
    cache = kv_cache.PagedKVCache(4, 2, 2, 3)
    cache.append(seq_id, R(2, 3, 3), R(2, 3, 3, seed=1))
    return cache


def step_state():
    _, state = efficient.linear_attention_step(None, R(2, 4), R(2, 4, seed=1), R(2, 3, seed=2))
    return state


def mla_forward():
    layer = mla_layer()
    return layer.forward, [R(1, 3, 8)], dict(cache=layer.new_cache(1, 4), absorbed=True)


def pitfall_cases(q, k, v) -> dict[str, Case]:
    """The pitfalls: broken and fixed functions on one problem; the demos take no input."""
    out = {}
    for name in ("fixed_attention", "broken_no_scale", "broken_softmax_dim"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [q, k, v], {}))
    for name in ("broken_masked_softmax", "fixed_masked_softmax"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [R(3, 4), M(3, 4)], {}))
    for name in ("broken_fp16_scores", "fixed_fp16_scores"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [q.half(), k.half()], {}))
    for name in ("broken_merge_heads_view", "broken_merge_heads_no_transpose", "fixed_merge_heads"):
        # one head: .view after .transpose works (the pitfall needs h > 1), so there is a valid call
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [R(2, 1, 3, 4)], {}))
    for name in ("broken_decode_is_causal", "fixed_decode_bottom_right"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [R(1, 2, 1, 4), k, v], {}))
    for name in ("broken_expand_kv", "fixed_expand_kv"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [R(1, 2, 5, 4), 4], {}))
    for name in ("BrokenDropoutAttention", "FixedDropoutAttention"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [0.5], {}))
        out[f"pitfalls.{name}.forward"] = C(lambda name=name: (getattr(pitfalls, name)(0.5).eval().forward, [q, k, v], {}))
    for name in ("BrokenMaskedAttention", "FixedMaskedAttention"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [8, 16], {}))
        out[f"pitfalls.{name}.forward"] = C(lambda name=name: (getattr(pitfalls, name)(8, 16).forward, [R(2, 5, 8)], {}))
    out["pitfalls.pitfall_weights"] = C(lambda: (pitfalls.pitfall_weights, [next(iter(pitfalls.HEATMAP_PITFALLS)), True], {}))
    out["pitfalls.demo_missing_scale"] = C(lambda: (pitfalls.demo_missing_scale, [64], {}))
    out["pitfalls.demo_mask_device"] = C(lambda: (pitfalls.demo_mask_device, ["meta"], {}))
    for name in ("demo_softmax_dim", "demo_mask_polarity", "demo_fully_masked_row", "demo_fp16_overflow",
                 "demo_view_after_transpose", "demo_dropout_in_eval", "demo_is_causal_with_cache", "demo_rope_offset",
                 "demo_rope_pairing", "demo_gqa_repeat", "demo_batch_first", "demo_weights_not_explanations"):
        out[f"pitfalls.{name}"] = C(lambda name=name: (getattr(pitfalls, name), [], {}))
    out["pitfall_registry.Demo"] = C(lambda: (pitfall_registry.Demo, [{}, True, True], {}))
    out["pitfall_registry.Pitfall"] = C(lambda: (pitfall_registry.Pitfall, ["x", "X", "09", "s", lambda: None], {}))
    out["pitfall_registry.pitfall"] = C(lambda: (pitfall_registry.pitfall, ["x", "X", "09", "s"], {}))
    out["pitfall_registry.run_all"] = C(lambda: (pitfall_registry.run_all, [], {}))
    return out


NOT_FUZZED = {
    "triton_attention.device_limits": "reads the CUDA device's properties (or compile_only's architecture): "
                                      "no argument but an optional device, which torch checks",
    **{f"triton_kernels.{name}": "a @triton.jit kernel: it runs only inside a launch, on checked arguments"
       for name in ("dot", "load_rows", "load_block", "store_block", "attn_fwd_inner", "attn_fwd_kernel",
                    "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_inner", "attn_bwd_dkdv_kernel", "attn_bwd_dq_inner",
                    "attn_bwd_dq_kernel")},
    "pitfall_registry.Weights": "a type alias, not a function",
    "kv_cache.SinkKVCache.crop": "refuses every call (a cache that evicts cannot roll back): no valid call to derive from",
    "distributed.ring.RingTile": "a NamedTuple record that ring_tiles fills in; it holds what it is given",
    "distributed.launch.launch": "spawns processes (seconds a call); its argument checks are tested in test_distributed",
    "triton_attention.FlashAttentionFunction": "an autograd.Function: called through flash_attention, which checks",
    "triton_attention.FlashAttentionFunction.forward": "autograd's: called by FlashAttentionFunction.apply",
    "triton_attention.FlashAttentionFunction.backward": "autograd's: called by autograd with its own gradients",
}
