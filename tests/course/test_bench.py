"""selfattn_lite.course.bench: FLOPs, tolerances in ulps, timing method, peaks by exact name, backends.

Device-aware: each test that runs work does so on every device present (CPU here and in CI,
CUDA too on a GPU machine); CUDA-only logic (synchronized timing, peak lookup) is exercised on
the CPU with stand-ins for torch's functions.
"""

import math
import sys
import timeit

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from selfattn_lite import scaled_dot_product_attention as sdpa
from selfattn_lite.course import bench

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def explicit(q, k, v, is_causal=False):
    return sdpa(q, k, v, is_causal=is_causal)[0]


# --------------------------------------------------------------------------- FLOPs and labels
def test_attention_flops_formula():
    assert bench.attention_flops(2, 8, 128, 256, 64) == 4 * 2 * 8 * 128 * 256 * 64
    assert bench.attention_flops(2, 8, 128, 256, 64, is_causal=True) == 2 * 2 * 8 * 128 * 256 * 64


@pytest.mark.parametrize("device", DEVICES)
def test_compare_attention_counts_full_flops_for_rows_that_compute_every_score(device):
    rows = bench.compare_attention({"explicit": explicit, "tiled": explicit}, B=1, H=2, L=64, D=16, is_causal=True,
                                   device=device, budget_s=0.05, skips_masked=["tiled"])
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == ["torch SDPA", "explicit", "tiled"]
    assert by_name["torch SDPA"].flops == bench.attention_flops(1, 2, 64, 64, 16, is_causal=True)
    assert by_name["tiled"].flops == bench.attention_flops(1, 2, 64, 64, 16, is_causal=True)
    assert by_name["explicit"].flops == bench.attention_flops(1, 2, 64, 64, 16)      # every score computed
    assert rows[0].ratio == 1.0 and rows[1].ratio == pytest.approx(rows[1].seconds / rows[0].seconds)
    dtype = bench.default_sizes(device)["dtype"]
    assert rows[0].dtype == str(dtype).replace("torch.", "") and rows[0].max_abs_err == 0
    assert rows[1].err_ulps <= bench.DEFAULT_ULPS[dtype]
    table = bench.format_table(rows)
    assert "torch SDPA" in table and "explicit" in table and ("FLOP/s" not in table if device == "cpu"
                                                              else "TFLOP/s" in table)


def test_compare_attention_rejects_unknown_names():
    with pytest.raises(ValueError, match="skips_masked names"):
        bench.compare_attention({"a": explicit}, B=1, H=1, L=8, D=4, device="cpu", skips_masked=["b"])
    with pytest.raises(ValueError, match="compute_dtypes names"):
        bench.compare({"a": lambda: torch.zeros(1)}, reference="a", compute_dtypes={"b": torch.float32})


def test_rows_carry_their_compute_dtype_in_the_label():
    rows = bench.compare_attention({"explicit": explicit}, B=1, H=2, L=16, D=8, dtype=torch.bfloat16, device="cpu",
                                   budget_s=0.02, compute_dtypes={"explicit": bench.upcast_dtype(torch.bfloat16)})
    assert rows[0].precision == "bfloat16" and rows[0].label == "torch SDPA [bfloat16]"
    assert rows[1].compute_dtype == "float32" and rows[1].label == "explicit [bfloat16 -> float32]"
    assert "bfloat16 -> float32" in bench.format_table(rows)
    assert bench.upcast_dtype(torch.float16) == torch.float32 and bench.upcast_dtype(torch.float64) == torch.float64


@pytest.mark.parametrize("device", DEVICES)
def test_compare_refuses_to_time_a_wrong_answer(device):
    with pytest.raises(AssertionError, match="wrong disagrees with torch SDPA"):
        bench.compare_attention({"wrong": lambda q, k, v, is_causal=False: v}, B=1, H=1, L=8, D=4, device=device)


def test_compare_needs_a_known_reference():
    with pytest.raises(ValueError, match="reference 'x' is not one of"):
        bench.compare({"a": lambda: torch.zeros(1)}, reference="x")


