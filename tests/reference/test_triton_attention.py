"""selfattn_lite.triton_attention: the Triton FlashAttention kernels against torch SDPA and autograd.

Without a GPU every kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set by the module
before Triton is imported), which executes the same kernel body with numpy: slow, so the shapes
are small and the property tests draw few examples. The pure-Python helpers (loop bounds, traffic)
are tested without Triton too. Where Triton is not installed (macOS) the kernel tests skip; CI
installs the `triton` extra on Linux, so there they run.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite import triton_attention as ta

needs_triton = pytest.mark.skipif(not ta.available() and not os.environ.get("CI"), reason="Triton is not installed (Linux-only extra `triton`): "
                                  "pip install -e '.[triton]' to run the kernel tests")
FEW = settings(max_examples=15, deadline=None)


def qkv(B, H, L, S, D, *, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for n in (L, S, S))


def reference_lse(q, k, is_causal, scale):
    s = (q.double() @ k.double().transpose(-2, -1)) * scale            # (B, H, L, S)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.logsumexp(-1)


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


# ----------------------------------------------------------------------------- pure Python: no Triton needed

def brute_bounds(q0, block_m, block_n, S, is_causal):
    """Classify each key block by brute force over the (query, key) pairs of the block."""
    rows = range(q0, q0 + block_m)
    unmasked_blocks, last_needed = 0, 0         # last_needed: one past the last key some query sees
    for k0 in range(0, S, block_n):
        keys = range(k0, k0 + block_n)
        visible = [[j < S and (not is_causal or j <= i) for j in keys] for i in rows]
        for r in visible:
            last_needed = max([last_needed] + [j + 1 for j, seen in zip(keys, r) if seen])
        if all(all(r) for r in visible) and unmasked_blocks * block_n == k0:
            unmasked_blocks += 1
    return unmasked_blocks * block_n, last_needed


@given(q0=st.integers(0, 100), block_m=st.sampled_from([16, 32, 64]), block_n=st.sampled_from([16, 32, 64]),
       S=st.integers(1, 150), causal=st.booleans())
def test_key_block_bounds_match_brute_force(q0, block_m, block_n, S, causal):
    unmasked_end, end = ta.key_block_bounds(q0, block_m, block_n, S, causal)
    want_unmasked, want_end = brute_bounds(q0, block_m, block_n, S, causal)
    assert unmasked_end == want_unmasked and unmasked_end % block_n == 0
    # end may stop inside a block (the mask drops keys >= S or past the last query): it must cover every needed key
    assert math.ceil(end / block_n) == math.ceil(want_end / block_n) and end >= want_end


def test_causal_programs_visit_about_half_the_blocks():
    L = S = 4096
    full = sum(sum(ta.key_blocks_visited(q0, 128, 64, S, False)) for q0 in range(0, L, 128))
    causal = sum(sum(ta.key_blocks_visited(q0, 128, 64, S, True)) for q0 in range(0, L, 128))
    assert full == 32 * 64
    assert causal == sum(2 * (m + 1) for m in range(32))          # program m: keys up to (m + 1) * 128
    masked = [ta.key_blocks_visited(q0, 128, 64, S, True)[1] for q0 in range(0, L, 128)]
    assert set(masked) == {2}                                       # only the two diagonal blocks are masked


def test_hbm_bytes_formula():
    t = ta.hbm_bytes(4096, 4096, 128, 128, 64, B=1, H=16)
    e = 2
    assert t["q"] == 16 * 4096 * 128 * e
    assert t["kv"] == 16 * 2 * (4096 // 128) * 4096 * 128 * e      # K and V read once per query block
    assert t["total"] == t["q"] + t["kv"] + t["o"]
    causal = ta.hbm_bytes(4096, 4096, 128, 128, 64, B=1, H=16, is_causal=True)
    assert causal["kv"] == 16 * 2 * sum((m + 1) * 128 for m in range(32)) * 128 * e
    bigger = ta.hbm_bytes(4096, 4096, 128, 256, 64, B=1, H=16)
    assert bigger["kv"] == t["kv"] // 2                             # twice the query block, half the K/V reads
    assert t["explicit"] > 4 * 16 * 4096 * 4096 * e                 # the n x n matrix, written and read twice


def test_program_grid_and_work():
    assert ta.program_grid(2, 16, 4096, 128) == (32, 32)
    assert ta.program_grid(1, 1, 100, 32) == (4, 1)
    w = ta.program_work(128, 64, 128, 4096)
    assert w["key_blocks"] == 64 and w["masked_blocks"] == 0 and w["flops"] == 64 * 4 * 128 * 64 * 128
    assert ta.program_work(128, 64, 128, 4096, is_causal=True, q0=256)["key_blocks"] == 6


@pytest.mark.parametrize("call, match", [
    (lambda: ta.key_block_bounds(-1, 16, 16, 10, True), "q0"),
    (lambda: ta.key_block_bounds(0, 0, 16, 10, True), "block_m"),
    (lambda: ta.program_grid(1, 1, 0, 16), "L"),
    (lambda: ta.hbm_bytes(10, 10, 16, 16, 0), "block_n"),
])
def test_helpers_reject_bad_numbers(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- the kernels (Triton needed)

@needs_triton
def test_module_runs_under_the_interpreter_without_cuda():
    if not torch.cuda.is_available():
        assert ta.interpreting()


@needs_triton
@FEW
@given(B=st.integers(1, 2), H=st.integers(1, 2), L=st.integers(1, 70), S=st.integers(1, 70),
       D=st.sampled_from([16, 24, 32, 64]), block_m=st.sampled_from([16, 32]), block_n=st.sampled_from([16, 32]),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_forward_equals_sdpa_and_lse(B, H, L, S, D, block_m, block_n, causal, seed):
    q, k, v = qkv(B, H, L, S, D, seed=seed)
    scale = 1 / math.sqrt(D)
    out, lse = ta.forward(q, k, v, is_causal=causal, block_m=block_m, block_n=block_n)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.testing.assert_close(lse, reference_lse(q, k, causal, scale).float())


@needs_triton
@FEW
@given(L=st.integers(1, 50), S=st.integers(1, 50), D=st.sampled_from([16, 32, 40]),
       block_m=st.sampled_from([16, 32]), block_n=st.sampled_from([16, 32]), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gradients_equal_autograd_through_sdpa(L, S, D, block_m, block_n, causal, seed):
    q, k, v = qkv(1, 2, L, S, D, seed=seed)
    do = torch.randn(1, 2, L, D, generator=torch.Generator().manual_seed(seed + 1))

    def triton_fn(q, k, v):
        return ta.FlashAttentionFunction.apply(q, k, v, causal, 1 / math.sqrt(D), block_m, block_n, None, None)[0]

    got = grads(triton_fn, q, k, v, do)
    want = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, do)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_public_api_scale_and_lse(causal):
    q, k, v = qkv(2, 3, 40, 33, 32, seed=3)
    out, lse = ta.flash_attention(q, k, v, is_causal=causal, scale=0.3, return_lse=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3))
    torch.testing.assert_close(lse, reference_lse(q, k, causal, 0.3).float())
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 40)
    assert isinstance(ta.flash_attention(q, k, v), torch.Tensor)


@needs_triton
def test_head_dims_16_to_128_and_a_non_contiguous_input():
    for D in (16, 80, 128):
        q, k, v = qkv(1, 1, 20, 20, D, seed=D)
        torch.testing.assert_close(ta.flash_attention(q, k, v, is_causal=True),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True))
    q, k, v = qkv(1, 4, 24, 24, 16, seed=9)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)           # same values, strides of (B, L, H, D)
    torch.testing.assert_close(ta.flash_attention(q_t, k, v), F.scaled_dot_product_attention(q, k, v))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_error_is_within_twice_sdpas(dtype, causal):
    """Output and gradients in bf16/fp16: error vs a float64 reference within 2x torch SDPA's own + eps."""
    q, k, v = qkv(1, 2, 45, 37, 32, dtype=torch.float64, seed=11)
    do = torch.randn(1, 2, 45, 32, generator=torch.Generator().manual_seed(12), dtype=torch.float64)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    exact = grads(sdpa, q, k, v, do)
    low = [t.to(dtype) for t in (q, k, v, do)]
    torch_err = [(a.double() - e).abs().max().item() for a, e in zip(grads(sdpa, *low), exact)]
    ours = grads(lambda q, k, v: ta.flash_attention(q, k, v, is_causal=causal), *low)
    assert all(t.dtype == dtype for t in ours)
    eps = torch.finfo(dtype).eps
    for name, a, e, t_err in zip(("out", "dq", "dk", "dv"), ours, exact, torch_err):
        err = (a.double() - e).abs().max().item()
        assert err <= 2 * t_err + eps, f"{dtype} {name}: error {err:.2e} vs torch SDPA's {t_err:.2e}"


