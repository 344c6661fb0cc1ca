"""selfattn_lite.triton_attention: the Triton FlashAttention kernels against torch SDPA and autograd.

Without a GPU every kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set by the package
before Triton is imported), which executes the same kernel body with numpy: slow, so the shapes
are small and the property tests draw few examples. The pure-Python helpers (loop bounds, traffic)
are tested without Triton too. Where Triton is not installed (macOS) the kernel tests skip; CI
installs the `triton` extra on Linux, so there they run.
"""

import math
import os
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite import efficient
from selfattn_lite import triton_attention as ta

needs_triton = pytest.mark.skipif(not ta.available() and not os.environ.get("CI"), reason="Triton is not installed (Linux-only extra `triton`): "
                                  "pip install -e '.[triton]' to run the kernel tests")
FEW = settings(max_examples=15, deadline=None)


DEVICE = ta.best_device()      # CUDA where the kernels are compiled, else the CPU (the interpreter)
# float32: exact products under the interpreter; on a GPU TF32 tensor cores from sm_80 (each factor cut to 10
# mantissa bits, u = 2^-10: Triton's default "tf32" hands mma the float32 bits): a score q.k * scale errs by up to
# 2u * sum_d |q_d k_d| * scale, about 2u * sqrt(D) for unit normal inputs (0.016 at D = 64, 0.022 at D = 128), and the
# output by that times max |v| plus 2u |v|; atol + rtol * |out| = 2e-2 * (1 + |out|) covers that for outputs of order
# one. Below sm_80 (a T4) the products are float32's.
FP32 = dict(atol=2e-5, rtol=1e-4) if DEVICE.type == "cpu" else dict(atol=2e-2, rtol=2e-2)


def qkv(B, H, L, S, D, *, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(device=DEVICE, dtype=dtype)
                 for n in (L, S, S))


def randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=DEVICE, dtype=dtype)


def reference_lse(q, k, is_causal, scale):
    s = (q.double() @ k.double().transpose(-2, -1)) * scale            # (B, H, L, S)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
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
       S=st.integers(1, 150), is_causal=st.booleans())
def test_key_block_bounds_match_brute_force(q0, block_m, block_n, S, is_causal):
    unmasked_end, end = ta.key_block_bounds(q0, block_m, block_n, S, is_causal)
    want_unmasked, want_end = brute_bounds(q0, block_m, block_n, S, is_causal)
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
       is_causal=st.booleans(), seed=st.integers(0, 2**16))
def test_forward_equals_sdpa_and_lse(B, H, L, S, D, block_m, block_n, is_causal, seed):
    q, k, v = qkv(B, H, L, S, D, seed=seed)
    scale = 1 / math.sqrt(D)
    out, lse = ta.forward(q, k, v, is_causal=is_causal, block_m=block_m, block_n=block_n)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), **FP32)
    torch.testing.assert_close(lse, reference_lse(q, k, is_causal, scale).float(), **FP32)


@needs_triton
@FEW
@pytest.mark.parametrize("dq_method", ["recompute", "atomic"])
@given(L=st.integers(1, 50), S=st.integers(1, 50), D=st.sampled_from([16, 24, 32, 40]),
       block_m=st.sampled_from([16, 32]), block_n=st.sampled_from([16, 32]), is_causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gradients_equal_autograd_through_sdpa(dq_method, L, S, D, block_m, block_n, is_causal, seed):
    """Through the autograd Function (dQ recomputed by its own kernel, the default under the interpreter), and
    through forward + backward with FlashAttention-2's atomic dQ (every key block adds its dS K into float32)."""
    q, k, v = qkv(1, 2, L, S, D, seed=seed)
    do = randn(1, 2, L, D, seed=seed + 1)

    def triton_fn(q, k, v):
        return ta.FlashAttentionFunction.apply(q, k, v, is_causal, 1 / math.sqrt(D), (block_m, block_n))[0]

    if dq_method == "recompute":
        got = grads(triton_fn, q, k, v, do)
    else:
        out, lse = ta.forward(q, k, v, is_causal=is_causal, block_m=block_m, block_n=block_n)
        got = (out, *ta.backward(q, k, v, out, lse, do, is_causal=is_causal, block_m=block_m, block_n=block_n,
                                 dq_method="atomic"))
    want = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), q, k, v, do)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, **FP32, msg=lambda m, name=name: f"{name}: {m}")


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True])
def test_public_api_scale_and_lse(is_causal):
    q, k, v = qkv(2, 3, 40, 33, 32, seed=3)
    out, lse = ta.flash_attention(q, k, v, is_causal=is_causal, scale=0.3, return_lse=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3), **FP32)
    torch.testing.assert_close(lse, reference_lse(q, k, is_causal, 0.3).float(), **FP32)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 40)
    assert isinstance(ta.flash_attention(q, k, v), torch.Tensor)


