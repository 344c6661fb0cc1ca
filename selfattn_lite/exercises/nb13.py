"""Checkers for notebook 13: the batch from which an MLA decode step reads more cache than weights, the
absorbed MLA decode step, StreamingLLM's positions inside a sink cache, and FlexAttention mask_mods (a prefix
LM; packed documents under a sliding window) and a score_mod."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from .. import flex
from ..mla import MultiHeadLatentAttention, mla_decode_flops, mla_weight_values
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_crossover_batch", "check_absorbed_decode", "check_cache_positions", "check_doc_window_mod",
           "check_prefix_lm_mask_mod", "check_softcap_score_mod"]


# layers whose widths all differ, and a cache length for each: the second is an exact tie (14 sequences'
# cache holds as many values as the weights), the third reads more cache than weights at batch 1, the last
# is DeepSeek-V2's attention layer
_CROSSOVER_CASES = (
    (dict(d_model=40, n_heads=5, kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=7,
          q_lora_rank=9), 9),
    (dict(d_model=24, n_heads=3, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=7), 10),
    (dict(d_model=30, n_heads=2, kv_lora_rank=14, qk_nope_head_dim=3, qk_rope_head_dim=6, v_head_dim=11,
          q_lora_rank=5), 100),
    (dict(d_model=5120, n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
          q_lora_rank=1536), 2048),
)


def _crossover_layer(shape: dict) -> MultiHeadLatentAttention:
    """The layer of one case; DeepSeek-V2's on the meta device (shapes, no memory)."""
    if shape["d_model"] > 1000:
        with torch.device("meta"):
            return MultiHeadLatentAttention(**shape)
    torch.manual_seed(0)
    return MultiHeadLatentAttention(**shape)


