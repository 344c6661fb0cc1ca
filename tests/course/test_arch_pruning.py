"""The Triton kernel's device decisions, driven on a CPU with the faked properties of the GPUs learners have.

``torch.cuda.get_device_properties`` is faked for a T4, an A100, an RTX 4090, an L4 and an H200 (name, compute
capability, shared memory per block opt-in, multiprocessors, registers): each fake goes through the same
``triton_attention.gpu_limits`` and autotuner pruning (``early_config_prune``) a launch on that GPU takes. Asserted
per GPU: the configurations each kernel keeps, the dQ methods left (and so the one chosen when only one fits), the
TMA decision, the matmul instruction and the float32 precision; and that every kept configuration is in that
architecture's committed compile record (``figures/gpu/compile_sm{CC}.json``, written by
``python -m selfattn_lite.course.arch_compile``) and fits there: what the compiler allocated is within the GPU's
limit and the pruning's estimate.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from selfattn_lite import triton_attention as ta
from selfattn_lite.course import arch_compile

RECORDS = Path(__file__).resolve().parents[2] / "figures" / "gpu"

FAKES = {                  # name, (major, minor), shared memory per block opt-in, multiprocessors
    "Tesla T4": ((7, 5), 65_536, 40),
    "NVIDIA A100-SXM4-80GB": ((8, 0), 166_912, 108),
    "NVIDIA GeForce RTX 4090": ((8, 9), 101_376, 128),
    "NVIDIA L4": ((8, 9), 101_376, 58),
    "NVIDIA H200": ((9, 0), 232_448, 132),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KERNELS = (("attn_fwd_kernel", False), ("attn_bwd_dkdv_kernel", False), ("attn_bwd_dkdv_kernel", True),
           ("attn_bwd_dq_kernel", False))


def props(name):
    (major, minor), smem, sms = FAKES[name]
    return SimpleNamespace(name=name, major=major, minor=minor, shared_memory_per_block_optin=smem,
                           multi_processor_count=sms, regs_per_multiprocessor=65_536)


@pytest.fixture
def on_gpu(monkeypatch):
    """Make torch report the named GPU; ``device_limits`` (what the autotuners' pruning reads) then sees it."""
    def fake(name):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props(name))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        return ta.device_limits()
    return fake


def record(cc):
    return json.loads((RECORDS / f"compile_sm{cc}.json").read_text())


# What each GPU keeps at d = 128 in the dtype it computes natively (float16 on the T4, bfloat16 from sm_80), as
# (BLOCK_M, BLOCK_N, warps, stages): forward, dK/dV, dK/dV with atomic dQ, dQ; and the dQ methods left.
KEPT_D128 = {
    "Tesla T4": ("fp16", [(32, 32, 4, 1)], [(16, 32, 4, 1)], [], [(32, 16, 4, 1)], ("recompute",)),
    "NVIDIA A100-SXM4-80GB": ("bf16", [(64, 32, 4, 2)], [(16, 64, 4, 2)], [],
                              [(128, 32, 8, 3), (64, 16, 4, 2)], ("recompute",)),
    "NVIDIA GeForce RTX 4090": ("bf16", [(64, 32, 4, 2)], [(16, 64, 4, 2)], [], [(64, 16, 4, 2)], ("recompute",)),
    "NVIDIA L4": ("bf16", [(64, 32, 4, 2)], [(16, 64, 4, 2)], [], [(64, 16, 4, 2)], ("recompute",)),
    "NVIDIA H200": ("bf16", [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (64, 32, 4, 2)],
                    [(32, 128, 8, 3), (32, 64, 4, 3)], [(64, 64, 8, 2), (64, 64, 8, 3)],
                    [(128, 32, 8, 3), (128, 64, 8, 2), (64, 32, 4, 2)], ("recompute", "atomic")),
}


def short(configs):
    return [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]) for c in configs]


@pytest.mark.parametrize("name", list(FAKES))
def test_what_each_gpu_keeps_at_d128(on_gpu, name):
    """The pruning's result per GPU, written out: the 64 KB of a T4 and the 99 KB of an RTX 4090 or L4 leave the
    small tiles, and on an A100 (mma.sync, operands in registers) the larger tiles spill at d = 128; an H200 keeps
    every wgmma configuration. Where the
    atomic dK/dV keeps nothing (it holds a float32 dQ tile more, and spills on mma.sync at d = 128), the backward
    recomputes dQ."""
    limits = on_gpu(name)
    dtype, fwd, dkdv, atomic, dq, methods = KEPT_D128[name]
    dt = DTYPES[dtype]
    assert short(ta.kept_configs("attn_fwd_kernel", limits, dt, 128)) == fwd
    assert short(ta.kept_configs("attn_bwd_dkdv_kernel", limits, dt, 128)) == dkdv
    assert short(ta.kept_configs("attn_bwd_dkdv_kernel", limits, dt, 128, atomic=True)) == atomic
    assert short(ta.kept_configs("attn_bwd_dq_kernel", limits, dt, 128)) == dq
    assert ta.dq_methods_for(limits, dt, 128) == methods
    assert ta.dq_methods_for(limits, dt, 64) == (("recompute",) if name == "Tesla T4" else ("recompute", "atomic"))