@needs_triton
def test_interpreter_bf16_dot_needs_the_upcast():
    """The reason for triton_kernels.dot's UPCAST: without it the interpreter's bf16 dot is garbage."""
    if not ta.interpreting():
        pytest.skip("only meaningful under the interpreter")
    q, k, v = qkv(1, 1, 16, 16, 16, dtype=torch.bfloat16, seed=1)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    out, _ = ta.forward(q, k, v)
    assert (out.float() - want).abs().max() < 0.05


@pytest.mark.parametrize("make, match", [
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16)), "4 dims"),
    (lambda: (torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16).double(), torch.randn(1, 1, 8, 16)), "dtype"),
    (lambda: tuple(torch.randn(1, 1, 8, 16).double() for _ in range(3)), "dtype"),
    (lambda: (torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8)), "head dim"),
    (lambda: (torch.randn(1, 1, 8, 256), torch.randn(1, 1, 8, 256), torch.randn(1, 1, 8, 256)), "head dim"),
    (lambda: (torch.randn(1, 1, 8, 16), torch.randn(1, 1, 9, 16), torch.randn(1, 1, 8, 16)), "same shape"),
    (lambda: (torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)), "share B, H and D"),
    (lambda: (torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 32), torch.randn(1, 1, 8, 32)), "share B, H and D"),
    (lambda: (torch.randn(1, 1, 0, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)), "at least one"),
])
def test_bad_inputs_raise_value_error(make, match):
    if not ta.available():
        with pytest.raises(ImportError, match="Triton is not installed"):
            ta.flash_attention(*make())
        return
    with pytest.raises(ValueError, match=match):
        ta.flash_attention(*make())