def test_compare_integer_outputs_must_match_exactly():
    ids = torch.arange(5)
    rows = bench.compare({"a": lambda: ids, "b": lambda: ids.clone()}, reference="a", budget_s=0.01)
    assert rows[1].max_abs_err == 0 and rows[1].err_ulps is None
    with pytest.raises(AssertionError, match="c disagrees with a"):
        bench.compare({"a": lambda: ids, "c": lambda: ids + 1}, reference="a", budget_s=0.01)


def test_compare_per_row_flops_and_infers_the_device():
    out = torch.ones(3)
    rows = bench.compare({"a": lambda: out, "b": lambda: out.clone()}, reference="a", flops={"a": 1e6}, budget_s=0.01)
    assert rows[0].flops == 1e6 and rows[1].flops is None and rows[1].gflops is None
    assert rows[0].device.startswith("CPU") and rows[0].backend == ""       # recorded everywhere: no SDPA called


# --------------------------------------------------------------------------- tolerances in ulps
def test_ulp_of_bf16_fp16_fp32():
    assert bench.ulp(torch.bfloat16, 3.6) == 2.0 ** -6          # the 1.56e-2 at |out| near 3.6
    assert bench.ulp(torch.bfloat16, 1.0) == 2.0 ** -7
    assert bench.ulp(torch.float16, 0.75) == 2.0 ** -11
    assert bench.ulp(torch.float32, 1.0) == torch.finfo(torch.float32).eps
    assert bench.tolerance(torch.bfloat16, 3.6) == dict(atol=8 * 2.0 ** -6, rtol=0.0)
    assert bench.tolerance(torch.bfloat16, 3.6, ulps=2)["atol"] == 2 * 2.0 ** -6


@given(st.floats(1e-3, 1e4), st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
def test_rounding_to_a_dtype_moves_a_value_at_most_half_an_ulp(x, dtype):
    rounded = torch.tensor(x, dtype=torch.float64).to(dtype).double().item()
    assert abs(rounded - x) <= 0.5 * bench.ulp(dtype, x) * (1 + 1e-12)


def test_assert_close_ulps_passes_within_and_names_the_bound_outside():
    expected = torch.linspace(-3.6, 3.6, 50, dtype=torch.float64)
    u = bench.ulp(torch.bfloat16, 3.6)
    close = (expected + u).to(torch.bfloat16)                      # about one ulp off (plus rounding)
    assert bench.assert_close_ulps(close, expected) <= 1.5
    with pytest.raises(AssertionError, match="ulps of bfloat16"):
        bench.assert_close_ulps((expected + 12 * u).to(torch.bfloat16), expected)
    with pytest.raises(AssertionError, match="my check"):
        bench.assert_close_ulps(close, expected, ulps=0.25, msg="my check")
    assert bench.error_ulps(expected.float(), expected, torch.bfloat16) < 1e-3


def test_compare_default_bound_is_in_ulps_of_the_output():
    x = torch.full((4,), 3.6, dtype=torch.bfloat16)
    off = lambda n: (lambda: x + n * bench.ulp(torch.bfloat16, 3.6))   # noqa: E731
    rows = bench.compare({"ref": lambda: x, "4 ulps": off(4)}, reference="ref", budget_s=0.01)
    assert rows[1].err_ulps == 4
    with pytest.raises(AssertionError, match="16 ulps disagrees"):
        bench.compare({"ref": lambda: x, "16 ulps": off(16)}, reference="ref", budget_s=0.01)
    with pytest.raises(AssertionError, match="4 ulps disagrees"):
        bench.compare({"ref": lambda: x, "4 ulps": off(4)}, reference="ref", budget_s=0.01, ulps=2)


# --------------------------------------------------------------------------- timing method
def test_time_stats_times_the_first_call_apart_then_samples_of_n_calls():
    calls = []
    t = bench.time_stats(lambda: calls.append(1), warmup=2, repeat=4, number=3)
    assert len(calls) == 1 + 2 + 4 * 3 and len(t.samples) == 4 and t.number == 3
    assert t.min <= t.median and t.spread >= 0 and t.first >= 0 and t.device == "cpu"


def test_time_fn_counts_calls():
    calls = []
    seconds = bench.time_fn(lambda: calls.append(1), warmup=2, repeat=5, number=1)
    assert len(calls) == 8 and seconds >= 0


def test_time_stats_chooses_n_to_fill_the_budget():
    t = bench.time_stats(lambda: torch.zeros(10), repeat=3, budget_s=0.03)
    assert t.number > 1 and len(t.samples) == 3


def test_infer_device_from_outputs():
    assert bench.infer_device(torch.zeros(1)) == torch.device("cpu")
    assert bench.infer_device(([1, {"x": torch.zeros(1, device="meta")}],)) == torch.device("meta")
    assert bench.infer_device(None, 3) is None
    assert bench.time_stats(lambda: torch.zeros(1, device="meta"), repeat=1, number=1).device == "meta"


def fake_clock(monkeypatch, calls, first_call_s=1e-3, call_s=1e-3):
    """The clock every timing reads (timeit's, which torch.utils.benchmark.timer reads too) advances
    by first_call_s during the first call and call_s during every other."""
    monkeypatch.setattr(timeit, "default_timer", lambda: (first_call_s + (len(calls) - 1) * call_s) if calls else 0.0)


def test_the_first_call_is_timed_apart_and_a_cpu_timing_never_synchronizes(monkeypatch):
    calls = []
    fake_clock(monkeypatch, calls, first_call_s=0.25)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: pytest.fail("synchronized a CPU timing"))
    t = bench.time_stats(lambda: calls.append(1), device="cpu", warmup=2, repeat=4, number=3)
    assert t.first == pytest.approx(0.25) and t.samples == pytest.approx([1e-3] * 4)
    assert len(calls) == 1 + 2 + 4 * 3


