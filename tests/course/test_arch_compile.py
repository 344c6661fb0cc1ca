"""Every Triton kernel and every launch configuration each GPU keeps, compiled for that GPU on a CPU.

``python -m selfattn_lite.course.arch_compile`` runs ``triton.compile(ASTSource(...), target=GPUTarget("cuda", CC,
32))`` for sm_75 (T4), sm_80 (A100), sm_86 (RTX 3090, A10G), sm_89 (RTX 4090, L4) and sm_90 (H100/H200): the
forward, dK/dV (with and without atomic dQ), dQ and preprocessing kernels, with each configuration
``triton_attention.kept_configs`` keeps for that architecture (what its autotuner tries after
``early_config_prune``), in float16 and float32 (bfloat16 from sm_80), at d = 64 and 128, causal and not, with TMA
descriptors on sm_90. It runs in a subprocess with TRITON_INTERPRET=0 (under the interpreter ``@triton.jit``
functions cannot be compiled). This asserts, per architecture, what its launch would: registers x threads within
the SM's 64 K registers and at most 255 a thread, shared memory within that GPU's limit per block and within the
pruning's estimate, no spills where the GPU has tensor cores (sm_80+), the matmul instruction expected there
(``wgmma`` on sm_90, ``mma.sync`` on sm_80-89, only ``fma`` on sm_75), TMA loads exactly where asked, global
atomics exactly with atomic dQ, 64-bit head offsets; and that every (kernel, dtype, D, causal) group has a
configuration. The summary is printed (``pytest -s``). Minutes on 2 cores (Triton's on-disk cache makes a second
run fast), so it is marked slow and runs in CI under the H200 machine's Triton (.ci/triton-oldest).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from selfattn_lite import triton_attention as ta
from selfattn_lite.course import arch_compile

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ta.available(), reason="Triton is not installed (Linux-only extra `triton`)")]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("arch")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-m", "selfattn_lite.course.arch_compile", "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=1800)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
    return {cc: json.loads((out / f"compile_sm{cc}.json").read_text())["results"] for cc in arch_compile.ARCHS}


def test_every_kept_configuration_was_compiled_for_its_architecture(records):
    for cc in arch_compile.ARCHS:
        want = sorted(json.dumps({k: c[k] for k in ("kernel", "config", "dtype", "D", "causal", "tma", "atomic_dq")},
                                 sort_keys=True) for c in arch_compile.cases([cc]))
        got = sorted(json.dumps({k: r[k] for k in ("kernel", "config", "dtype", "D", "causal", "tma", "atomic_dq")},
                                sort_keys=True) for r in records[cc])
        assert got == want, cc
        assert {r["dtype"] for r in records[cc]} == set(arch_compile.dtypes_for(cc))


def test_every_group_has_a_configuration_on_every_architecture(records):
    """(forward, dK/dV, dQ) x dtype x D x causal, and the preprocessing kernel: none left without a configuration.
    The atomic dK/dV may be missing where it does not fit; the backward then recomputes dQ."""
    for cc in arch_compile.ARCHS:
        groups = arch_compile.groups(records[cc])
        for dtype in arch_compile.dtypes_for(cc):
            for D in arch_compile.HEAD_DIMS:
                assert groups[("attn_bwd_preprocess_kernel", dtype, D, None)], (cc, dtype, D)
                for causal in (False, True):
                    for kernel in ("attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"):
                        assert groups.get((kernel, dtype, D, causal)), (cc, kernel, dtype, D, causal)
                    methods = ta.dq_methods_for(ta.GPU_LIMITS[cc], getattr(torch, arch_compile._TORCH_DTYPE[dtype]), D)
                    assert ("atomic" in methods) == bool(groups.get(("attn_bwd_dkdv_kernel +atomic dQ", dtype, D,
                                                                     causal))), (cc, dtype, D, causal)


def test_each_launch_fits_its_gpu(records):
    """Registers, threads, shared memory (and the estimate), spills, the matmul instruction, TMA, atomics."""
    for cc in arch_compile.ARCHS:
        for r in records[cc]:
            assert arch_compile.check(r) == [], r


def test_the_matmul_instruction_per_architecture(records):
    """wgmma on sm_90 (mma.sync only for its one float32 fallback tile with fewer than 64 rows), mma.sync on
    sm_80-89, no tensor-core instruction at all on sm_75: there every product is an fma."""
    want = {75: "fma", 80: "mma.sync", 86: "mma.sync", 89: "mma.sync", 90: "wgmma"}
    for cc, instruction in want.items():
        assert ta.matmul_instruction(ta.GPU_LIMITS[cc]) == instruction
        for r in records[cc]:
            if r["kernel"] == "attn_bwd_preprocess_kernel":
                continue
            expected = ta.expected_instruction(r["kernel"], r["config"], ta.GPU_LIMITS[cc], atomic=bool(r["atomic_dq"]))
            assert expected == instruction or (cc == 90 and r["dtype"] == "fp32" and expected == "mma.sync"), r
            if expected == "fma":
                assert r["wgmma"] == r["mma_sync"] == 0 and r["fma"] > 0, r
            elif expected == "wgmma":
                assert r["wgmma"] > 0 and r["mma_sync"] == 0, r
            else:
                assert r["mma_sync"] > 0 and r["wgmma"] == 0, r
    assert all(r["tma"] == (r["dtype"] != "fp32") for r in records[90] if r["kernel"] != "attn_bwd_preprocess_kernel")
    assert not any(r["tma"] for cc in (75, 80, 86, 89) for r in records[cc])