@needs_triton
def test_head_dims_16_to_128_and_a_non_contiguous_input():
    for D in (16, 80, 128):
        q, k, v = qkv(1, 1, 20, 20, D, seed=D)
        torch.testing.assert_close(ta.flash_attention(q, k, v, is_causal=True),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True), **FP32)
    q, k, v = qkv(1, 4, 24, 24, 16, seed=9)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)           # same values, strides of (B, L, H, D)
    torch.testing.assert_close(ta.flash_attention(q_t, k, v), F.scaled_dot_product_attention(q, k, v), **FP32)


def assert_half_within_twice_sdpa(run, dtype, is_causal, *, L, S, D, seed, what=""):
    """``run(q, k, v, do) -> (out, dq, dk, dv)`` in bf16/fp16: each error against a float64 reference from the
    same rounded inputs within 2x torch SDPA's own error + eps."""
    q, k, v = qkv(1, 2, L, S, D, dtype=torch.float64, seed=seed)
    do = randn(1, 2, L, D, seed=seed + 1, dtype=torch.float64)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    exact = grads(sdpa, q, k, v, do)
    low = [t.to(dtype) for t in (q, k, v, do)]
    torch_err = [(a.double() - e).abs().max().item() for a, e in zip(grads(sdpa, *low), exact)]
    eps = torch.finfo(dtype).eps
    for name, a, e, t_err in zip(("out", "dq", "dk", "dv"), run(*low), exact, torch_err):
        assert a.dtype == dtype
        err = (a.double() - e).abs().max().item()
        assert err <= 2 * t_err + eps, f"{dtype} {what} {name}: error {err:.2e} vs torch SDPA's {t_err:.2e}"


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_error_is_within_twice_sdpas(dtype, is_causal):
    """Output and gradients in bf16/fp16: error vs a float64 reference within 2x torch SDPA's own + eps."""
    def run(q, k, v, do):
        return grads(lambda q, k, v: ta.flash_attention(q, k, v, is_causal=is_causal), q, k, v, do)

    assert_half_within_twice_sdpa(run, dtype, is_causal, L=45, S=37, D=32, seed=11)