def _crossover_variants(layer, n_tokens: int) -> dict:
    """The right batch and the batch each classic mistake gives, for one layer and cache length."""
    weights = sum(p.numel() for p in layer.parameters())
    per_token = layer.kv_lora_rank + layer.qk_rope_head_dim
    cache = n_tokens * per_token
    differing = sum(mla_weight_values(d_model=layer.d_model, n_heads=layer.n_heads, kv_lora_rank=layer.kv_lora_rank,
                                      qk_nope_head_dim=layer.qk_nope_head_dim, v_head_dim=layer.v_head_dim).values())
    expanded = n_tokens * layer.n_heads * (layer.qk_nope_head_dim + layer.qk_rope_head_dim + layer.v_head_dim)
    itemsize = 4                                         # the small layers are float32 (meta: float32 too)
    return {
        "right": weights // cache + 1,
        "tie": -(-weights // cache),                     # ceil: B * cache >= weights
        "short": weights // cache,                       # the last batch at which the weights still dominate
        "no_rope": weights // (n_tokens * layer.kv_lora_rank) + 1,
        "twice": weights // (2 * cache) + 1,
        "differing": differing // cache + 1,
        "expanded": weights // expanded + 1,
        "bytes_weights": weights * itemsize // cache + 1,
        "bytes_cache": weights // (cache * itemsize) + 1,
    }


_CROSSOVER_MESSAGES = {
    "tie": "{tie} sequences' cache holds exactly as many values as the weights: equal is not more; the smallest B "
           "with B x cache > weights is one larger",
    "short": "at a batch of {short} the weights still weigh at least as much as the cache; the answer is the first "
             "batch at which the cache weighs more: one larger",
    "no_rope": "the decoupled RoPE key is cached too: a token costs kv_lora_rank + qk_rope_head_dim values",
    "twice": "there is no separate K and V to count twice: the latent c_KV is cached once, and keys and values "
             "are both computed from it",
    "differing": "only W^UK, W^UV and W^O counted (the weights the forms differ in, the table's column); a step "
                 "reads every weight of the layer, the query and latent projections too: sum over "
                 "layer.parameters()",
    "expanded": "that counts the naive form's expanded keys and values per token; the cache holds the latent and "
                "the RoPE key, kv_lora_rank + qk_rope_head_dim values",
    "bytes_weights": "the weights are counted in bytes and the cache in values (or the other way round): compare "
                     "like with like; with one dtype the bytes per value cancel",
    "bytes_cache": "the cache is counted in bytes and the weights in values: compare like with like; with one "
                   "dtype the bytes per value cancel",
}


def check_crossover_batch(fn) -> None:
    """``fn(layer, n_tokens) -> int``: the smallest batch B at which one absorbed decode step of ``layer`` (a
    ``MultiHeadLatentAttention``) reads more cache than weights, B sequences of ``n_tokens`` cached tokens each.

    One step reads every weight once (sum of ``layer.parameters()``), and each sequence's cache once,
    n_tokens x (kv_lora_rank + qk_rope_head_dim) values: B = weights // cache + 1.
    Checked on layers with and without a query latent, an exact tie, a batch of 1, and DeepSeek-V2's shapes.
    """
    try:
        attempt(fn, _crossover_layer(_CROSSOVER_CASES[0][0]), _CROSSOVER_CASES[0][1])
    except NotAttempted:
        return not_attempted("crossover_batch")
    for shape, n_tokens in _CROSSOVER_CASES:
        layer = _crossover_layer(shape)
        got = attempt(fn, layer, n_tokens)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, float) and not got.is_integer():
            raise ExerciseError(f"crossover_batch returned {got}: a batch is a whole number of sequences, the "
                                "smallest B with B x cache > weights")
        if not isinstance(got, int | float):
            raise ExerciseError(f"crossover_batch should return an int, got {type(got).__name__}")
        options = _crossover_variants(layer, n_tokens)
        if got == options["right"]:
            continue
        where = (f"d_model={shape['d_model']}, n_heads={shape['n_heads']}, kv_lora_rank={shape['kv_lora_rank']}, "
                 f"n_tokens={n_tokens}")
        for name, message in _CROSSOVER_MESSAGES.items():
            if got == options[name]:
                raise ExerciseError(f"{where}: {message.format(**options)}")
        raise ExerciseError(f"{where}: the smallest batch is {options['right']}, got {got}")
    shape, n_tokens = _CROSSOVER_CASES[-1]
    layer = _crossover_layer(shape)
    weights = sum(p.numel() for p in layer.parameters())
    cache = n_tokens * (layer.kv_lora_rank + layer.qk_rope_head_dim)
    intensity = layer.n_heads * (2 * layer.kv_lora_rank + layer.qk_rope_head_dim) / (
        layer.kv_lora_rank + layer.qk_rope_head_dim)                        # FLOP per cached byte, bf16
    batch = weights // cache + 1
    # DeepSeek-V2's MoE layer (config.json: 160 routed and 2 shared experts of 3 x 5120 x 1536, 6 routed a token;
    # the router, transformers' DeepseekV2TopkRouter, holds one 5120-wide row per routed expert, no bias)
    experts = 162 * 3 * shape["d_model"] * 1536
    router = 160 * shape["d_model"]
    untouched = 160 * (1 - 6 / 160) ** batch                # expected, were the tokens routed uniformly at random
    return passed(f"weights are read once per step, the cache once per sequence: DeepSeek-V2's attention layer "
                  f"({weights / 1e6:.1f}M weights) at {n_tokens:,} cached tokens ({cache / 1e6:.2f}M values per "
                  f"sequence) reads more cache than weights from batch {batch} on; at batch 1 the "
                  f"weights are {weights / (weights + cache):.0%} of what it reads. Past that batch the bytes are "
                  f"mostly cache, which absorbed attention reads at n_h (2 d_c + d_h^R) / (d_c + d_h^R) = "
                  f"{intensity:.0f} FLOP/byte in bf16, above an H200's ridge point at any batch (section 1). "
                  f"That is the attention layer alone: each of DeepSeek-V2's MoE layers holds {experts / 1e9:.1f}G "
                  f"expert weights ({experts / weights:.0f} times the attention layer's), and {batch} tokens, 6 "
                  f"routed experts each, routed at random would leave about {untouched:.0f} "
                  f"of the 160 untouched: with every expert and the router read, a layer's cache outweighs its "
                  f"weights only from batch {(weights + router + experts) // cache + 1:,} on")


