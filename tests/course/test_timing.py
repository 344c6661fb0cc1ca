"""The timing decision (``selfattn_lite.course.timing``) on the GPUs learners have, driven on a CPU.

Each device is faked by the properties torch reports for it (name, compute capability, total memory,
multiprocessor count); ``timing_setup`` then reads them through ``torch.cuda`` exactly as on the real
card. For every notebook and device: the dtype, and every row either fits the memory budget by its
memory model or is skipped with one line. The memory models are checked against measured peaks on
the CPU, and one notebook's timing cell runs on the CPU under a faked GPU decision.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from selfattn_lite.course import bench, gpu_sections, memory, timing

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30

# name, (major, minor), total_memory in bytes as torch reports it, SM count
GPUS = {
    "T4": ("Tesla T4", (7, 5), 15_828_320_256, 40),                       # Colab's: 15 GiB usable
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", (8, 0), 42_298_834_944, 108),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", (8, 0), 85_094_891_520, 108),
    "RTX 3090": ("NVIDIA GeForce RTX 3090", (8, 6), 25_447_170_048, 82),
    "RTX 4090": ("NVIDIA GeForce RTX 4090", (8, 9), 25_386_352_640, 128),
    "L4": ("NVIDIA L4", (8, 9), 23_580_639_232, 58),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 85_031_714_816, 132),
    "H200": ("NVIDIA H200", (9, 0), 150_109_880_320, 132),
}
NOTEBOOKS = sorted(timing.PROBLEMS)


def fake_gpu(monkeypatch, key: str) -> None:
    name, (major, minor), total, sms = GPUS[key]
    props = SimpleNamespace(name=name, major=major, minor=minor, total_memory=total, multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def fake_mac(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


# --------------------------------------------------------------------------- every notebook on every GPU
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_row_fits_the_budget_or_is_skipped_with_one_line(monkeypatch, capsys, gpu, notebook):
    fake_gpu(monkeypatch, gpu)
    name, capability, total, _ = GPUS[gpu]
    plan = timing.timing_setup(notebook)
    problem = timing.PROBLEMS[notebook]
    if problem.cpu_only:
        assert plan.device.type == "cpu" and plan.dtype == torch.float32 and plan.sizes == problem.cpu
        assert problem.cpu_only in plan.device_line()
        return
    assert plan.device.type == "cuda" and plan.info.name == name
    assert plan.dtype == (torch.bfloat16 if capability >= (8, 0) else torch.float16)
    assert plan.budget == int(0.8 * total) - GiB                            # the margin: 20 % and 1 GiB
    assert plan.sizes in [dict(c) for c in problem.cuda]
    e = torch.empty((), dtype=plan.dtype).element_size()
    points = plan.ns or (None,)
    for row in problem.rows:
        for n in points:
            at = dict(plan.sizes, L=n) if n is not None else plan.sizes
            at = {k: v for k, v in at.items() if k != "ns"} if n is not None else at
            need = row.memory(at, e)
            assert plan.fits(row.name, **({"L": n} if n is not None else {})) == (need <= plan.budget), (row.name, n)
        if not plan.fits(row.name) or row.name in plan.skipped:
            line = plan.skipped[row.name]
            assert "\n" not in line and line.startswith(f"skipped: {row.name}") and name in line
            assert "GiB" in line and "needs" in line
    kept = plan.runnable({row.name: None for row in problem.rows})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(problem.rows) - len(kept)                    # one line per row left out
    assert kept or not problem.rows
    # a row is dropped only when even the smallest candidate is too big for it
    if any(not plan.fits(r.name) for r in problem.rows):
        assert plan.sizes == dict(problem.cuda[-1])
    # the reference row (the first: SDPA or the module torch ships) always runs
    assert plan.fits(problem.rows[0].name, **({"L": max(points)} if plan.ns else {}))


@pytest.mark.parametrize("gpu", GPUS)
def test_the_largest_gpus_keep_the_full_sizes_and_small_ones_shrink_the_large_rows(monkeypatch, gpu):
    fake_gpu(monkeypatch, gpu)
    plans = timing.plans()
    budget = plans["nb01"].budget
    full = {nb: dict(timing.PROBLEMS[nb].cuda[0]) for nb in NOTEBOOKS if timing.PROBLEMS[nb].cuda}
    if gpu in ("H100", "H200", "A100-80GB"):
        assert all(plans[nb].sizes == full[nb] for nb in full) and budget > 60 * GiB
        assert not any(p.skipped for p in plans.values())                   # even explicit at n = 16384 fits
    if gpu == "T4":
        assert plans["nb07"].sizes["B"] == 1                                 # 26 GiB of scores at B = 4
        assert plans["nb08"].skipped_at == {"explicit (selfattn_lite)": (8192, 16384)}
        assert plans["nb06"].sizes == full["nb06"] and plans["nb01"].sizes == full["nb01"]
    if gpu in ("RTX 3090", "RTX 4090", "L4"):
        assert plans["nb07"].sizes["B"] == 2
        assert plans["nb08"].skipped_at == {"explicit (selfattn_lite)": (16384,)}
    kernels = gpu_sections.kernel_sizes()
    assert kernels == gpu_sections.KERNEL_SIZES                               # the quick report's sizes fit every GPU
    assert plans["kernels"].fits("kernel")


def test_the_quick_report_on_the_h200_keeps_its_sizes(monkeypatch):
    fake_gpu(monkeypatch, "H200")
    assert gpu_sections.kernel_sizes() == dict(B=4, H=16, N=4096)
    ctx = gpu_sections.Context(device=torch.device("cuda"), tiny=False)
    assert ctx.dtype == torch.bfloat16 and ctx.sizes("nb01", ("B", "H", "L", "D"), ()) == (2, 16, 4096, 128)
    fake_gpu(monkeypatch, "T4")
    assert gpu_sections.Context(device=torch.device("cuda"), tiny=False).dtype == torch.float16


# --------------------------------------------------------------------------- CPUs and Macs
CPU_SIZES = {   # what every notebook's timing cell used on a CPU before the decision moved into one table
    "nb01": dict(B=1, H=8, L=512, D=64), "nb03": dict(B=1, H=4, L=2048, D=64), "nb04": dict(B=8, T=256, d=512, h=8),
    "nb06": dict(B=4, H=8, S=4096, D=64, L=1), "nb07": dict(B=1, H=8, Hkv=2, L=512, D=64),
    "nb08": dict(B=1, H=8, D=64, ns=(256, 512, 1024)), "nb09": dict(B=1, H=8, Hkv=2, L=512, D=64),
    "nb10": dict(batch=4), "nb11": dict(B=1, H=8, L=512, D=64), "nb15": dict(B=1, H=2, L=64, D=32),
    "nb16": dict(h=8, dh=64, Ss=(256, 1024, 4096)),
}


@pytest.mark.parametrize("mac", [False, True])
def test_on_a_cpu_or_a_mac_the_timing_stays_on_the_cpu_at_the_cpu_sizes(monkeypatch, mac):
    if mac:
        fake_mac(monkeypatch)
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for nb in NOTEBOOKS:
        plan = timing.timing_setup(nb)
        assert plan.device == torch.device("cpu") and plan.dtype == torch.float32 and plan.budget is None
        assert not plan.skipped and plan.runnable({"x": 1}) == {"x": 1}
        assert ("MPS is not tested" in plan.device_line()) == mac
        if nb in CPU_SIZES:
            assert plan.sizes == CPU_SIZES[nb]
    assert bench.default_sizes("cpu") == dict(B=1, H=8, L=512, S=512, D=64, dtype=torch.float32)


def test_unknown_notebooks_are_refused():
    with pytest.raises(ValueError, match="notebook must be one of"):
        timing.timing_setup("nb99")


def test_every_timed_notebook_asks_the_plan():
    """Each notebook with a timing problem calls timing.timing_setup("nbNN") and hard-codes no CUDA sizes."""
    for nb in NOTEBOOKS:
        if nb == "kernels" or timing.PROBLEMS[nb].cpu_only:
            continue
        path = next((ROOT / "notebooks").glob(f"{nb[2:]}_*.ipynb"))
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f'timing.timing_setup("{nb}")' in code, path.name
        assert 'device.type == "cuda"' not in code and "torch.bfloat16 if" not in code, path.name


# --------------------------------------------------------------------------- the memory models
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gqa", [False, True])
def test_the_explicit_memory_model_bounds_the_measured_peak(dtype, gqa):
    from selfattn_lite import scaled_dot_product_attention

    s = dict(B=1, H=4, Hkv=2 if gqa else 4, L=256, D=32)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 256, 32, generator=gen).to(dtype)
    k, v = (torch.randn(1, s["Hkv"], 256, 32, generator=gen).to(dtype) for _ in range(2))
    peak = memory.peak_memory(lambda: scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)[0])
    inputs = sum(t.numel() * t.element_size() for t in (q, k, v))           # held before the call
    model = timing.explicit(s, q.element_size())
    assert peak + inputs <= model <= 1.5 * (peak + inputs)                   # an upper bound, and not a loose one


def test_the_scores_dominate_at_the_sizes_that_matter():
    s, e = dict(B=4, H=32, Hkv=8, L=4096, D=128), 2                          # notebook 07's full size in bf16
    assert timing.explicit(s, e) > 3 * 4 * 4 * 32 * 4096 * 4096 == 24 * GiB  # three float32 (B, H, L, L) tensors
    assert timing.sdpa(s, e) < GiB


# --------------------------------------------------------------------------- a timing cell under a GPU decision
def cell_source(notebook: str, cell_id: str) -> str:
    path = next((ROOT / "notebooks").glob(f"{notebook}_*.ipynb"))
    cell = next(c for c in json.loads(path.read_text())["cells"] if c.get("id") == cell_id)
    return "".join(cell["source"])


@pytest.mark.parametrize("budget, skipped", [(None, False), (1, True)])
def test_notebook_07s_timing_cell_runs_the_gpu_path_on_the_cpu(monkeypatch, capsys, budget, skipped):
    """The T4's decision (float16, its budget), with the device and sizes moved to the CPU: the cell times the
    half-precision path, and where the budget is too small the explicit row is left out with one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    import selfattn_lite as sal

    fake_gpu(monkeypatch, "T4")
    gpu_plan = timing.timing_setup("nb07")
    assert gpu_plan.dtype == torch.float16 and gpu_plan.on_gpu
    small = dict(B=1, H=4, Hkv=2, L=64, D=16)
    plan = timing.TimingPlan(gpu_plan.problem, gpu_plan.info, torch.device("cpu"), gpu_plan.dtype, small,
                             gpu_plan.budget)
    if skipped:
        plan.skipped["selfattn_lite (explicit)"] = "skipped: selfattn_lite (explicit) needs more than 1 byte"
    monkeypatch.setattr(timing, "timing_setup", lambda notebook, info=None: plan)
    monkeypatch.setattr(plt, "show", lambda: None)
    namespace = dict(torch=torch, F=F, sal=sal, bench=bench, plt=plt)
    exec(compile(cell_source("07", "d6dc1620"), "nb07 timing cell", "exec"), namespace)
    out = capsys.readouterr().out
    rows = namespace["rows"]
    assert rows[0].dtype == "float16" and out.startswith(
        "skipped: selfattn_lite (explicit)" if skipped else "device: ")
    assert [r.name for r in rows] == ["torch SDPA (enable_gqa)"] + ([] if skipped else ["selfattn_lite (explicit)"])
    assert "SDPA backend: " in out and "vs SDPA" in out
    assert out.count("skipped:") == int(skipped)
    plt.close("all")