@needs_triton
@pytest.mark.parametrize("tma, dq_method", [(False, "atomic"), (True, "recompute"), (True, "atomic")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tma_and_atomic_dq_paths_are_as_exact_as_sdpa(tma, dq_method, dtype, is_causal):
    """Issue 23 #4 and item 6: tiles fetched through tensor descriptors (TMA on Hopper, emulated by the
    interpreter: rows past L and S and columns past D arrive as zeros) and dQ added with atomics (5 matmuls a
    tile pair) give the pointer path's accuracy: within 2x torch SDPA's own error against float64 + eps.
    L = 45, S = 37 and D = 24 are not multiples of the blocks (16), so every edge of every descriptor is hit."""
    def run(q, k, v, do):
        out, lse = ta.forward(q, k, v, is_causal=is_causal, block_m=16, block_n=16, tma=tma)
        return (out, *ta.backward(q, k, v, out, lse, do, is_causal=is_causal, block_m=16, block_n=16,
                                  dq_method=dq_method, tma=tma))

    assert_half_within_twice_sdpa(run, dtype, is_causal, L=45, S=37, D=24, seed=21, what=f"tma={tma} {dq_method}")


@needs_triton
def test_tma_and_dq_method_reject_what_they_cannot_do():
    q, k, v = qkv(1, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="tma=True needs bfloat16/float16"):
        ta.forward(q, k, v, tma=True)                                    # float32: no descriptors
    h = [t.half() for t in qkv(1, 1, 8, 8, 20)]
    assert not ta.tma_supported(*h)                                      # 20 halves = 40 bytes a row
    with pytest.raises(ValueError, match="D = 20"):
        ta.forward(*h, tma=True)
    out, lse = ta.forward(q, k, v)
    with pytest.raises(ValueError, match="dq_method"):
        ta.backward(q, k, v, out, lse, torch.ones_like(q), dq_method="fast")
    if ta.interpreting():                                                # the interpreter emulates descriptors
        assert ta.tma_supported(*(t.half() for t in (q, k, v)))


@needs_triton
def test_compile_only_needs_the_compiler():
    """Under the interpreter there is nothing to compile; tests/course/test_triton_sm90.py runs compile_only in a
    process with TRITON_INTERPRET=0, where the GPU report's calls compile for sm_90 through Triton's JIT."""
    if not ta.interpreting():
        pytest.skip("only meaningful under the interpreter")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        with ta.compile_only():
            pass
    assert ta._COMPILE_ONLY is None and not ta._compiled(torch.device("cpu"))


def test_dq_method_is_timed_once_and_the_faster_kept(monkeypatch):
    monkeypatch.setattr(ta, "_DQ_TIMINGS", {})
    ran = []
    fake_ms = {"recompute": 3.0, "atomic": 2.0}

    def timer(call):
        call()
        return fake_ms[ran[-1]]

    key = (64, 4096, 4096, 128, True, "bfloat16", True)
    assert ta._choose_dq_method(key, ran.append, timer=timer) == "atomic"
    assert ta._choose_dq_method(key, ran.append, timer=timer) == "atomic"
    assert ran == ["recompute", "atomic"]                                # timed once per problem
    assert ta.dq_method_timings() == [dict(N=64, L=4096, S=4096, D=128, causal=True, dtype="bfloat16", tma=True,
                                           recompute=3.0, atomic=2.0, chosen="atomic")]


@needs_triton
def test_autotuned_descriptors_get_each_configs_blocks():
    """With TMA the descriptors' block shapes depend on the configuration: a pre-hook per config sets them
    (1, BLOCK_M or BLOCK_N, BLOCK_D) before the autotuner runs it; plain tensors are left alone."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(2, 64, 32, dtype=torch.float16)
    for name, kinds in ta.DESCRIPTOR_BLOCKS.items():
        for atomic in ((False, True) if name == "attn_bwd_dkdv_kernel" else (False,)):
            for config in ta._autotuned(name, atomic).configs:
                nargs = {arg: ta._descriptor(x) for arg in kinds}
                nargs.update(LSE=torch.zeros(2, 64), BLOCK_D=32, **config.kwargs)
                config.pre_hook(nargs)
                for arg, block in kinds.items():
                    assert isinstance(nargs[arg], TensorDescriptor)
                    assert nargs[arg].block_shape == [1, config.kwargs[block], 32], (name, arg)
    assert [c.kwargs["BLOCK_M"] for c in ta._autotuned("attn_bwd_dkdv_kernel", True).configs] == \
        [c["BLOCK_M"] for c in ta.ATOMIC_CONFIGS]


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
    tensors = [t.to(DEVICE) for t in make()]
    if not ta.available():
        with pytest.raises(ImportError, match="Triton is not installed"):
            ta.flash_attention(*tensors)
        return
    with pytest.raises(ValueError, match=match):
        ta.flash_attention(*tensors)


@needs_triton
def test_bad_block_sizes_and_scale():
    q, k, v = qkv(1, 1, 8, 8, 16)
    for block in (8, 48, True):
        with pytest.raises(ValueError, match="power of 2"):
            ta.forward(q, k, v, block_m=block)
    with pytest.raises(ValueError, match="scale"):
        ta.flash_attention(q, k, v, scale=float("nan"))


# ----------------------------------------------------------------------------- tile classification, one for all

@given(L=st.integers(1, 130), S=st.integers(1, 130), block_m=st.sampled_from([16, 32, 64]),
       block_n=st.sampled_from([16, 32, 64]), is_causal=st.booleans())
def test_loop_bounds_are_efficient_tile_kind(L, S, block_m, block_n, is_causal):
    """key_block_bounds (forward, dQ) and query_block_bounds (dK/dV) classify tiles as efficient.tile_kind
    does: FULL tiles (inside L and S) run unmasked, PARTIAL masked, SKIP never; the partial edges of L and S
    count as PARTIAL in a kernel (its unmasked loads need whole blocks)."""
    below, above = (L + S, 0) if is_causal else (L + S, L + S)

    def kind(q0, k0):
        whole = q0 + block_m <= L and k0 + block_n <= S
        k = efficient.tile_kind(q0, min(q0 + block_m, L), k0, min(k0 + block_n, S), below, above)
        return efficient.PARTIAL if k == efficient.FULL and not whole else k

    for q0 in range(0, L, block_m):
        unmasked_end, end = ta.key_block_bounds(q0, block_m, block_n, S, is_causal)
        for k0 in range(0, S, block_n):
            want = kind(q0, k0)
            if k0 < unmasked_end:
                assert want == efficient.FULL or (q0 + block_m > L and want == efficient.PARTIAL)
            elif k0 < end:
                assert want != efficient.SKIP or q0 + block_m > L      # rows past L: computed, never stored
            else:
                assert want == efficient.SKIP
    for k0 in range(0, S, block_n):
        start, diag_end, full_end = ta.query_block_bounds(k0, block_m, block_n, L, is_causal)
        for q0 in range(0, L, block_m):
            want = kind(q0, k0)
            if q0 < start:
                assert want == efficient.SKIP
            elif diag_end <= q0 < full_end:
                assert want == efficient.FULL or (k0 + block_n > S and want == efficient.PARTIAL)
            elif not is_causal and q0 < full_end:
                raise AssertionError("non-is_causal: every full query block is unmasked")


# ----------------------------------------------------------------------------- the CUDA launch path, faked on a CPU

class FakeKernel:
    """Stands in for a (possibly autotuned) kernel: records the launch grid, or raises ``error``."""

    def __init__(self, name, log, error=None):
        self.name, self.log, self.error = name, log, error

    def __getitem__(self, grid):
        def run(*args, **meta):
            blocks = dict(BLOCK_M=meta.get("BLOCK_M", 128), BLOCK_N=meta.get("BLOCK_N", 64))
            self.log.append((self.name, grid(blocks) if callable(grid) else grid))
            if self.error is not None:
                raise self.error
        return run


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend the kernels are compiled for CUDA (``_compiled`` True, the autotuned path) while the tensors
    stay on the CPU; ``_autotuned`` hands out ``FakeKernel``s. Returns the launch log and a setter for an error."""
    log, errors = [], {}
    preprocess = FakeKernel("attn_bwd_preprocess_kernel", log)     # launched directly, not through _autotuned
    monkeypatch.setattr(ta, "_kernels", lambda: types.SimpleNamespace(attn_bwd_preprocess_kernel=preprocess))
    monkeypatch.setattr(ta, "_compiled", lambda device: True)
    monkeypatch.setattr(ta, "_check_device", lambda *tensors: None)     # CPU tensors pass, also on a GPU machine
    monkeypatch.setattr(ta, "device_limits", lambda device=None: ta.GPU_LIMITS[90])   # an H100's limits
    monkeypatch.setattr(ta, "_autotuned", lambda name, atomic=False, dtype=None: FakeKernel(name, log, errors.get(name)))
    return log, errors


@needs_triton
def test_device_is_checked_after_every_other_argument(monkeypatch):
    """Issue 23 #1. On a CUDA machine CPU tensors are refused, but only after the checks a test asks about:
    faked here by turning the interpreter off (``interpreting`` False) with CPU tensors."""
    monkeypatch.setattr(ta, "interpreting", lambda: False)
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    for block in (8, 48, True):
        with pytest.raises(ValueError, match="power of 2"):
            ta.forward(q, k, v, block_m=block)
    with pytest.raises(ValueError, match="scale"):
        ta.flash_attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="same shape"):
        ta.flash_attention(q, k[:, :, :4], v)
    with pytest.raises(ValueError, match="q is on cpu"):
        ta.flash_attention(q, k, v)
    assert ta.best_device().type == ("cuda" if torch.cuda.is_available() else "cpu")   # interpreter off


@needs_triton
def test_a_kernel_error_surfaces_as_it_is(fake_cuda):
    """Issue 23 #2. The old hand-written autotune caught every exception and then failed with 'min() arg is an
    empty sequence'. Now the launch goes through ``@triton.autotune`` (which skips only configurations that run
    out of resources and re-raises anything else) with no handler of ours around it: an illegal memory
    access raised by the (faked) CUDA kernel reaches the caller unchanged."""
    log, errors = fake_cuda
    errors["attn_fwd_kernel"] = RuntimeError("CUDA error: an illegal memory access was encountered")
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        ta.flash_attention(q, k, v)
    assert log and log[0][0] == "attn_fwd_kernel"


@needs_triton
def test_each_kernel_has_its_own_autotune_configs_and_key():
    """Issue 23 #3 and #9: forward, dK/dV and dQ are autotuned separately, each on its own list, keyed on
    B*H (N), L, S, D and causality (Triton adds the tensors' dtypes to the key itself)."""
    import triton

    for name, configs in (("attn_fwd_kernel", ta.FWD_CONFIGS), ("attn_bwd_dkdv_kernel", ta.DKDV_CONFIGS),
                          ("attn_bwd_dq_kernel", ta.DQ_CONFIGS)):
        tuned = ta._autotuned(name)
        assert isinstance(tuned, triton.runtime.autotuner.Autotuner)
        assert list(tuned.keys) == ["N", "L", "S", "D", "IS_CAUSAL"]
        got = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in tuned.configs]
        assert got == [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]) for c in configs]
    assert ta.DKDV_CONFIGS != ta.DQ_CONFIGS
    assert all(c["BLOCK_N"] >= 2 * c["BLOCK_M"] for c in ta.DKDV_CONFIGS)     # dK/dV: a large key block stays
    assert all(c["BLOCK_M"] >= 2 * c["BLOCK_N"] for c in ta.DQ_CONFIGS)       # dQ: a large query block stays