_DECODE_SHAPES = dict(d_model=24, n_heads=3, kv_lora_rank=16, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5)


def _decode_case():
    """One new token over S = 10 cached latents of a small float64 MLA layer (every width differs)."""
    torch.manual_seed(13)
    shapes = {k: v for k, v in _DECODE_SHAPES.items() if k != "d_model"}
    layer = MultiHeadLatentAttention(_DECODE_SHAPES["d_model"], **shapes).double().eval()
    x = torch.randn(2, 11, layer.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(13)) * 2
    positions = torch.arange(11)
    with torch.no_grad():
        c_kv, k_rope = layer.latents(x, positions)                       # (B, S, d_c), (B, S, rope)
        q_nope, q_rope = layer.queries(x[:, -1:], positions[-1:])        # (B, h, 1, nope), (B, h, 1, rope)
        naive = layer(x)[:, -1:]                                         # (B, 1, d): the naive form's last row
    w_uk, w_uv = (w.detach() for w in layer.up_projections())
    return layer, (q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, layer.o_proj.weight.detach(), layer.scale), naive


def check_absorbed_decode(fn) -> None:
    """``fn(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale) -> (B, 1, d)``: one absorbed MLA decode step.

    Args (as the layer computes them): q_nope (B, h, 1, nope), q_rope (B, h, 1, rope) (rotated),
    c_kv (B, S, d_c), k_rope (B, S, rope), w_uk (h, nope, d_c), w_uv (h, v, d_c), w_o (d, h v), scale.

    Checked against the naive form (the layer run with its latents expanded), and its FLOPs (counted by
    ``torch.utils.flop_counter``) against the absorbed form's (``mla_decode_flops``): an answer that expands
    the latents or folds W^O W^UV gives the right numbers at the wrong price.
    """
    layer, args, naive = _decode_case()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            got = attempt(fn, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    except NotAttempted:
        return not_attempted("absorbed_decode")
    except RuntimeError as error:
        raise ExerciseError(f"torch refused the shapes ({str(error).splitlines()[0]}): a matrix is contracted "
                            "over the wrong axis. w_uk is (h, nope, d_c): q^C meets it over nope; w_uv is "
                            "(h, v, d_c): each head's d_c-wide output meets it over d_c; w_o is (d, h v), as "
                            "nn.Linear's weight") from None
    q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale = args
    B, h, _, _ = q_nope.shape
    d, d_c = w_o.shape[0], c_kv.shape[-1]
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, h, 1, d_c):
        raise ExerciseError("that is the attention over the latents, still one d_c-wide output per head: apply each "
                            "head's W^UV_i (h, v, d_c) to it, then W^O")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, 1, h * w_uv.shape[1]):
        raise ExerciseError("W^UV is applied (h v wide): now W^O, o @ w_o.T, gives the d_model-wide output")
    got = require_tensor("absorbed_decode(...)", got, (B, 1, d)).to(torch.float64)
    if not close(got, naive, atol=1e-9, rtol=1e-9):
        _diagnose_decode(fn, args, got)
    flops = counter.get_total_flops()
    shapes = dict(_DECODE_SHAPES)
    want = B * mla_decode_flops(1, c_kv.shape[1], **shapes, form="absorbed")       # B sequences
    expanded = B * mla_decode_flops(1, c_kv.shape[1], **shapes, form="naive")
    d, h, v, d_c = shapes["d_model"], shapes["n_heads"], shapes["v_head_dim"], shapes["kv_lora_rank"]
    folded = B * mla_decode_flops(1, c_kv.shape[1], **shapes, form="folded") + 2 * d * h * v * d_c   # + the fold
    if flops >= 1.5 * want:
        how = ("the latents were expanded into per-head keys and values (the naive form)"
               if abs(flops - expanded) <= abs(flops - folded) else
               "W^O W^UV was folded inside the step (one d x d_c matrix per head, more weights than W^UV and W^O)")
        raise ExerciseError(f"the numbers are right, but the step did {flops} FLOPs where the absorbed form needs "
                            f"{want}: {how}. Absorbing means W^UK into the query, attention over c_kv itself, W^UV "
                            "per head on the d_c-wide output, then W^O")
    return passed("W^UK_i^T q^C_i scores the latents, the attention output stays d_c wide until W^UV_i and W^O: "
                  f"equal to the naive form, at {flops} FLOPs counted in your step (the absorbed form's count: "
                  f"{want}; the naive form's: {expanded})")