def test_notebook_03s_timing_cells_run_the_gpu_path_on_the_cpu(monkeypatch, capsys):
    """An H100's decision (bfloat16), with the device and sizes moved to the CPU: the tile count of the first cell
    holds at a length with one key block, and the second times the three rows and prints the three measured ratios."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    import selfattn_lite as sal
    from selfattn_lite import masks

    fake_gpu(monkeypatch, "H100")
    gpu_plan = timing.timing_setup("nb03")
    assert gpu_plan.dtype == torch.bfloat16 and gpu_plan.on_gpu
    plan = timing.TimingPlan(gpu_plan.problem, gpu_plan.info, torch.device("cpu"), gpu_plan.dtype,
                             dict(B=1, H=2, L=64, D=16), gpu_plan.budget)
    monkeypatch.setattr(timing, "timing_setup", lambda notebook, info=None: plan)
    monkeypatch.setattr(plt, "show", lambda: None)
    namespace = dict(torch=torch, F=F, sal=sal, bench=bench, plt=plt, math=math, masks=masks)
    for cell_id in ("c3tiles0", "57b89378"):
        exec(compile(cell_source("03", cell_id), f"nb03 cell {cell_id}", "exec"), namespace)
    out = capsys.readouterr().out
    assert namespace["computed"] == namespace["tiles"] == 2       # 64 queries in blocks of 32, one key block
    assert [r.name for r in namespace["rows"]] == ["torch SDPA, is_causal=True", "explicit + bool mask",
                                                   "torch SDPA + bool mask"]
    assert namespace["rows"][0].dtype == "bfloat16"
    assert all(f"{ratio}: median" in out for ratio in ("no mask / is_causal", "bool mask / is_causal",
                                                        "bool mask / no mask"))   # interleaved rounds
    plt.close("all")