@needs_triton
def test_bf16_and_fp16_are_tuned_apart(fake_cuda, monkeypatch):
    """With TMA every tile argument is a descriptor, which gives Triton's autotune key no dtype: the launch picks
    an autotuner per dtype instead, so a bf16 tuning is never reused for fp16 (the faked GPU takes descriptors)."""
    asked = []
    real = ta._autotuned
    monkeypatch.setattr(ta, "_autotuned", lambda name, atomic=False, dtype=None: asked.append(dtype) or
                        FakeKernel(name, [], None))
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 1, 8, 16).to(dtype)
        assert ta.tma_by_default(q)
        with torch.no_grad():
            ta.flash_attention(q, q, q)
    assert asked == [torch.bfloat16, torch.float16]
    assert real("attn_fwd_kernel", False, torch.bfloat16) is not real("attn_fwd_kernel", False, torch.float16)


@needs_triton
def test_forward_only_call_tunes_only_the_forward(fake_cuda):
    """Issue 23 #9: the first forward-only call used to time every backward configuration too."""
    log, _ = fake_cuda
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with torch.no_grad():
        ta.flash_attention(q, k, v)
    assert [name for name, _ in log] == ["attn_fwd_kernel"]


@needs_triton
def test_first_backward_times_both_dq_methods_then_runs_the_faster(fake_cuda, monkeypatch):
    """On a GPU (faked) the first backward of a size runs each dQ method under a timer, keeps the faster and
    runs it: the launch log shows dK/dV + dQ (recompute), dK/dV with atomics, then the winner."""
    log, _ = fake_cuda
    monkeypatch.setattr(ta, "_DQ_TIMINGS", {})
    monkeypatch.setattr(ta, "_cuda_ms", lambda call: (call(), 1.0 if len(log) >= 4 else 2.0)[1])
    q, k, v = (torch.randn(1, 1, 8, 16).half() for _ in range(3))      # float16: both dQ methods fit an H100
    ta.backward(q, k, v, q.clone(), torch.zeros(1, 1, 8), torch.ones_like(q))
    names = [name for name, _ in log]
    assert names == ["attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_bwd_dkdv_kernel",
                     "attn_bwd_dkdv_kernel"]
    (timing,) = ta.dq_method_timings()
    assert (timing["recompute"], timing["atomic"], timing["chosen"]) == (2.0, 1.0, "atomic")