def test_the_backward_takes_the_method_that_fits(on_gpu, monkeypatch):
    """On a faked T4 the first backward runs the one method that fits (recompute), untimed; on a faked H200 it
    times both. The kernels are stand-ins that record their launches."""
    log = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **meta: log.append((self.name, meta.get("ATOMIC_DQ")))

    monkeypatch.setattr(ta, "_kernels", lambda: SimpleNamespace(attn_bwd_preprocess_kernel=Kernel("preprocess")))
    monkeypatch.setattr(ta, "_autotuned", lambda name, atomic=False, dtype=None: Kernel(name))
    monkeypatch.setattr(ta, "_compiled", lambda device: True)
    monkeypatch.setattr(ta, "_check_device", lambda *tensors: None)
    monkeypatch.setattr(ta, "_cuda_ms", lambda call: (call(), 1.0)[1])
    q = torch.zeros(1, 1, 8, 128, dtype=torch.float16)
    for name, want in (("Tesla T4", ["recompute"]), ("NVIDIA H200", ["recompute", "atomic"])):
        on_gpu(name)
        monkeypatch.setattr(ta, "_DQ_TIMINGS", {})
        log.clear()
        ta.backward(q, q, q, q, torch.zeros(1, 1, 8), q, tma=False)
        (timing,) = ta.dq_method_timings()
        assert [m for m in ta.DQ_METHODS if timing[m] is not None] == (want if len(want) > 1 else [])
        assert timing["chosen"] in want
        assert ("attn_bwd_dkdv_kernel", True) in log if "atomic" in want else ("attn_bwd_dkdv_kernel", True) not in log


@pytest.mark.parametrize("name", list(FAKES))
def test_limits_come_from_the_device_properties(on_gpu, name):
    limits = on_gpu(name)
    cc = 10 * limits["capability"][0] + limits["capability"][1]
    assert limits["name"] == name and limits["smem_per_block"] == ta.GPU_LIMITS[cc]["smem_per_block"]
    assert limits["multiprocessors"] == FAKES[name][2] and limits["regs_per_sm"] == 65_536
    assert limits["tensor_cores"] == (cc >= 80)


@pytest.mark.parametrize("name", list(FAKES))
def test_every_kernel_dtype_and_head_dim_keeps_a_configuration(on_gpu, name):
    limits = on_gpu(name)
    cc = 10 * limits["capability"][0] + limits["capability"][1]
    for dtype in arch_compile.dtypes_for(cc):
        for D in (16, 32, 64, 128):
            for kernel, atomic in KERNELS:
                kept = ta.kept_configs(kernel, limits, DTYPES[dtype], D, atomic=atomic)
                if not atomic:
                    assert kept, (name, kernel, dtype, D)
                for c in kept:
                    assert ta.smem_estimate(kernel, c, DTYPES[dtype], D, atomic=atomic,
                                            instruction=ta.matmul_instruction(limits)) <= limits["smem_per_block"]
            assert ta.dq_methods_for(limits, DTYPES[dtype], D), (name, dtype, D)


@pytest.mark.parametrize("name", list(FAKES))
def test_kept_configurations_are_compiled_and_fit(on_gpu, name):
    """Each configuration the pruning keeps on that GPU is in its architecture's compile record, and there the
    compiler's shared memory is within the GPU's limit and the estimate; no record is of a dropped one."""
    limits = on_gpu(name)
    cc = 10 * limits["capability"][0] + limits["capability"][1]
    rec = record(cc)
    assert rec["limits"]["smem_per_block"] == limits["smem_per_block"]
    by_key = {}
    for r in rec["results"]:
        by_key.setdefault((r["kernel"], bool(r["atomic_dq"]), r["dtype"], r["D"], r["causal"]), []).append(r)
    for dtype in arch_compile.dtypes_for(cc):
        for D in arch_compile.HEAD_DIMS:
            for causal in (False, True):
                for kernel, atomic in KERNELS:
                    kept = ta.kept_configs(kernel, limits, DTYPES[dtype], D, atomic=atomic)
                    compiled = by_key.get((kernel, atomic, dtype, D, causal), [])
                    assert sorted(json.dumps(c, sort_keys=True) for c in kept) == \
                        sorted(json.dumps(r["config"], sort_keys=True) for r in compiled), (name, kernel, dtype, D)
                    for r in compiled:
                        assert r["shared_bytes"] <= min(r["smem_estimate"], limits["smem_per_block"]), r
                        assert arch_compile.check(r) == [], r


