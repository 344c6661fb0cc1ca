"""Every Triton kernel and every autotune configuration, compiled for the H100/H200 (sm_90) on a CPU.

``selfattn_lite.course.sm90_compile`` runs ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90,
32))`` for the forward, dK/dV, dQ and preprocessing kernels, each configuration of ``FWD_CONFIGS``,
``DKDV_CONFIGS``, ``ATOMIC_CONFIGS`` (dK/dV adding dQ with atomics), ``DQ_CONFIGS``, in bf16 and fp16, at d = 64
and 128, causal and not, with TMA tensor descriptors (what bf16/fp16 runs on an H200), plus each kernel's
first configuration with pointer loads. It runs in a
subprocess with TRITON_INTERPRET=0: under the interpreter ``@triton.jit`` functions cannot be
compiled. This asserts what the GPU will see: every case compiles, its matmuls are Hopper's ``wgmma``
(no ``mma.sync`` fallback), ptxas spills nothing (cuobjdump: STACK 0, LOCAL 0), shared memory fits the
227 KB an sm_90 block may use, and the head offsets are 64-bit (issue 23 #7: ``n * L * D`` in int32
wrapped past 2^31 elements). The table is printed (``pytest -s``) and written to JSON.
88 compiles of about 1 s each (Triton 3.6): about a minute on 2 cores, so it is marked slow (CI runs it).
"""

import json
import os
import subprocess
import sys

import pytest

from selfattn_lite import triton_attention as ta
from selfattn_lite.course import sm90_compile

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ta.available(), reason="Triton is not installed (Linux-only extra `triton`)")]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90") / "sm90_resources.json"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-m", "selfattn_lite.course.sm90_compile", "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=1800)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())["results"]


def test_every_kernel_and_config_was_compiled(compiled):
    want = {(c["kernel"], json.dumps(c["config"], sort_keys=True), c["dtype"], c["D"], c["causal"])
            for c in sm90_compile.cases()}
    got = {(r["kernel"], json.dumps(r["config"], sort_keys=True), r["dtype"], r["D"], r["causal"]) for r in compiled}
    assert got == want
    assert {r["kernel"] for r in compiled} == {"attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel",
                                               "attn_bwd_preprocess_kernel"}
    per_mask = len(ta.FWD_CONFIGS) + len(ta.DKDV_CONFIGS) + len(ta.ATOMIC_CONFIGS) + len(ta.DQ_CONFIGS)
    pointer_variants = 3                      # the first config of forward, dK/dV, dQ, not causal
    assert len(compiled) == 2 * 2 * (2 * per_mask + pointer_variants + 1)
    assert {(r["tma"], r["atomic_dq"]) for r in compiled if r["kernel"] == "attn_bwd_dkdv_kernel"} == \
        {(True, False), (True, True), (False, False)}


def test_tma_cases_load_through_the_copy_engine(compiled):
    """Item 6: with descriptors every tile load is a TMA copy (cp.async.bulk.tensor) and the pointer variant
    has none; only the dK/dV kernel with atomic dQ issues global atomics (red/atom.global)."""
    for r in compiled:
        assert (r["tma_loads"] > 0) == r["tma"], r
        assert (r["atomics"] > 0) == bool(r["atomic_dq"]), r


def test_matmuls_are_wgmma(compiled):
    for r in compiled:
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["wgmma"] > 0 and r["mma_sync"] == 0, r


def test_no_register_spills(compiled):
    for r in compiled:
        assert r["stack"] == 0 and r["local"] == 0, r


def test_shared_memory_fits_sm90(compiled):
    assert sm90_compile.SMEM_LIMIT == 227 * 1024
    for r in compiled:
        assert r["shared_bytes"] <= sm90_compile.SMEM_LIMIT, r


def test_head_offsets_are_64_bit(compiled):
    for r in compiled:
        assert r["int64_offsets"], r


# ----------------------------------------------------------------------------- the report's own calls, through the JIT

@pytest.fixture(scope="module")
def jitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("jit") / "sm90_jit.json"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-m", "selfattn_lite.course.sm90_compile", "--jit", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=1800)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())["results"]


def test_the_reports_calls_compile_through_the_jit_and_autotuner(jitted):
    """``flash_attention`` forward + backward at the GPU report's sizes (B=4, H=16, N=4096, d=64 and 128, bf16,
    causal and not) inside ``triton_attention.compile_only((9, 0))``: the autotuner compiles every configuration
    of every kernel (both dQ methods) from the arguments the report will pass, with TMA descriptors, and each
    compiled kernel is one the ahead-of-time table checks: wgmma, no spills, shared memory within sm_90's."""
    got = {(r["kernel"], r["constexprs"].get("BLOCK_M"), r["constexprs"].get("BLOCK_N"), r["num_warps"],
            r["constexprs"].get("D"), r["constexprs"].get("IS_CAUSAL"), r["constexprs"].get("ATOMIC_DQ"))
           for r in jitted if r["kernel"] != "attn_bwd_preprocess_kernel"}
    want = {(kernel, c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], D, causal, atomic)
            for kernel, configs, atomic in (("attn_fwd_kernel", ta.FWD_CONFIGS, None),
                                            ("attn_bwd_dkdv_kernel", ta.DKDV_CONFIGS, False),
                                            ("attn_bwd_dkdv_kernel", ta.ATOMIC_CONFIGS, True),
                                            ("attn_bwd_dq_kernel", ta.DQ_CONFIGS, None))
            for c in configs for D in (64, 128) for causal in (False, True)}
    assert got == want
    for r in jitted:
        assert r["stack"] == 0 and r["local"] == 0 and r["shared_bytes"] <= sm90_compile.SMEM_LIMIT, r
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["constexprs"]["TMA"] is True and r["tma_loads"] > 0, r
            assert r["wgmma"] > 0 and r["mma_sync"] == 0, r
            assert any(kind.startswith("tensordesc<bf16[1,") for kind in r["signature"].values()), r["signature"]