@needs_triton
def test_heads_on_grid_axis_0_past_65535(fake_cuda):
    """Issue 23 #8: B * H = 70,000 heads would not fit CUDA's grid axis 1 (at most 65,535). The launch grid
    is one-dimensional: ceil(L / BLOCK_M) * B * H programs on axis 0 (the faked launch records it)."""
    log, _ = fake_cuda
    q, k, v = (torch.randn(700, 100, 4, 16) for _ in range(3))
    with torch.no_grad():
        ta.flash_attention(q, k, v)
    (name, grid), = log
    assert grid == (70_000,) and ta.launch_grid(700, 100, 4, 128) == (70_000,)


@needs_triton
def test_float32_uses_tf32_tensor_cores_from_sm80(monkeypatch):
    """Issue 23 #6: float32 ran the exact 'ieee' dot on CUDA (no tensor cores, a 75 s compile). It is TF32 from
    sm_80 now, as documented in flash_attention; below sm_80 (no TF32, no tensor-core path in Triton) and under
    the interpreter the products are float32's."""
    assert [ta.precision_for(ta.GPU_LIMITS[cc], torch.float32) for cc in (75, 80, 86, 89, 90)] == \
        ["ieee", "tf32", "tf32", "tf32", "tf32"]
    assert ta._precision(torch.float32, torch.device("cpu")) == "ieee"       # the interpreter (no GPU compile)
    monkeypatch.setattr(ta, "_compiled", lambda device: True)
    for cc, want in ((75, "ieee"), (80, "tf32")):
        monkeypatch.setattr(ta, "device_limits", lambda device=None, cc=cc: ta.GPU_LIMITS[cc])
        assert ta._precision(torch.float32, torch.device("cuda")) == want
    assert "TF32" in ta.flash_attention.__doc__ and "TF32" in ta.__doc__