def _diagnose_decode(fn, args, got) -> None:
    """Name the mistake of an absorbed decode step whose output differs from the naive form's."""
    q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, scale = args

    def step(q_latent, rope_scores, scale, w_uv_heads):
        scores = (q_latent @ c_kv[:, None].transpose(-2, -1) + rope_scores) * scale       # (B, h, 1, S)
        o_latent = scores.softmax(-1) @ c_kv[:, None]                                      # (B, h, 1, d_c)
        o = torch.einsum("bhlc,hvc->blhv", o_latent, w_uv_heads)
        return o.reshape(o.shape[0], 1, -1) @ w_o.T

    q_latent = torch.einsum("bhln,hnc->bhlc", q_nope, w_uk)
    rope_scores = q_rope @ k_rope[:, None].transpose(-2, -1)
    nope, rope, d_c = q_nope.shape[-1], q_rope.shape[-1], c_kv.shape[-1]
    for wrong_scale in ((d_c + rope) ** -0.5, d_c ** -0.5, nope ** -0.5, 1.0):
        if close(got, step(q_latent, rope_scores, wrong_scale, w_uv), atol=1e-9, rtol=1e-9):
            raise ExerciseError(f"the scale is off: the scores are still q^C . k^C + q^R . k^R of the naive form, "
                                f"scaled by 1/sqrt(nope + rope) = {scale:.4f} (the layer's scale), whatever the "
                                "latent's width")
    if close(got, step(q_latent, 0.0, scale, w_uv), atol=1e-9, rtol=1e-9):
        raise ExerciseError("the RoPE part is missing: every score adds q^R_i . k^R_j (the decoupled key, cached "
                            "beside the latent) to (W^UK_i^T q^C_i) . c_j")
    if close(got, step(torch.einsum("bhln,nc->bhlc", q_nope, w_uk[0]), rope_scores, scale, w_uv), atol=1e-9,
             rtol=1e-9) or close(got, step(q_latent, rope_scores, scale, w_uv[:1].expand_as(w_uv)), atol=1e-9,
                                 rtol=1e-9):
        raise ExerciseError("one head's up-projection served every head: head i's query meets W^UK_i, and head i's "
                            "latent output goes through its own W^UV_i")
    raise ExerciseError("the output differs from the naive form's; per head i: q_latent = W^UK_i^T q^C_i; scores "
                        "(q_latent . c_j + q^R_i . k^R_j) x scale, softmax over the S cached tokens; o_latent = "
                        "sum_j p_j c_j; o_i = W^UV_i o_latent; y = W^O [o_1 ; ... ; o_h]")


# ---------------------------------------------------------------------------------------------
# FlexAttention: a mask_mod and a score_mod for a given pattern, checked against the dense forms
# ---------------------------------------------------------------------------------------------

def _dense(mask_mod, T: int) -> torch.Tensor:
    """The (T, T) boolean mask a mask_mod gives, evaluated as create_block_mask does (every pair, vmapped)."""
    from torch.nn.attention.flex_attention import create_mask

    return create_mask(mask_mod, 1, 1, T, T, device="cpu")[0, 0]


def _flex_error(error: Exception, what: str) -> ExerciseError:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "data-dependent" in text.lower() or "Boolean value of Tensor" in text:
        return ExerciseError(f"your {what} used Python's `and`, `or`, `not` or `if` on tensors ({text}): FlexAttention "
                             "calls it on tensors (vmapped over every pair), so combine conditions with `&`, `|`, `~` "
                             "and choose values with torch.where")
    return ExerciseError(f"calling your {what} failed: {text}")


