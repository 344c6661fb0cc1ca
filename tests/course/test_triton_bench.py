"""selfattn_lite.course.triton_bench: the Triton benchmark's records and their summary, run tiny on a CPU."""

import json
import os

import pytest
import torch

from selfattn_lite import triton_attention as ta
from selfattn_lite.course import triton_bench

needs_triton = pytest.mark.skipif(not ta.available() and not os.environ.get("CI"),
                                  reason="Triton is not installed (Linux-only extra `triton`)")


@needs_triton
def test_benchmark_records_for_the_gpu_report():
    """benchmark() checks against SDPA and returns JSON-able records; here under the interpreter, tiny."""
    records = triton_bench.benchmark(ta.best_device(), B=1, H=1, ns=(24,), head_dims=(16,), dtype=torch.float32,
                                     budget_s=0.01)
    assert len(records) == 1 * 1 * 2 * 2 * 2                       # (n, D) x causal x pass x impl
    assert {r["pass"] for r in records} == {"fwd", "fwd+bwd"} and {r["impl"] for r in records} == set(triton_bench.IMPLS)
    assert all(r["ms"] > 0 for r in records)
    json.dumps(records)
    assert set(triton_bench.summarize(records, n=24, D=16)) == {"full", "causal"}


def test_summarize_reads_the_goal_off_the_records():
    records = []
    for causal in (False, True):
        for pass_, sdpa_ms, ours_ms in (("fwd", 2.0, 3.0), ("fwd+bwd", 7.0, 15.0)):   # bwd: 5 ms vs 12 ms
            for impl, t in zip(triton_bench.IMPLS, (sdpa_ms, ours_ms)):
                records.append(dict(n=4096, D=128, causal=causal, impl=impl, ms=t, tflops=1.0, peak_share=None,
                                    **{"pass": pass_}))
    goal = triton_bench.summarize(records)
    assert goal["full"]["forward_ratio"] == 1.5 and goal["full"]["forward_goal_met"]
    assert goal["causal"]["backward_ratio"] == 12 / 5 and goal["causal"]["backward_goal_met"]
    with pytest.raises(ValueError, match="no record"):
        triton_bench.summarize(records, n=1024)


def test_time_ms_on_a_cpu_is_bench_time_fn():
    assert triton_bench.time_ms(lambda: torch.ones(4).sum(), "cpu", budget_s=0.01) > 0


@pytest.mark.parametrize("name, cc, dtype, peak", [
    ("Tesla T4", (7, 5), torch.float16, 8.1),          # tl.dot on FMA there: the FP32 peak, not 65 (fp16 tensor cores)
    ("NVIDIA A100-SXM4-80GB", (8, 0), torch.bfloat16, 312.0),
    ("NVIDIA H200", (9, 0), torch.bfloat16, 989.4),
])
def test_the_kernels_share_of_peak_is_against_the_instruction_it_runs_on(monkeypatch, name, cc, dtype, peak):
    """With torch reporting a T4, an A100 or an H200: the kernel's peak is its instruction's (FMA below sm_80),
    SDPA's stays the dtype's tensor-core peak."""
    from types import SimpleNamespace

    from selfattn_lite.course import bench

    props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], shared_memory_per_block_optin=65_536,
                            multi_processor_count=40, regs_per_multiprocessor=65_536)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert triton_bench.kernel_peak_tflops("cuda", dtype) == pytest.approx(peak)
    if cc < (8, 0):
        assert bench.peak_tflops("cuda", dtype) == pytest.approx(65.0)
    assert triton_bench.kernel_peak_tflops("cpu", dtype) is None