@pytest.mark.parametrize("name", list(FAKES))
def test_the_autotuners_prune_what_the_gpu_cannot_hold(on_gpu, name):
    """The real pruning hook, fed the faked GPU's properties through ``device_limits``, keeps ``kept_configs``."""
    limits = on_gpu(name)
    cc = 10 * limits["capability"][0] + limits["capability"][1]
    for kernel, atomic in KERNELS:
        for dtype in arch_compile.dtypes_for(cc):
            tuned = ta._autotuned(kernel, atomic, DTYPES[dtype])
            q = torch.zeros(1, 64, 128, dtype=DTYPES[dtype])
            want = ta.kept_configs(kernel, limits, DTYPES[dtype], 128, atomic=atomic)
            if not want:
                with pytest.raises(ValueError, match=f"no launch configuration of {kernel} fits the {name}"):
                    tuned.early_config_prune(tuned.configs, {}, Q=q, D=128)
                continue
            assert [ta._as_dict(c, kernel, atomic) for c in tuned.early_config_prune(tuned.configs, {}, Q=q, D=128)] == want


@pytest.mark.parametrize("name", list(FAKES))
def test_tma_instruction_and_precision(on_gpu, name):
    limits = on_gpu(name)
    cc = 10 * limits["capability"][0] + limits["capability"][1]
    hopper = cc >= 90
    for dtype in ("bf16", "fp16"):
        assert ta.tma_for(limits, DTYPES[dtype], 128) == ta.tma_for(limits, DTYPES[dtype], 64) == hopper
        assert not ta.tma_for(limits, DTYPES[dtype], 20)              # 40-byte rows: not a multiple of 16
    assert not ta.tma_for(limits, torch.float32, 64)
    assert ta.matmul_instruction(limits) == {75: "fma", 80: "mma.sync", 89: "mma.sync", 90: "wgmma"}[cc]
    assert ta.precision_for(limits, torch.float32) == ("tf32" if cc >= 80 else "ieee")


# --------------------------------------------------------------------------- notebook 15's dQ-method cell
def nb15_cell(cell_id: str) -> str:
    path = next((RECORDS.parents[1] / "notebooks").glob("15_*.ipynb"))
    return "".join(next(c for c in json.loads(path.read_text())["cells"] if c.get("id") == cell_id)["source"])


class CompiledView:
    """``triton_attention`` as the notebook's cell sees it on a GPU: not interpreting; the kernels themselves still
    run under the interpreter on this CPU."""

    def __getattr__(self, name):
        return (lambda: False) if name == "interpreting" else getattr(ta, name)


@pytest.mark.skipif(not ta.available(), reason="needs Triton")
@pytest.mark.parametrize("name, runs", [("Tesla T4", ("recompute",)), ("NVIDIA H200", ("recompute",)),
                                        ("NVIDIA A100-SXM4-80GB", ("recompute", "atomic"))])
def test_notebook_15s_dq_method_cell_runs_what_fits(on_gpu, monkeypatch, capsys, name, runs):
    """Cell 23 of notebook 15 (float32, D = 24) on a faked T4 and H200, where no atomic dK/dV configuration fits in
    float32 (the explicit ``dq_method="atomic"`` raised there), and on an A100, where both fit: it asks
    ``dq_methods_for``, runs only those methods and names the one it skips."""
    limits = on_gpu(name)
    assert ta.dq_methods_for(limits, torch.float32, 24) == runs
    called = []
    backward = ta.backward
    monkeypatch.setattr(ta, "backward", lambda *a, dq_method, **kw: called.append(dq_method) or
                        backward(*a, dq_method=dq_method, **kw))
    namespace = dict(HAVE_TRITON=True, torch=torch, ta=CompiledView(), DEVICE=torch.device("cpu"),
                     gen=torch.Generator().manual_seed(0), tol={})
    exec(compile(nb15_cell("8219df0b"), "nb15 cell 23", "exec"), namespace)
    out = capsys.readouterr().out
    assert sorted(set(called)) == sorted(runs)
    skipped = [m for m in ta.DQ_METHODS if m not in runs]
    assert out.strip().endswith(f"skipped (no configuration fits this GPU in torch.float32 at D = 24): "
                                f"{', '.join(skipped) or 'none'}")
    assert ("'atomic' (5 matmuls a tile pair) == 'recompute'" in out) == (len(runs) == 2)