@needs_triton
def test_bad_block_sizes_and_scale():
    q, k, v = qkv(1, 1, 8, 8, 16)
    for block in (8, 48, True):
        with pytest.raises(ValueError, match="power of 2"):
            ta.forward(q, k, v, block_m=block)
    with pytest.raises(ValueError, match="scale"):
        ta.flash_attention(q, k, v, scale=float("nan"))


# ----------------------------------------------------------------------------- the GPU code paths, run tiny here

@needs_triton
def test_autotune_picks_a_listed_config_and_caches_it():
    """The CUDA autotune's logic, exercised under the interpreter at a tiny size (it times each config)."""
    q, k, v = qkv(1, 1, 20, 20, 16, seed=5)
    fwd, bwd = ta._tuned(q, k, v, True, 0.25)
    assert fwd in ta.CUDA_FWD_CONFIGS and bwd in ta.CUDA_BWD_CONFIGS
    assert ta._tuned(q, k, v, True, 0.25) == (fwd, bwd)
    out, lse = ta.forward(q, k, v, is_causal=True, config=fwd)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@needs_triton
def test_benchmark_records_for_the_gpu_report():
    """benchmark() checks against SDPA and returns JSON-able records; here on CPU at a tiny size."""
    import json

    records = ta.benchmark("cpu", B=1, H=1, ns=(24,), head_dims=(16,), dtype=torch.float32, budget_s=0.01)
    assert len(records) == 1 * 1 * 2 * 2 * 2                       # (n, D) x causal x pass x impl
    assert {r["pass"] for r in records} == {"fwd", "fwd+bwd"} and {r["impl"] for r in records} == {
        "torch SDPA", "triton flash_attention"}
    assert all(r["peak_share"] is None and r["ms"] > 0 for r in records)   # CPUs have no peak in bench
    json.dumps(records)
    assert set(ta.summarize(records, n=24, D=16)) == {"full", "causal"}


def test_summarize_reads_the_goal_off_the_records():
    records = []
    for causal in (False, True):
        for pass_, sdpa_ms, ours_ms in (("fwd", 2.0, 3.0), ("fwd+bwd", 7.0, 15.0)):   # bwd: 5 ms vs 12 ms
            for impl, t in (("torch SDPA", sdpa_ms), ("triton flash_attention", ours_ms)):
                records.append(dict(n=4096, D=128, causal=causal, impl=impl, ms=t, tflops=1.0, peak_share=None,
                                    **{"pass": pass_}))
    goal = ta.summarize(records)
    assert goal["full"]["forward_ratio"] == 1.5 and goal["full"]["forward_goal_met"]
    assert goal["causal"]["backward_ratio"] == 12 / 5 and goal["causal"]["backward_goal_met"]
    with pytest.raises(ValueError, match="no record"):
        ta.summarize(records, n=1024)