def check_prefix_lm_mask_mod(make_mod) -> None:
    """``make_mod(prefix) -> mask_mod(b, h, q_idx, kv_idx)``: a prefix LM's mask.

    The first ``prefix`` tokens (a prompt) see each other both ways; every later token sees all tokens up
    to itself (causal). Dense: (kv <= q) | (kv < prefix). Checked pair by pair, then through
    ``flex_attention`` with the block mask against attention under the dense mask.
    """
    T, prefix = 40, 13
    try:
        mod = attempt(make_mod, prefix)
        if mod is None or not callable(mod):
            raise ExerciseError(f"prefix_lm_mod({prefix}) should return a function (b, h, q_idx, kv_idx) -> bool "
                                f"tensor, got {type(mod).__name__}")
        got = _dense(mod, T)
    except NotAttempted:
        return not_attempted("prefix_lm_mod")
    except ExerciseError:
        raise
    except Exception as error:  # noqa: BLE001 - a learner's mask_mod can fail in many ways
        raise _flex_error(error, "mask_mod") from None
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    want = (j <= i) | (j < prefix)
    if got.dtype != torch.bool or got.shape != want.shape:
        raise ExerciseError(f"a mask_mod returns a boolean (True = may attend); yours gave {got.dtype} "
                            f"{tuple(got.shape)}")
    if torch.equal(got, want):
        block = flex.block_mask(mod, T, block_size=8)
        gen = torch.Generator().manual_seed(13)
        q, k, v = (torch.randn(1, 2, T, 8, generator=gen, dtype=torch.float64) for _ in range(3))
        out = flex.flex_attention(q, k, v, block_mask=block)
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=want)
        if not close(out, reference, atol=1e-9):
            raise ExerciseError("the mask is right pair by pair but flex_attention disagrees with the dense mask: "
                                "does your mask_mod depend on b or h?")
        n = flex.block_counts(block)
        return passed(f"(kv <= q) | (kv < prefix): the prompt sees itself both ways, the rest causally; equal to "
                      f"the dense mask through flex_attention, {n['skipped']} of {n['total']} tiles of 8 x 8 skipped")
    causal = j <= i
    if torch.equal(got, causal):
        raise ExerciseError(f"that is plain causal attention: the first {prefix} tokens must also see the later "
                            "prefix tokens (kv_idx < prefix), both ways")
    if torch.equal(got, want & (j != i)) or torch.equal(got, (j < i) | (j < prefix)):
        raise ExerciseError("the diagonal is missing: a token may attend to itself (kv_idx <= q_idx)")
    if torch.equal(got, causal | (i < prefix)):
        raise ExerciseError("a prefix query now sees every key, the answer tokens after the prompt too: it is the key "
                            "that must lie in the prefix (kv_idx < prefix), not the query")
    if torch.equal(got, causal | (j <= prefix)) or torch.equal(got, causal | (j < prefix - 1)):
        raise ExerciseError(f"off by one: the prefix is positions 0 .. {prefix - 1} (kv_idx < prefix)")
    wrong = (got != want).nonzero()[0].tolist()
    raise ExerciseError(f"pair (q={wrong[0]}, kv={wrong[1]}) with prefix {prefix}: expected "
                        f"{bool(want[wrong[0], wrong[1]])}, got {bool(got[wrong[0], wrong[1]])}")


