"""The H100/H200 (sm_90) compile, as the README names it, and the GPU report's own calls through Triton's JIT.

``python -m selfattn_lite.course.sm90_compile`` is the sm_90 part of ``course.arch_compile`` (every architecture:
tests/course/test_arch_compile.py). ``--jit`` makes the GPU report's ``flash_attention`` calls inside
``triton_attention.compile_only((9, 0))``: the autotuner prunes and compiles every configuration sm_90 keeps, from
the arguments the report passes. Both run in a subprocess with TRITON_INTERPRET=0; slow, CI runs them under the
H200 machine's Triton (.ci/triton-oldest).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from selfattn_lite import triton_attention as ta
from selfattn_lite.course import arch_compile, sm90_compile

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ta.available(), reason="Triton is not installed (Linux-only extra `triton`)")]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``python -m selfattn_lite.course.sm90_compile``, the command the README names: the sm_90 part of the matrix
    (tests/course/test_arch_compile.py checks every architecture; with Triton's cache warm this takes seconds)."""
    out = tmp_path_factory.mktemp("sm90")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-m", "selfattn_lite.course.sm90_compile", "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=1800)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((out / "compile_sm90.json").read_text())["results"]


def test_sm90_compile_is_the_sm90_part_of_the_matrix(compiled):
    assert sm90_compile.SMEM_LIMIT == ta.GPU_LIMITS[90]["smem_per_block"] == 227 * 1024
    assert len(compiled) == len(arch_compile.cases([90])) and {r["arch"] for r in compiled} == {90}
    for r in compiled:
        assert arch_compile.check(r) == [], r
        if r["kernel"] != "attn_bwd_preprocess_kernel" and r["dtype"] != "fp32":   # bf16/fp16: wgmma throughout
            assert r["wgmma"] > 0 and r["mma_sync"] == 0, r


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
    sm_90 keeps of every kernel (both dQ methods) from the arguments the report will pass, with TMA descriptors, and each
    compiled kernel is one the ahead-of-time table checks: wgmma, no spills, shared memory within sm_90's."""
    got = {(r["kernel"], r["constexprs"].get("BLOCK_M"), r["constexprs"].get("BLOCK_N"), r["num_warps"],
            r["constexprs"].get("D"), r["constexprs"].get("IS_CAUSAL"), r["constexprs"].get("ATOMIC_DQ"))
           for r in jitted if r["kernel"] != "attn_bwd_preprocess_kernel"}
    want = {(kernel, c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], D, causal, atomic)
            for kernel, atomic in (("attn_fwd_kernel", None), ("attn_bwd_dkdv_kernel", False),
                                   ("attn_bwd_dkdv_kernel", True), ("attn_bwd_dq_kernel", None))
            for D in (64, 128) for causal in (False, True)
            for c in ta.kept_configs(kernel, ta.GPU_LIMITS[90], torch.bfloat16, D, atomic=bool(atomic))}
    assert got == want
    for r in jitted:
        assert r["stack"] == 0 and r["local"] == 0 and r["shared_bytes"] <= sm90_compile.SMEM_LIMIT, r
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["constexprs"]["TMA"] is True and r["tma_loads"] > 0, r
            assert r["wgmma"] > 0 and r["mma_sync"] == 0, r
            assert any(kind.startswith("tensordesc<bf16[1,") for kind in r["signature"].values()), r["signature"]
