"""Notebook 11's models and tools: the shipped MHA/GQA/MQA/unmasked decoders, train_tiny's options,
the attn_fn hook, the backward benchmark and the memory widget."""

import json

import pytest
import torch

from selfattn_lite.course import bench_backward, train_tiny
from selfattn_lite.efficient import flash_attention
from selfattn_lite.models import (
    DATA_DIR,
    DecoderConfig,
    TinyDecoder,
    evaluate,
    load_text,
    load_tiny_decoder,
    split_text,
)
from selfattn_lite.viz import BackwardMemoryWidget, saved_for_backward

SHIPPED = {"tiny_mha": 8, "tiny_gqa": 2, "tiny_mqa": 1, "tiny_mha_unmasked": 8}


def _load(stem):
    return load_tiny_decoder(DATA_DIR / f"{stem}.safetensors", DATA_DIR / f"{stem}.json")


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_model_matches_its_record_and_recipe(stem):
    model = _load(stem)
    info = json.loads((DATA_DIR / f"{stem}.json").read_text())
    assert model.config.n_kv_heads == SHIPPED[stem] and model.n_params() == info["n_params"]
    assert model.blocks[0].attn.is_causal == (stem != "tiny_mha_unmasked")
    training = info["training"]
    assert (training["steps"], training["batch"], training["seq_len"], training["seed"]) == (600, 8, 256, 0)
    assert training["weights_dtype"] == "bfloat16" and (DATA_DIR / f"{stem}.safetensors").stat().st_size < 2 * 2**20
    val_ids = model.tokenizer.encode(split_text(load_text())[1])
    got = evaluate(model, val_ids, n_windows=16)
    assert got["loss"] == pytest.approx(info["val_loss"], abs=2e-3)       # re-evaluated: the recorded loss


def test_shipped_models_share_data_and_token_budget():
    infos = [json.loads((DATA_DIR / f"{stem}.json").read_text()) for stem in SHIPPED]
    assert len({i["data"]["sha256"] for i in infos}) == 1
    assert len({i["training"]["tokens"] for i in infos}) == 1
    assert len({(i["training"]["lr"], i["training"]["warmup"]) for i in infos}) == 1


def test_unmasked_model_reads_the_answer_and_fails_without_it():
    model = _load("tiny_mha_unmasked")
    val_ids = model.tokenizer.encode(split_text(load_text())[1])
    peeking = evaluate(model, val_ids, n_windows=4)["loss"]
    for block in model.blocks:
        block.attn.is_causal = True
    honest = evaluate(model, val_ids, n_windows=4)["loss"]
    assert peeking < 0.1 and honest > 3.0


def test_train_tiny_options_write_a_named_variant(tmp_path):
    train_tiny.main(["--steps", "2", "--batch", "2", "--seq-len", "32", "--n-kv-heads", "2", "--no-causal",
                     "--name", "variant", "--out", str(tmp_path), "--save-dtype", "bfloat16", "--eval-every", "1",
                     "--warmup", "1"])
    info = json.loads((tmp_path / "variant.json").read_text())
    assert info["model"]["n_kv_heads"] == 2 and info["model"]["max_len"] == 32 and info["model"]["is_causal"] is False
    assert info["training"]["tokens"] == 2 * 2 * 32 and len(info["training"]["history"]) == 2
    model = load_tiny_decoder(tmp_path / "variant.safetensors", tmp_path / "variant.json")
    assert not model.blocks[0].attn.is_causal and model.config.n_kv_heads == 2
    val_ids = model.tokenizer.encode(split_text(load_text())[1])
    assert evaluate(model, val_ids, n_windows=16)["loss"] == pytest.approx(info["val_loss"], abs=1e-4)


def test_default_recipe_is_unchanged():
    """The shipped tiny_decoder's recipe: new options must not change the default run."""
    assert train_tiny.MODEL["max_len"] == 512 and "causal" not in train_tiny.MODEL
    args = train_tiny.train.__defaults__
    assert args[:7] == (800, 8, 3e-3, 40, 0.1, 0, 100)