@needs_triton
def test_preprocess_kernel_computes_delta():
    """Issue 23 #4: delta = rowsum(dO * O) is a small kernel of its own, not three float32 temporaries in torch."""
    kernels = ta._kernels()
    o, do = randn(3, 37, 24, seed=1), randn(3, 37, 24, seed=2)
    delta = torch.empty(3, 37, device=DEVICE)
    kernels.attn_bwd_preprocess_kernel[(math.ceil(37 / 16) * 3,)](o, do, delta, 3, 37, D=24, BLOCK_M=16, BLOCK_D=32)
    torch.testing.assert_close(delta, (o * do).sum(-1))


@needs_triton
def test_backward_takes_inputs_then_saved_then_gradient():
    """Issue 22: backward(q, k, v, out, lse, grad_out), lse in natural log."""
    import inspect

    assert list(inspect.signature(ta.backward).parameters)[:6] == ["q", "k", "v", "out", "lse", "grad_out"]
    q, k, v = qkv(1, 1, 20, 20, 16, seed=4)
    out, lse = ta.forward(q, k, v)
    do = randn(1, 1, 20, 16, seed=5)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qs, ks, vs).backward(do)
    for got, want in zip(ta.backward(q, k, v, out, lse, do), (qs.grad, ks.grad, vs.grad)):
        torch.testing.assert_close(got, want, **FP32)


