import pytest
import torch

from selfattn_lite import bench
from selfattn_lite import scaled_dot_product_attention as sdpa


def test_attention_flops_formula():
    assert bench.attention_flops(2, 8, 128, 256, 64) == 4 * 2 * 8 * 128 * 256 * 64
    assert bench.attention_flops(2, 8, 128, 256, 64, causal=True) == 2 * 2 * 8 * 128 * 256 * 64


def test_compare_attention_rows_on_cpu():
    def explicit(q, k, v, is_causal=False):
        return sdpa(q, k, v, is_causal=is_causal)[0]

    rows = bench.compare_attention({"explicit": explicit}, B=1, H=2, L=64, D=16, causal=True, budget_s=0.05)
    assert [r.name for r in rows] == ["torch SDPA", "explicit"]
    assert rows[0].ratio == 1.0 and rows[1].ratio == pytest.approx(rows[1].seconds / rows[0].seconds)
    assert rows[1].flops == bench.attention_flops(1, 2, 64, 64, 16, causal=True)
    assert rows[1].max_abs_err < 1e-5 and rows[0].max_abs_err == 0
    assert rows[0].dtype == "float32" and rows[0].peak_share is None
    table = bench.format_table(rows)
    assert "torch SDPA" in table and "explicit" in table and "GFLOP/s" in table


def test_compare_refuses_to_time_a_wrong_answer():
    with pytest.raises(AssertionError, match="wrong disagrees with torch SDPA"):
        bench.compare_attention({"wrong": lambda q, k, v, is_causal=False: v}, B=1, H=1, L=8, D=4)


def test_compare_needs_a_known_reference():
    with pytest.raises(ValueError, match="reference 'x' is not one of"):
        bench.compare({"a": lambda: torch.zeros(1)}, reference="x")


def test_cpu_defaults_are_small_float32():
    sizes = bench.default_sizes("cpu")
    assert sizes["dtype"] == torch.float32 and sizes["L"] <= 1024


def test_peak_lookup_by_device_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert bench.peak_tflops("cuda", torch.bfloat16) == 989.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert bench.peak_tflops("cuda", torch.bfloat16) == 756.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert bench.peak_tflops("cuda", torch.bfloat16) == 312.0
    assert bench.peak_tflops("cuda", torch.float32) is None
    assert bench.peak_tflops("cpu") is None


def test_time_fn_counts_calls():
    calls = []
    seconds = bench.time_fn(lambda: calls.append(1), warmup=2, repeat=5)
    assert len(calls) == 7 and seconds >= 0


def test_plot_rows():
    import matplotlib
    matplotlib.use("Agg")
    rows = bench.compare({"a": lambda: torch.ones(3), "b": lambda: torch.ones(3)}, reference="a", budget_s=0.01)
    ax = bench.plot_rows(rows)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a"]