def test_gpu_samples_synchronize_once_at_each_end_never_between_calls(monkeypatch):
    calls, syncs = [], []
    fake_clock(monkeypatch, calls)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: syncs.append(len(calls)))
    t = bench.time_stats(lambda: calls.append(1), device="cuda", warmup=1, repeat=3, number=4)
    assert t.samples == pytest.approx([1e-3] * 3) and t.first == pytest.approx(1e-3) and t.number == 4
    # first call (0 -> 1), warm-up (1 -> 2), then 3 samples of 4 calls: a synchronize before each clock read
    assert syncs == [0, 1, 1, 2, 2, 6, 6, 10, 10, 14]


def test_unknown_device_synchronizes_only_a_gpu_in_use(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: syncs.append(1))
    bench.time_stats(lambda: None, warmup=0, repeat=1, number=1)
    assert syncs == []                                              # no GPU initialised: nothing to wait for
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    bench.time_stats(lambda: None, warmup=0, repeat=1, number=1)
    assert len(syncs) == 2 + 2                                       # first call and one sample, both ends
    syncs.clear()
    bench.time_stats(lambda: torch.zeros(1), warmup=0, repeat=1, number=1)
    assert len(syncs) == 1                                           # before the first call; then the output says CPU


def test_time_stats_rejects_bad_counts():
    with pytest.raises(ValueError, match="number must be a positive int, got 0"):
        bench.time_stats(lambda: None, number=0)
    with pytest.raises(ValueError, match="repeat must be a positive int, got 0"):
        bench.time_stats(lambda: None, repeat=0)
    with pytest.raises(ValueError, match="warmup must be a non-negative int, got -1"):
        bench.time_stats(lambda: None, warmup=-1)