@needs_triton
def test_dq_falls_back_to_the_method_that_fits(fake_cuda, monkeypatch):
    """When one dQ method has no configuration that fits the GPU (``dq_methods_for``), the backward runs the other,
    untimed; the timings record says so (None for the one not run)."""
    log, _ = fake_cuda
    monkeypatch.setattr(ta, "_DQ_TIMINGS", {})
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    for methods, kernels in ((("recompute",), ["attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"]),
                             (("atomic",), ["attn_bwd_dkdv_kernel"])):
        log.clear()
        monkeypatch.setattr(ta, "_DQ_TIMINGS", {})
        monkeypatch.setattr(ta, "dq_methods_for", lambda limits, dtype, D, methods=methods: methods)
        monkeypatch.setattr(ta, "_cuda_ms", lambda call: pytest.fail("a single method is not timed"))
        ta.backward(q, k, v, q.clone(), torch.zeros(1, 1, 8), torch.ones_like(q))
        assert [name for name, _ in log] == ["attn_bwd_preprocess_kernel", *kernels]
        (timing,) = ta.dq_method_timings()
        assert timing["chosen"] == methods[0] and timing["recompute"] is None and timing["atomic"] is None
    monkeypatch.setattr(ta, "dq_methods_for", lambda limits, dtype, D: ())
    with pytest.raises(ValueError, match="neither dQ method"):
        ta.backward(q, k, v, q.clone(), torch.zeros(1, 1, 8), torch.ones_like(q))


@needs_triton
def test_the_autotuners_prune_by_the_gpus_limits(monkeypatch):
    """``early_config_prune`` keeps what ``config_fits`` the launch's GPU, dtype and D, and refuses in one sentence
    when nothing would."""
    import triton

    for name, atomic in (("attn_fwd_kernel", False), ("attn_bwd_dkdv_kernel", False), ("attn_bwd_dkdv_kernel", True),
                         ("attn_bwd_dq_kernel", False)):
        tuned = ta._autotuned(name, atomic, torch.float16)
        assert tuned.early_config_prune is not None
        for cc in (75, 90):
            monkeypatch.setattr(ta, "device_limits", lambda device=None, cc=cc: ta.GPU_LIMITS[cc])
            q = torch.zeros(1, 8, 128, dtype=torch.float16)
            want = ta.kept_configs(name, ta.GPU_LIMITS[cc], torch.float16, 128, atomic=atomic)
            if not want:                                                 # the atomic dK/dV below sm_80
                with pytest.raises(ValueError, match=f"no launch configuration of {name} fits"):
                    tuned.early_config_prune(tuned.configs, {}, Q=q, D=128)
                continue
            kept = [ta._as_dict(c, name, atomic) for c in tuned.early_config_prune(tuned.configs, {}, Q=q, D=128)]
            assert kept == want
    tiny = dict(ta.GPU_LIMITS[80], smem_per_block=1024, name="tiny GPU")
    monkeypatch.setattr(ta, "device_limits", lambda device=None: tiny)
    tuned = ta._autotuned("attn_fwd_kernel", False, torch.float16)
    with pytest.raises(ValueError, match="no launch configuration of attn_fwd_kernel fits the tiny GPU"):
        tuned.early_config_prune(tuned.configs, {}, Q=torch.zeros(1, 8, 64, dtype=torch.float16), D=64)
    assert isinstance(tuned, triton.runtime.autotuner.Autotuner)


@needs_triton
def test_bfloat16_needs_sm80(monkeypatch):
    """A T4 (sm_75) has no bfloat16 arithmetic: the kernels refuse it there in one sentence, and take float16."""
    monkeypatch.setattr(ta, "_compiled", lambda device: True)
    monkeypatch.setattr(ta, "_check_device", lambda *tensors: None)
    monkeypatch.setattr(ta, "device_limits", lambda device=None: ta.GPU_LIMITS[75])
    q = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 needs a GPU of compute capability 8.0 or more; the T4"):
        ta.forward(q, q, q)
    with pytest.raises(ValueError, match="bfloat16 needs"):
        ta.backward(q, q, q, q, torch.zeros(1, 1, 8), q)


def test_a_triton_older_than_the_minimum_counts_as_unavailable(monkeypatch):
    """Colab keeps the Triton its torch ships: one older than pyproject's minimum must not be used."""
    import importlib.metadata
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    for release, ok in (("3.5.1", False), ("3.6.0", True), ("3.10.0", True), ("2.3.1", False), ("4.0.0+git", True)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, r=release: r)
        assert ta._triton_release_ok() is ok, release
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert not ta._triton_release_ok()
