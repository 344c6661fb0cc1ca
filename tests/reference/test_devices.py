"""Device and dtype handling: every device present (CPU here and in CI, CUDA too on a GPU machine).

The same tests run on each device in ``DEVICES``; none is skipped. Logic that only a GPU would
reach (a model on another device, the CUDA memory counters) is exercised on the CPU with the
"meta" device or stand-ins for torch.cuda's functions.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfattn_lite import encoder
from selfattn_lite import explore as ex
from selfattn_lite.course import bench
from selfattn_lite.course.memory import peak_memory
from selfattn_lite.efficient import flash_attention
from selfattn_lite.kv_cache import KVCache
from selfattn_lite.models import DecoderConfig, TinyDecoder, to_gqa
from selfattn_lite.positions import RotaryEmbedding

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tiny_model(device="cpu", dtype=torch.float32, **kw):
    cfg = dict(vocab_size=11, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=64) | kw
    torch.manual_seed(0)
    return TinyDecoder(DecoderConfig(**cfg)).to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------- models
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_to_gqa_keeps_device_and_dtype(device, dtype):
    model = tiny_model(device, dtype)
    gqa = to_gqa(model, 2)
    p = gqa.embed.weight
    assert p.device.type == device and p.dtype == dtype and gqa.config.n_kv_heads == 2
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    assert gqa(ids).device.type == device               # runs where the model is, no silent move


def test_ids_on_another_device_raise_naming_both():
    model = tiny_model().to("meta")
    with pytest.raises(ValueError, match="ids are on cpu but the model is on meta"):
        model(torch.tensor([[1, 2, 3]]))
    assert model._check_ids([1, 2, 3]).device.type == "meta"     # a list is made on the model's device


def test_range_check_syncs_only_where_asked(monkeypatch):
    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: calls.append(t.device.type) or real(t))
    model = tiny_model().to("meta")
    model._check_ids(torch.tensor([[1, 2]], device="meta"))      # forward's default: not on a GPU/meta
    assert calls == []
    cpu = tiny_model()
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=11\), got min -1, max 12"):
        cpu(torch.tensor([[-1, 12]]))
    assert calls == ["cpu"]                                       # one aminmax: min and max in one pass


@pytest.mark.parametrize("device", DEVICES)
def test_generate_checks_the_prompt_once_off_the_cpu(device, monkeypatch):
    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: calls.append(1) or real(t))
    model = tiny_model(device)
    prompt = torch.tensor([[1, 2, 3]], device=device)
    out = model.generate(prompt, 5)
    # CPU: the prompt once in generate, then each forward (prefill + 4 decode steps) checks for free;
    # CUDA: the prompt once, no host sync per decode step
    assert len(calls) == (1 + 5 if device == "cpu" else 1)
    assert out.device.type == device and torch.equal(out, model.generate(prompt, 5, use_cache=False))
    with pytest.raises(ValueError, match="token ids must be in"):
        model.generate(torch.tensor([[1, 99]], device=device), 2)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_frequencies_stay_float32_when_the_model_is_cast(device):
    model = tiny_model(device)
    positions = torch.arange(501, device=device)
    cos32, _ = model.rope.angles(positions)
    model = model.to(torch.bfloat16)
    assert model.rope.inv_freq.dtype == torch.float32 and model.rope.inv_freq.device.type == device
    cos, _ = model.rope.angles(positions)
    assert torch.equal(cos, cos32)                                # no bf16 frequencies: cos exact at m = 500
    wide = RotaryEmbedding(64)                                    # what casting the buffer would have cost:
    rounded = (positions[:, None].float() * wide.inv_freq.to(torch.bfloat16).float().to(device)).cos()
    assert (rounded - wide.to(device).angles(positions)[0]).abs().max() > 0.05   # 0.09 at m = 500 (issue 12)
    rope = RotaryEmbedding(8).half().to("meta")
    assert rope.inv_freq.dtype == torch.float32 and rope.inv_freq.device.type == "meta"
    assert model(torch.tensor([[1, 2, 3]], device=device)).dtype == torch.bfloat16


# --------------------------------------------------------------------------- explore
class SpyEncoder(nn.Module):
    """Stands in for the encoder on another device: checks where its inputs are."""

    def __init__(self, device):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, device=device))

    def forward(self, input_ids, key_padding_mask=None, need_weights=False):
        assert input_ids.device == self.w.device, f"ids on {input_ids.device}, model on {self.w.device}"
        if key_padding_mask is not None:
            assert key_padding_mask.device == self.w.device
        B, T = input_ids.shape
        hidden = torch.ones(B, T, 4, device=self.w.device)
        return hidden, [torch.full((B, 2, T, T), 1.0 / T)] if need_weights else None


def test_explore_moves_token_ids_to_the_models_device():
    emb = encoder.sentence_embeddings(["a cat", "a much longer sentence"], model=SpyEncoder("meta"))
    assert emb.device.type == "meta" and emb.shape == (2, 4)
    maps = ex.explore("a cat sat", model=SpyEncoder("meta"), tokenizer=encoder.load_tokenizer())
    assert maps.weights.device.type == "cpu" and maps.n_heads == 2


@pytest.mark.parametrize("device", DEVICES)
def test_explore_decoder_runs_a_model_on_its_device(device):
    from selfattn_lite.models import CharTokenizer

    model = tiny_model(device)
    model.tokenizer = CharTokenizer("abcdefghijk")
    maps = ex.explore_decoder("abcab", model=model)
    assert maps.weights.device.type == "cpu" and maps.weights.shape == (2, 4, 5, 5)


# --------------------------------------------------------------------------- kernels and caches
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_matches_torch_on_each_device(device, is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 16, generator=g).to(device) for _ in range(3))
    got = flash_attention(q, k, v, is_causal=is_causal, block_size=(8, 16))
    assert got.device.type == device
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_kv_cache_on_each_device(device):
    cache = KVCache(1, 2, 8, 4, dtype=torch.bfloat16, device=device)
    k, v = (torch.randn(1, 2, 3, 4, device=device, dtype=torch.bfloat16) for _ in range(2))
    k_all, v_all = cache.update(k, v)
    assert k_all.device.type == device and len(cache) == 3 and torch.equal(k_all, k)
    with pytest.raises(ValueError, match="but the cache is on"):
        cache.update(k.to("meta"), v.to("meta"))


def test_peak_memory_cuda_branch_reads_the_allocator_counters(monkeypatch):
    state = dict(allocated=1000, peak=1000, synced=0, reset=0)

    def fake_fn():
        state["peak"] = max(state["peak"], state["allocated"] + 4096)      # 4 KiB above the inputs
        return "result"

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: state.update(synced=state["synced"] + 1))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: state.update(reset=state["reset"] + 1, peak=state["allocated"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    assert peak_memory(fake_fn, "cuda") == 4096
    assert state["reset"] == 1 and state["synced"] == 2                   # before and after the call


@pytest.mark.parametrize("device", DEVICES)
def test_peak_memory_counts_the_scores_of_explicit_attention(device):
    q = torch.randn(1, 2, 256, 16, device=device)
    scores_bytes = 2 * 256 * 256 * 4
    assert peak_memory(lambda: q @ q.transpose(-2, -1), device) >= scores_bytes
    assert bench.infer_device(q) == torch.device(device) if device == "cpu" else q.device