# --------------------------------------------------------------------------- peaks and head sizes
@pytest.mark.parametrize("name, bf16, fp16, fp32, bandwidth", [
    ("Tesla T4", None, 65.0, 8.1, 320.0),                      # no bf16 tensor cores: fp16 only
    ("NVIDIA L4", 121.0, 121.0, 30.3, 300.0),
    ("NVIDIA A10G", 70.0, 70.0, 35.0, 600.0),
    ("NVIDIA A100-PCIE-40GB", 312.0, 312.0, 19.5, 1555.0),
    ("NVIDIA A100-SXM4-40GB", 312.0, 312.0, 19.5, 1555.0),
    ("NVIDIA A100 80GB PCIe", 312.0, 312.0, 19.5, 1935.0),
    ("NVIDIA A100-SXM4-80GB", 312.0, 312.0, 19.5, 2039.0),
    ("NVIDIA GeForce RTX 3090", 71.0, 71.0, 35.6, 936.0),
    ("NVIDIA GeForce RTX 4090", 165.2, 165.2, 82.6, 1008.0),
    ("NVIDIA H100 80GB HBM3", 989.4, 989.4, 67.0, 3350.0),
    ("NVIDIA H100 PCIe", 756.5, 756.5, 51.0, 2000.0),
    ("NVIDIA H100 NVL", 835.5, 835.5, 60.0, 3900.0),
    ("NVIDIA H200", 989.4, 989.4, 67.0, 4800.0),
    ("NVIDIA H200 NVL", None, None, None, None),                # another part: unknown, not guessed
    ("NVIDIA GeForce RTX 3090 Ti", None, None, None, None),     # a variant with other figures
    ("Some Future GPU", None, None, None, None),
])
def test_peaks_by_the_name_torch_reports(monkeypatch, name, bf16, fp16, fp32, bandwidth):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert bench.peak_tflops("cuda", torch.bfloat16) == bf16
    assert bench.peak_tflops("cuda", torch.float16) == fp16
    assert bench.peak_tflops("cuda", torch.float32) == fp32
    assert bench.peak_bandwidth_gbs("cuda") == bandwidth
    assert bench.describe_peak("cuda", torch.float16).startswith("unknown peak" if fp16 is None else f"peak {fp16:g}")
    row = bench.BenchRow(name="torch SDPA", seconds=1e-3, flops=1e12, ratio=1.0, max_abs_err=0.0, device=name,
                         dtype="bfloat16")
    row.peak_share = None if bf16 is None else 1.0 / bf16
    table = bench.format_table([row])
    assert ("unknown peak" in table) == (bf16 is None and fp16 is None) and "% peak" in table


@pytest.mark.parametrize("spelling, key", [
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"), ("A100 SXM4 80GB", "NVIDIA A100-SXM4-80GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"), ("NVIDIA A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"),
    ("NVIDIA H100 SXM5 80GB", "NVIDIA H100 80GB HBM3"), ("NVIDIA H100", "NVIDIA H100 80GB HBM3"),
    ("Tesla T4", "Tesla T4"), ("NVIDIA T4", "Tesla T4"), ("NVIDIA GeForce RTX 4090 D", None), ("NVIDIA A10", None),
    ("NVIDIA L40", None),
])
def test_spec_key_matches_spellings_of_one_part_and_no_other(spelling, key):
    assert bench.spec_key(spelling) == key


def test_every_listed_peak_names_its_source():
    for name, spec in bench.DEVICE_SPECS.items():
        assert bench.spec_key(name) == name
        assert "https://" in spec.source and any(w in spec.source for w in ("data sheet", "whitepaper", "Baseten"))
        assert spec.half_tflops > 0 and spec.memory_gbs > 0 and spec.fp32_tflops > 0
        assert spec.half_tflops > spec.fp32_tflops                  # tensor cores beat plain float32
    assert bench.peak_tflops("cpu") is None and bench.describe_peak("cpu") == "no peak (CPU)"


def test_a_cpu_table_has_no_peak_column_and_states_its_conventions(monkeypatch):
    rows = bench.compare_attention({"explicit": explicit}, B=1, H=2, L=32, D=8, device="cpu", budget_s=0.02)
    table = bench.format_table(rows)
    first, convention, header = table.splitlines()[:3]
    assert first.startswith("device: CPU") and "float32" in first and "SDPA backend: " in first
    assert "% peak" not in table and "FLOP/s" not in table and "spread" not in table
    assert "(1 = as fast, 2 = twice the time)" in convention and "vs SDPA" in header and "err (ulps)" in header
    named = bench.format_table(rows, versus="vs plain RoPE").splitlines()       # the column named after its reference
    assert named[1].startswith(f"vs plain RoPE = this row's time / {rows[0].name}'s") and "vs plain RoPE" in named[2]
    assert len(named[2]) == len(header) + len("vs plain RoPE") - 8               # only that column widens
    assert named[4].split()[-2] == table.splitlines()[4].split()[-2]             # the same ratio, read the same way
    mps = torch.backends.mps
    monkeypatch.setattr(mps, "is_available", lambda: True)                 # a Mac: the CPU, and the line says so
    assert "MPS is not tested" in bench.format_table(rows).splitlines()[0]


