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