def check_softcap_score_mod(make_mod) -> None:
    """``make_mod(cap) -> score_mod(score, b, h, q_idx, kv_idx)``: Gemma 2's attention logit soft-capping.

    Each scaled score s becomes cap * tanh(s / cap): unchanged near 0, squeezed into (-cap, cap) smoothly.
    Checked through ``flex_attention`` (causal block mask) against the dense computation: scores, capped,
    masked, softmax, times v.
    """
    T, cap = 24, 5.0
    gen = torch.Generator().manual_seed(31)
    q, k, v = (torch.randn(1, 2, T, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    q = q * 4                                                            # scores up to ~20: the cap matters
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5                          # (1, 2, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def dense(s):
        return s.masked_fill(~causal, float("-inf")).softmax(-1) @ v

    try:
        mod = attempt(make_mod, cap)
        if mod is None or not callable(mod):
            raise ExerciseError(f"softcap_mod({cap}) should return a function (score, b, h, q_idx, kv_idx) -> score, "
                                f"got {type(mod).__name__}")
        out = flex.flex_attention(q, k, v, score_mod=mod, block_mask=flex.block_mask(flex.causal_mod, T))
    except NotAttempted:
        return not_attempted("softcap_mod")
    except ExerciseError:
        raise
    except Exception as error:  # noqa: BLE001 - a learner's score_mod can fail in many ways
        raise _flex_error(error, "score_mod") from None
    want = dense(cap * torch.tanh(scores / cap))
    if close(out, want, atol=1e-9):
        return passed("cap * tanh(score / cap): scores near 0 unchanged, large ones squeezed below the cap; equal to "
                      "the dense computation through flex_attention")
    for wrong, message in (
        (scores, "the scores came back unchanged: return cap * tanh(score / cap)"),
        (cap * torch.tanh(scores), "divide by cap inside the tanh: cap * tanh(score) squashes every score, even "
                                   "small ones (tanh saturates near 1)"),
        (torch.tanh(scores / cap), "multiply by cap outside the tanh: tanh(score / cap) lies in (-1, 1), not "
                                   "(-cap, cap)"),
        (scores.clamp(-cap, cap), "a hard clamp cuts the scores at the cap, and its gradient is zero past it: the "
                                  "soft cap is cap * tanh(score / cap)"),
    ):
        if close(out, dense(wrong), atol=1e-9):
            raise ExerciseError(message)
    raise ExerciseError("the output differs from the dense computation with scores cap * tanh(score / cap)")


def check_cache_positions(fn) -> None:
    """``fn(kept (n_kept,), n_sink) -> (n_kept,)``: StreamingLLM's position for each slot of a sink cache.

    ``kept`` is ``SinkKVCache.kept_positions()``: the original position each slot holds, in slot order. The
    sinks keep 0 .. n_sink-1; the window's keys get n_sink, n_sink + 1, ... from the oldest to the newest,
    whatever slot the ring put them in.
    """
    from ..kv_cache import SinkKVCache

    try:
        attempt(fn, torch.tensor([0, 1, 2]), 1)
    except NotAttempted:
        return not_attempted("cache_positions")

    def want(kept, s):
        return torch.cat([kept[:s], s + kept[s:].argsort().argsort()])

    for n_tokens, s, w in ((10, 2, 4), (9, 0, 5), (7, 2, 4), (15, 3, 5), (4, 2, 4), (23, 1, 6)):
        cache = SinkKVCache(1, 1, 1, window=w, n_sink=s)
        for _ in range(n_tokens):
            cache.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
        kept = cache.kept_positions()
        got = require_tensor(f"cache_positions({kept.tolist()}, {s})", attempt(fn, kept.clone(), s), kept.shape)
        got, right = got.long(), want(kept, s)
        if torch.equal(got, right):
            continue
        where = f"for kept {kept.tolist()} (n_sink={s}, window={w}) expected {right.tolist()}, got {got.tolist()}"
        if not torch.equal(got[:s], kept[:s]):
            raise ExerciseError(f"the sinks keep positions 0 .. n_sink-1: {where}")
        if torch.equal(got, kept):
            raise ExerciseError(f"those are the original positions (kept itself); StreamingLLM renumbers the keys by "
                                f"their place in the cache: {where}")
        if torch.equal(got, torch.arange(len(kept))):
            raise ExerciseError(f"that is the slot index: once the ring wraps, the oldest window key is not in the "
                                f"first window slot; rank the window's keys by age: {where}")
        if torch.equal(got[s:], s + kept[s:].argsort()):
            raise ExerciseError(f"argsort gives, for each rank, the slot holding it; the rank of each slot is the "
                                f"argsort of that (argsort twice): {where}")
        raise ExerciseError(where)
    return passed("the sinks keep 0 .. n_sink-1, the window's keys are renumbered from n_sink by age, whatever "
                  "slot holds them: the distances a query meets never exceed the cache size")


def check_doc_window_mod(make_mod) -> None:
    """``make_mod(doc_ids (T,), window) -> mask_mod``: packed documents, each causal within a sliding window.

    Dense: same document & kv <= q & q - kv < window (``document_mask(doc_ids, is_causal=True) &
    sink_window_mask(T, 0, window)``). Checked pair by pair, then through ``flex_attention``.
    """
    from ..masks import document_mask, sink_window_mask

    docs, window = torch.tensor([0] * 9 + [1] * 14 + [2] * 3 + [3] * 10), 5
    T = len(docs)
    try:
        mod = attempt(make_mod, docs.clone(), window)
        if mod is None or not callable(mod):
            raise ExerciseError(f"doc_window_mod(doc_ids, {window}) should return a function (b, h, q_idx, kv_idx) "
                                f"-> bool tensor, got {type(mod).__name__}")
        got = _dense(mod, T)
    except NotAttempted:
        return not_attempted("doc_window_mod")
    except ExerciseError:
        raise
    except Exception as error:  # noqa: BLE001 - a learner's mask_mod can fail in many ways
        raise _flex_error(error, "mask_mod") from None
    same = document_mask(docs)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    want = document_mask(docs, is_causal=True) & sink_window_mask(T, 0, window)
    if got.dtype != torch.bool or got.shape != want.shape:
        raise ExerciseError(f"a mask_mod returns a boolean (True = may attend); yours gave {got.dtype} "
                            f"{tuple(got.shape)}")
    if torch.equal(got, want):
        block = flex.block_mask(mod, T, block_size=4)
        gen = torch.Generator().manual_seed(13)
        q, k, v = (torch.randn(1, 2, T, 8, generator=gen, dtype=torch.float64) for _ in range(3))
        out = flex.flex_attention(q, k, v, block_mask=block)
        if not close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=want), atol=1e-9):
            raise ExerciseError("the mask is right pair by pair but flex_attention disagrees with the dense mask: "
                                "does your mask_mod depend on b or h?")
        n = flex.block_counts(block)
        return passed(f"same document & causal & within the window: equal to document_mask & sink_window_mask "
                      f"through flex_attention, {n['skipped']} of {n['total']} tiles of 4 x 4 skipped")
    if torch.equal(got, sink_window_mask(T, 0, window)):
        raise ExerciseError("that is the sliding window alone: a query near a document's start sees the end of the "
                            "previous document (doc_ids[q_idx] == doc_ids[kv_idx])")
    if torch.equal(got, document_mask(docs, is_causal=True)):
        raise ExerciseError(f"that is the causal document mask alone: add the window, q_idx - kv_idx < {window}")
    if torch.equal(got, same & ((i - j).abs() < window)):
        raise ExerciseError("keys after the query are visible: the window is causal, kv_idx <= q_idx")
    if torch.equal(got, want & (j != i)):
        raise ExerciseError("the diagonal is missing: a token may attend to itself")
    if torch.equal(got, same & (j <= i) & (i - j <= window)):
        raise ExerciseError(f"off by one: a window of {window} keys is q_idx - kv_idx < {window}, the query included")
    if torch.equal(got, same & (j <= i) & (i - j < window - 1)):
        raise ExerciseError(f"off by one: a window of {window} keys holds the query and the {window - 1} before it")
    wrong = (got != want).nonzero()[0].tolist()
    raise ExerciseError(f"pair (q={wrong[0]}, kv={wrong[1]}) with doc_ids {docs.tolist()}, window {window}: expected "
                        f"{bool(want[wrong[0], wrong[1]])}, got {bool(got[wrong[0], wrong[1]])}")