def test_cuda_heads_stay_within_the_fused_kernels():
    assert bench.max_head_dim("cuda") == bench.MAX_FUSED_HEAD_DIM == 256 and bench.max_head_dim("cpu") is None
    bench.check_head_dim(256, "cuda")
    bench.check_head_dim(2048, "cpu")
    with pytest.raises(ValueError, match="D=2048 > 256"):
        bench.check_head_dim(2048, "cuda")
    with pytest.raises(ValueError, match="D=512 > 256"):       # raised before any CUDA work
        bench.compare_attention({"explicit": explicit}, B=1, H=1, L=8, D=512, device="cuda")


def test_cpu_defaults_are_small_float32():
    sizes = bench.default_sizes("cpu")
    assert sizes["dtype"] == torch.float32 and sizes["L"] <= 1024
    assert bench.default_sizes("cuda")["D"] <= bench.MAX_FUSED_HEAD_DIM


# --------------------------------------------------------------------------- SDPA backend
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_backends_names_the_kernel_that_ran(device):
    q = torch.randn(1, 2, 16, 8, device=device)
    assert bench.sdpa_backends(lambda: explicit(q, q, q)) == []
    fused = bench.sdpa_backends(lambda: F.scaled_dot_product_attention(q, q, q))
    assert len(fused) == 1 and fused[0] in bench.SDPA_OPS.values()
    with sdpa_kernel(SDPBackend.MATH):
        assert bench.sdpa_backends(lambda: F.scaled_dot_product_attention(q, q, q)) == ["math"]


def test_compare_records_backends_when_asked():
    q = torch.randn(1, 2, 16, 8)
    rows = bench.compare({"sdpa": lambda: F.scaled_dot_product_attention(q, q, q), "explicit": lambda: explicit(q, q, q)},
                         reference="sdpa", record_backend=True, budget_s=0.01)
    assert rows[0].backend in bench.SDPA_OPS.values() and rows[1].backend == ""
    assert f"SDPA backend: {rows[0].backend}" in bench.format_table(rows).splitlines()[0]


# --------------------------------------------------------------------------- inputs on the device
@pytest.mark.parametrize("device", DEVICES)
def test_randn_draws_on_the_device_reproducibly(device):
    a = bench.randn(2, 3, device=device, dtype=torch.bfloat16, seed=1)
    assert a.device.type == device and a.dtype == torch.bfloat16
    assert torch.equal(a, bench.randn(2, 3, device=device, dtype=torch.bfloat16, seed=1))
    assert math.isfinite(a.float().sum().item())


def test_plot_rows():
    import matplotlib
    matplotlib.use("Agg")
    rows = bench.compare({"a": lambda: torch.ones(3), "b": lambda: torch.ones(3)}, reference="a", budget_s=0.01,
                         compute_dtypes={"b": torch.float64})
    ax = bench.plot_rows(rows)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b [float32 -> float64]", "a"]
    assert any(type(c).__name__ == "ErrorbarContainer" for c in ax.containers)   # each bar: its min-max range


def test_the_cuda_clock_synchronizes_without_torch_utils_benchmark(monkeypatch):
    """A GPU timing waits for the device, and needs no setuptools (which torch.utils.benchmark imports and a
    bare GPU machine's Python may lack): the clock synchronizes the device itself."""
    calls = []
    synchronizes = torch.accelerator if hasattr(getattr(torch, "accelerator", None), "synchronize") else torch.cuda
    monkeypatch.setattr(synchronizes, "synchronize", lambda *args: calls.append(args))
    monkeypatch.setitem(sys.modules, "torch.utils.benchmark", None)     # importing it would now fail
    clock = bench._clock(torch.device("cuda"))
    assert isinstance(clock(), float) and len(calls) == 1
    assert bench._clock(torch.device("cpu")) is timeit.default_timer