def test_attn_fn_hook_runs_flash_attention_forward_and_backward():
    torch.manual_seed(0)
    model = TinyDecoder(DecoderConfig(vocab_size=13, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, max_len=40))
    ids = torch.randint(0, 13, (2, 33), generator=torch.Generator().manual_seed(1))
    reference = model.loss(ids)
    ref_grads = torch.autograd.grad(reference, list(model.parameters()))
    calls = []

    def attn(q, k, v, **kwargs):
        calls.append(kwargs)
        return flash_attention(q, k, v, block_size=(7, 9), **kwargs)

    for block in model.blocks:
        block.attn.attn_fn = attn
    loss = model.loss(ids)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert calls and calls[0] == {"is_causal": True, "enable_gqa": True}
    torch.testing.assert_close(loss, reference, atol=1e-6, rtol=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_attn_fn_refuses_attention_dropout():
    from selfattn_lite.multihead import MultiHeadAttention

    mha = MultiHeadAttention(8, 2, dropout=0.5, is_causal=True).train()
    mha.attn_fn = flash_attention
    with pytest.raises(ValueError, match="dropout_p=0.5"):
        mha(torch.randn(1, 4, 8))


def test_backward_benchmark_measures_and_checks_all_gradients(tmp_path):
    records = bench_backward.measure([64, 128], B=1, H=2, D=8, budget_s=0.01)
    assert {r["impl"] for r in records} == {bench_backward.EXPLICIT, bench_backward.TILED, bench_backward.SDPA}
    peak = {(r["n"], r["impl"]): r["peak_mib"] for r in records}
    assert peak[(128, bench_backward.EXPLICIT)] > 2.5 * peak[(64, bench_backward.EXPLICIT)]   # about n^2
    assert peak[(128, bench_backward.TILED)] < peak[(128, bench_backward.EXPLICIT)]
    q, k, v, do = (torch.randn(1, 2, 16, 8) for _ in range(4))
    calls = bench_backward.implementations(q, k, v, do)
    calls[bench_backward.TILED] = lambda: tuple(2 * g for g in bench_backward.forward_backward(flash_attention,
                                                                                                 q, k, v, do))
    with pytest.raises(AssertionError, match="tiled"):
        bench_backward._check_all_grads(calls)


def test_saved_for_backward_formula_and_widget():
    saved = saved_for_backward(1024, h=4, dv=32, bytes_per_value=2)
    assert saved == {"explicit": 4 * (3 * 1024 * 32 + 1024 * 1024) * 4,        # bf16 inputs: explicit upcasts
                     "tiled": 4 * (4 * 1024 * 32 * 2 + 1024 * 4)}               # Q, K, V, O in bf16; lse float32
    assert saved_for_backward(1024, h=4, dv=32) == {"explicit": 4 * (3 * 1024 * 32 + 1024 * 1024) * 4,
                                                    "tiled": 4 * (4 * 1024 * 32 + 1024) * 4}
    with pytest.raises(ValueError, match="n must be a positive int"):
        saved_for_backward(0)
    widget = BackwardMemoryWidget(n=512, h=2)
    renders = widget.renders
    widget.n_slider.value = 2048
    assert widget.renders == renders + 1 and widget.saved == saved_for_backward(2048, h=2)
    widget.bytes_choice.value = 2
    assert widget.saved["tiled"] == saved_for_backward(2048, h=2, bytes_per_value=2)["tiled"]
    assert widget.image.value[:4] == b"\x89PNG"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_for_backward_is_what_the_autograd_graphs_keep(dtype):
    """The formula against the bytes the two graphs save: explicit (upcast under bf16) and the tiled node."""
    import selfattn_lite as sal
    from selfattn_lite import efficient

    leaves = [torch.randn(1, 2, 128, 32, generator=torch.Generator().manual_seed(i)).to(dtype).requires_grad_()
              for i in range(3)]
    storages, todo, seen = {}, [sal.scaled_dot_product_attention(*leaves)[0].grad_fn], set()
    while todo:                                               # every _saved_ tensor, one entry per storage
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            value = getattr(node, name) if name.startswith("_saved_") else None
            if isinstance(value, torch.Tensor) and value.dim():      # the 0-dim scale left out
                storages[value.untyped_storage().data_ptr()] = value.numel() * value.element_size()
        todo.extend(parent for parent, _ in node.next_functions)
    node = efficient.flash_attention(*leaves).grad_fn
    while "_FlashAttention" not in node.name():
        node = node.next_functions[0][0]
    tiled = sum(t.numel() * t.element_size() for t in node.saved_tensors)
    expected = saved_for_backward(128, h=2, dv=32, bytes_per_value=dtype.itemsize)
    assert sum(storages.values()) == expected["explicit"] and tiled == expected["tiled"]
