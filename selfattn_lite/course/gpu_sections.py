"""Each notebook's timing comparison, restated at full size for ``make gpu-report``.

A notebook's last cell times what it taught against torch's fused SDPA at sizes a CPU can run
in seconds. Here is the same comparison (the same implementations under the same row names;
``tests/course/test_gpu_report.py`` checks the names against each notebook's last cell) at the sizes
that cell uses on this GPU (``timing.timing_setup``: bfloat16 from compute capability 8.0, float16
below, the largest sizes that fit the GPU's memory), with the inputs drawn on the device. Every function
takes a ``Context`` (device, dtype, tiny sizes or full, time budget) and returns a JSON-able dict:

* ``rows``: ``bench.BenchRow`` fields per implementation (median/min/spread, FLOPs per row,
  compute dtype, SDPA backend, error in ulps against the reference row);
* ``fp32_check``: each row's output against the float32 reference computed from the same
  (rounded) inputs, in ulps of the timing dtype at the reference's magnitude, and whether all are
  within ``bench.DEFAULT_ULPS`` (a section whose check fails still records its rows, then raises).

With ``ctx.tiny`` (the dry run on a CPU) the same code runs at sizes that take milliseconds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention as explicit_sdpa
from . import bench, timing

__all__ = ["Context", "row_dicts", "triton_d64", "triton_d128", "tiled", "nb01", "nb02", "nb03", "nb04", "nb05",
           "nb06", "nb07", "nb08", "nb09", "nb10", "nb11", "nb16"]

DTYPE = torch.bfloat16          # the dry run's dtype (and the GPU's, from compute capability 8.0)
FP32 = torch.float32


@dataclass
class Context:
    """Where and how big: ``tiny`` picks the dry-run sizes; ``budget_s`` is per timed row; ``timeout_s``
    is the section's; ``checkpoint(result)`` saves the rows measured so far (kept if the section times out).

    ``dtype``: the GPU's timing dtype (``timing.timing_dtype``); bfloat16 in a dry run. ``plan(notebook)``:
    that notebook's timing decision on this device (``timing.timing_setup``), ``sizes(...)`` its sizes.
    """

    device: torch.device
    tiny: bool
    budget_s: float = 0.3
    timeout_s: float = 600.0
    checkpoint: Callable[[dict], None] = lambda result: None

    def pick(self, full, tiny):
        return tiny if self.tiny else full

    @property
    def dtype(self) -> torch.dtype:
        if self.tiny or self.device.type != "cuda":
            return DTYPE
        return timing.timing_dtype(timing.DeviceInfo.probe())

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def plan(self, notebook: str) -> timing.TimingPlan:
        """The notebook's timing plan on this GPU (every row fits its memory, or is skipped with one line)."""
        return timing.timing_setup(notebook)

    def sizes(self, notebook: str, names: tuple[str, ...], tiny: tuple):
        """The plan's sizes ``names`` for ``notebook`` on this GPU, or ``tiny`` in a dry run."""
        if self.tiny:
            return tiny
        sizes = self.plan(notebook).sizes
        return tuple(sizes[n] for n in names)

    def runnable(self, notebook: str, calls: dict) -> dict:
        """``calls`` without the rows that do not fit this GPU (one printed line each); all of them in a dry run."""
        return calls if self.tiny else self.plan(notebook).runnable(calls)


def row_dicts(rows: list[bench.BenchRow]) -> list[dict]:
    """BenchRows as JSON-able dicts, with the derived ms and TFLOP/s."""
    return [asdict(r) | dict(ms=r.ms, tflops=r.tflops) for r in rows]


def _inputs(ctx: Context, *shapes, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator(device=ctx.device).manual_seed(seed)
    return [bench.randn(*s, device=ctx.device, dtype=ctx.dtype, generator=gen) for s in shapes]


def _fp32_check(outputs: dict[str, torch.Tensor], reference: torch.Tensor, ulps: float | None = None,
                dtype: torch.dtype = DTYPE) -> dict:
    """Each output's max error against the float32 reference, in ulps of ``dtype`` at the reference's magnitude."""
    bound = bench.DEFAULT_ULPS[dtype] if ulps is None else ulps
    errors = {name: bench.error_ulps(out, reference, dtype) for name, out in outputs.items()}
    return dict(reference="float32, same rounded inputs", bound_ulps=bound, ulps=errors,
                passed=all(e <= bound for e in errors.values()))


def _run(ctx: Context, calls: dict, reference_fp32, *, reference: str, flops=None, compute=(), ulps=None,
         extra: dict | None = None, compare_kw: dict | None = None) -> dict:
    """Check every call against the float32 reference, then ``bench.compare`` them; one result dict."""
    with torch.no_grad():
        ref32 = reference_fp32()
        outputs = {name: bench.first_output(fn()) for name, fn in calls.items()}
        check = _fp32_check(outputs, ref32, ulps, ctx.dtype)
        del outputs, ref32
    rows = bench.compare(calls, reference=reference, flops=flops, device=ctx.device, budget_s=ctx.budget_s,
                         compute_dtypes={name: FP32 for name in compute if name in calls}, record_backend=True,
                         **(compare_kw or {}))
    return dict(rows=row_dicts(rows), fp32_check=check, **(extra or {}))


def _explicit(q, k, v, **kw):
    return explicit_sdpa(q, k, v, **kw)[0]


# --------------------------------------------------------------------------------------------- 01, 02
def _plain_attention(ctx: Context, B, H, L, S, D, *, name="selfattn_lite (explicit)", notebook="nb01") -> dict:
    bench.check_head_dim(D, ctx.device)
    q, k, v = _inputs(ctx, (B, H, L, D), (B, H, S, D), (B, H, S, D))
    calls = ctx.runnable(notebook, {"torch SDPA": lambda: F.scaled_dot_product_attention(q, k, v),
                                    name: lambda: _explicit(q, k, v)})
    return _run(ctx, calls, lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float()),
                reference="torch SDPA", flops=bench.attention_flops(B, H, L, S, D), compute=[name],
                extra=dict(sizes=dict(B=B, H=H, L=L, S=S, D=D)))


def nb01(ctx: Context) -> dict:
    """Explicit attention against torch SDPA, not causal (notebook 01's last cell)."""
    B, H, L, D = ctx.sizes("nb01", ("B", "H", "L", "D"), (1, 2, 64, 16))
    return _plain_attention(ctx, B, H, L, L, D)


def nb02(ctx: Context) -> dict:
    """The 3-token example's shape, then a realistic one (notebook 02's last cell)."""
    tiny = _plain_attention(ctx, 1, 1, 1, 3, 2)
    full = nb01(ctx)
    return dict(rows=tiny["rows"] + full["rows"], fp32_check=dict(
        tiny=tiny["fp32_check"], full=full["fp32_check"],
        passed=tiny["fp32_check"]["passed"] and full["fp32_check"]["passed"]))


# --------------------------------------------------------------------------------------------- 03
def nb03(ctx: Context) -> dict:
    """Causal attention: is_causal (skips the masked half) vs a boolean mask (computes every score)."""
    B, H, L, D = ctx.sizes("nb03", ("B", "H", "L", "D"), (1, 2, 64, 16))
    q, k, v = _inputs(ctx, *[(B, H, L, D)] * 3)
    causal = torch.ones(L, L, dtype=torch.bool, device=ctx.device).tril()
    calls = {"torch SDPA, is_causal=True": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "explicit + bool mask": lambda: _explicit(q, k, v, attn_mask=causal),
             "torch SDPA + bool mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=causal)}
    calls = ctx.runnable("nb03", calls)
    full, half = bench.attention_flops(B, H, L, L, D), bench.attention_flops(B, H, L, L, D, is_causal=True)
    flops = {"torch SDPA, is_causal=True": half, "explicit + bool mask": full, "torch SDPA + bool mask": full}
    return _run(ctx, calls, lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True),
                reference="torch SDPA, is_causal=True", flops=flops, compute=["explicit + bool mask"])


# --------------------------------------------------------------------------------------------- 04
def nb04(ctx: Context) -> dict:
    """One wide head vs narrow heads (heads <= 256 on CUDA), and our module vs nn.MultiheadAttention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..multihead import MultiHeadAttention

    # same FLOPs in one head of 256 or four of 64: both within the fused kernels' head sizes
    B, T, d, h = ctx.pick((32, 4096, 256, 4), (2, 32, 32, 4))
    x, = _inputs(ctx, (B, T, d))
    heads = {}

    def flash_or_efficient(q):           # one kernel for both shapes: cuDNN is tried first on sm_90/sm_10x
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, q, q)

    for n_heads in (1, h):
        q = x.view(B, T, n_heads, d // n_heads).transpose(1, 2).contiguous()       # (B, h, T, d/h)
        bench.check_head_dim(d // n_heads, ctx.device)
        heads[n_heads] = dict(timing=bench.time_stats(lambda q=q: flash_or_efficient(q),
                                                      device=ctx.device, budget_s=ctx.budget_s).median,
                              backend=bench.sdpa_backends(lambda q=q: flash_or_efficient(q)))
    heads_result = {f"{n} x {d // n}": dict(ms=1e3 * r["timing"], backend=r["backend"]) for n, r in heads.items()}

    Bt, Tt, dt, ht = ctx.sizes("nb04", ("B", "T", "d", "h"), (2, 32, 64, 4))
    xt, = _inputs(ctx, (Bt, Tt, dt), seed=1)
    torch.manual_seed(0)
    torch_mha = nn.MultiheadAttention(dt, ht, batch_first=True, device=ctx.device, dtype=ctx.dtype).eval()
    our_mha = MultiHeadAttention.from_torch(torch_mha).eval()
    mha32 = copy.deepcopy(torch_mha).float()
    flops = 4 * 2 * Bt * Tt * dt * dt + bench.attention_flops(Bt, ht, Tt, Tt, dt // ht)   # 4 projections + attention
    calls = {"nn.MultiheadAttention": lambda: torch_mha(xt, xt, xt, need_weights=False)[0],
             "nn.MHA, need_weights=True": lambda: torch_mha(xt, xt, xt, need_weights=True)[0],
             "ours, fused SDPA": lambda: our_mha(xt)[0],
             "ours, need_weights=True": lambda: our_mha(xt, need_weights=True)[0]}
    calls = ctx.runnable("nb04", calls)
    x32 = xt.float()
    # a whole module in bf16 (projections rounded too) is further from float32 than one attention
    return _run(ctx, calls, lambda: mha32(x32, x32, x32, need_weights=False)[0], reference="nn.MultiheadAttention",
                flops=flops, compute=["ours, need_weights=True"], ulps=64,
                extra=dict(heads=heads_result, sizes=dict(B=Bt, T=Tt, d=dt, h=ht)), compare_kw=dict(ulps=64))


# --------------------------------------------------------------------------------------------- 05
def nb05(ctx: Context) -> dict:
    """Causal attention with and without rotating q and k by RoPE."""
    from ..positions import RotaryEmbedding

    B, H, T, D = ctx.sizes("nb05", ("B", "H", "L", "D"), (1, 2, 64, 16))
    q, k, v = _inputs(ctx, *[(B, H, T, D)] * 3)
    rope = RotaryEmbedding(D).to(ctx.device)
    positions = torch.arange(T, device=ctx.device)
    q_rot, k_rot = rope(q, positions), rope(k, positions)

    def rotate():
        return rope(q, positions), rope(k, positions)

    calls = {"torch SDPA (q, k pre-rotated)": lambda: F.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True),
             "RoPE + torch SDPA": lambda: F.scaled_dot_product_attention(*rotate(), v, is_causal=True),
             "RoPE + selfattn_lite SDPA": lambda: _explicit(*rotate(), v, is_causal=True)}
    calls = ctx.runnable("nb05", calls)
    half, full = bench.attention_flops(B, H, T, T, D, is_causal=True), bench.attention_flops(B, H, T, T, D)
    flops = {"torch SDPA (q, k pre-rotated)": half, "RoPE + torch SDPA": half, "RoPE + selfattn_lite SDPA": full}
    rotation = bench.time_stats(rotate, device=ctx.device, budget_s=ctx.budget_s)
    return _run(ctx, calls, lambda: F.scaled_dot_product_attention(q_rot.float(), k_rot.float(), v.float(),
                                                                   is_causal=True),
                reference="torch SDPA (q, k pre-rotated)", flops=flops, compute=["RoPE + selfattn_lite SDPA"],
                extra=dict(rotation_ms=1e3 * rotation.median))


# --------------------------------------------------------------------------------------------- 06
def nb06(ctx: Context) -> dict:
    """One decode step's attention over a full KV cache (memory-bound: GB/s, not FLOP/s)."""
    from ..kv_cache import KVCache

    B, H, S, D = ctx.sizes("nb06", ("B", "H", "S", "D"), (2, 2, 128, 16))
    q, k, v = _inputs(ctx, (B, H, 1, D), (B, H, S, D), (B, H, S, D))    # drawn on the device: no 4 GiB host copy
    cache = KVCache(B, H, S, D, dtype=ctx.dtype, device=ctx.device)
    k_all, v_all = cache.update(k, v)
    del k, v
    calls = ctx.runnable("nb06", {"torch SDPA": lambda: F.scaled_dot_product_attention(q, k_all, v_all),
                                  "selfattn_lite (explicit)": lambda: _explicit(q, k_all, v_all)})
    result = _run(ctx, calls, lambda: F.scaled_dot_product_attention(q.float(), k_all.float(), v_all.float()),
                  reference="torch SDPA", flops=bench.attention_flops(B, H, 1, S, D),
                  compute=["selfattn_lite (explicit)"])
    read = 2 * B * H * S * D * k_all.element_size()
    result["cache_read_bytes"] = read
    result["sdpa_gb_per_s"] = read / (result["rows"][0]["seconds"]) / 1e9
    return result


# --------------------------------------------------------------------------------------------- 07, 09
def _gqa(ctx: Context, B, Hq, Hkv, L, D, names: dict, notebook: str) -> dict:
    q, k, v = _inputs(ctx, (B, Hq, L, D), (B, Hkv, L, D), (B, Hkv, L, D))
    g = Hq // Hkv
    impls = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
             "repeat": lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1),
                                                              v.repeat_interleave(g, dim=1), is_causal=True),
             "explicit": lambda: _explicit(q, k, v, is_causal=True, enable_gqa=True)}
    calls = ctx.runnable(notebook, {names[key]: impls[key] for key in names})
    half, full = bench.attention_flops(B, Hq, L, L, D, is_causal=True), bench.attention_flops(B, Hq, L, L, D)
    flops = {names[key]: full if key == "explicit" else half for key in names}
    return _run(ctx, calls, lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                                   enable_gqa=True),
                reference=names["sdpa"], flops=flops, compute=[names["explicit"]],
                extra=dict(sizes=dict(B=B, Hq=Hq, Hkv=Hkv, L=L, D=D)))


def nb07(ctx: Context) -> dict:
    """Causal GQA 32:8 (notebook 07's last cell)."""
    B, Hq, Hkv, L, D = ctx.sizes("nb07", ("B", "H", "Hkv", "L", "D"), (1, 4, 2, 64, 16))
    return _gqa(ctx, B, Hq, Hkv, L, D, {"sdpa": "torch SDPA (enable_gqa)", "explicit": "selfattn_lite (explicit)"},
                "nb07")


def nb09(ctx: Context) -> dict:
    """GQA read directly vs copied with repeat_interleave (notebook 09's last cell)."""
    B, H, T, D = ctx.sizes("nb09", ("B", "H", "L", "D"), (1, 4, 64, 16))
    return _gqa(ctx, B, H, H // 4, T, D, {"sdpa": "SDPA enable_gqa=True", "repeat": "repeat_interleave + SDPA",
                                          "explicit": "selfattn_lite (explicit, gqa)"}, "nb09")


# --------------------------------------------------------------------------------------------- 08
def nb08(ctx: Context) -> dict:
    """Notebook 08's benchmark: explicit, tiled and fused attention up to 16k tokens, time and memory."""
    from . import bench_efficient

    plan = None if ctx.tiny else ctx.plan("nb08")

    def fits(name: str, n: int) -> bool:
        return plan is None or plan.fits(name, L=n)

    if plan is not None:
        plan.print_skips()
    ns = ctx.pick(list(plan.ns) if plan else None, [64, 128])
    B, H, D = ctx.sizes("nb08", ("B", "H", "D"), (1, 2, 16))
    records = bench_efficient.measure(ns, B=B, H=H, D=D, dtype=ctx.dtype, device=ctx.device, budget_s=ctx.budget_s,
                                      fits=fits)
    checks = {}
    for n in (ns[0], ns[-1]):
        q, k, v = bench_efficient.attention_inputs(B, H, n, D, dtype=ctx.dtype, device=ctx.device)
        calls = bench_efficient.implementations(q, k, v, explicit=fits(bench_efficient.EXPLICIT, n))
        with torch.no_grad():
            ref32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            try:
                outputs = {name: fn() for name, fn in calls.items()}
            except torch.cuda.OutOfMemoryError:
                outputs = {name: fn() for name, fn in calls.items() if name != bench_efficient.EXPLICIT}
            checks[str(n)] = _fp32_check(outputs, ref32, dtype=ctx.dtype)
        del q, k, v, calls, ref32, outputs
    return dict(records=records, config=dict(B=B, H=H, D=D, dtype=ctx.dtype_name, ns=ns),
                fp32_check=dict(by_n=checks, passed=all(c["passed"] for c in checks.values())))


# --------------------------------------------------------------------------------------------- 10
def nb10(ctx: Context) -> dict:
    """all-MiniLM-L6-v2's forward in bf16: fused SDPA vs explicit with weights."""
    from .. import encoder

    batch, = ctx.sizes("nb10", ("batch",), (2,))
    model32 = copy.deepcopy(encoder.load_minilm()).to(ctx.device)
    timed = copy.deepcopy(model32).to(dtype=ctx.dtype)
    ids, padding, _ = encoder.tokenize(["The cat sat on the mat because it was tired"] * batch)
    ids, padding = ids.to(ctx.device), padding.to(ctx.device)
    calls = {"encoder, fused SDPA": lambda: timed(ids, key_padding_mask=padding)[0],
             "encoder, explicit + weights": lambda: timed(ids, key_padding_mask=padding, need_weights=True)[0]}
    # six bf16 layers: the notebook's own tolerance (atol 0.1, rtol 0.05), not a per-op ulp bound
    result = _run(ctx, calls, lambda: model32(ids, key_padding_mask=padding)[0], reference="encoder, fused SDPA",
                  ulps=256, compare_kw=dict(atol=0.1, rtol=0.05))
    return result


# --------------------------------------------------------------------------------------------- Part II
def nb11(ctx: Context) -> dict:
    """Notebook 11's training benchmark: forward + backward of explicit, tiled and fused attention, time and
    peak memory, causal and not, at growing n (gradients checked against SDPA's before timing)."""
    from . import bench_backward

    ns = ctx.pick([1024, 2048, 4096, 8192], [64, 128])
    B, H, D = ctx.pick((1, 8, 64), (1, 2, 16))            # notebook 11's target shape: B = 1, h = 8, dk = 64
    records = {str(causal): bench_backward.measure(ns, B=B, H=H, D=D, dtype=ctx.dtype, device=ctx.device,
                                                   is_causal=causal, budget_s=ctx.budget_s)
               for causal in (False, True)}
    return dict(records=records, config=dict(B=B, H=H, D=D, dtype=ctx.dtype_name, ns=ns))


# --------------------------------------------------------------------------------------------- quick: kernels vs SDPA
# The sizes of the quick report's kernel comparison: B = 4, H = 16, N = 4096 (causal and not) where they fit
# (``timing.PROBLEMS["kernels"]``: every GPU from 40 GB; a smaller batch on a 16 or 24 GB card).
KERNEL_SIZES = dict(B=4, H=16, N=4096)
TINY_KERNEL_SIZES = dict(B=1, H=2, N=64)


def kernel_sizes(info: timing.DeviceInfo | None = None) -> dict:
    """B, H, N of the kernel comparison on this GPU (``timing.timing_setup("kernels")``)."""
    sizes = timing.timing_setup("kernels", info).sizes
    return dict(B=sizes["B"], H=sizes["H"], N=sizes["L"])


def _sdpa(q, k, v, is_causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _timed_pair(ctx: Context, fn, q, k, v, d_out, is_causal: bool) -> dict:
    """Forward and backward of ``fn(q, k, v, is_causal)`` timed apart, with their outputs.

    The backward is timed alone: one forward keeps its graph, then ``torch.autograd.grad`` runs
    on it again and again (``retain_graph``), each time computing dq, dk, dv.
    """
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    repeats = ctx.pick(dict(warmup=2, repeat=5), dict(warmup=0, repeat=1, number=1))   # dry run: 2 calls each
    with torch.no_grad():
        fwd = bench.time_stats(lambda: fn(q, k, v, is_causal), device=ctx.device, budget_s=ctx.budget_s, **repeats)
    out = fn(q, k, v, is_causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
    bwd = bench.time_stats(lambda: torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True),
                           device=ctx.device, budget_s=ctx.budget_s, **repeats)
    return dict(fwd=fwd.median, bwd=bwd.median, out=out.detach(), grads=grads)


def _float64_reference(q, k, v, d_out, is_causal: bool, batch: slice):
    """Output and gradients in float64 from the same (rounded) inputs, on ``batch`` of the batch
    (each batch element is independent: its rows of a full run are compared with it)."""
    q, k, v = (t[batch].double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out[batch].double())
    return out.detach(), grads


def _kernel_rows(ctx: Context, impls: dict, *, D: int, notebook: dict, peaks: dict | None = None) -> dict:
    """Every implementation in ``impls`` (name -> fn(q, k, v, is_causal)) against torch SDPA at
    ``KERNEL_SIZES`` and head size D, bf16, causal and not: summary rows with time, TFLOP/s, share
    of peak (the dtype's, or ``peaks[name]`` where given), time / SDPA's, error against float64 in bf16
    ulps, and the SDPA backend that ran."""
    sizes = TINY_KERNEL_SIZES if ctx.tiny else kernel_sizes()
    B, H, N = sizes["B"], sizes["H"], sizes["N"]
    q, k, v, d_out = _inputs(ctx, *[(B, H, N, D)] * 4)
    dtype = ctx.dtype
    peak = bench.peak_tflops(ctx.device, dtype)
    peaks = {name: peak for name in ("torch SDPA", *impls)} | (peaks or {})   # a kernel may use another instruction
    shape = f"B={B} H={H} N={N} d={D}"
    rows = []
    for is_causal in (False, True):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        backend = dict(forward=", ".join(bench.sdpa_backends(lambda: _sdpa(q, k, v, is_causal))) or None,
                       backward=", ".join(bench.sdpa_backends(lambda: _sdpa(*leaves, is_causal), grad=True)) or None)
        ref_out, ref_grads = _float64_reference(q, k, v, d_out, is_causal, slice(0, 1))
        fwd_flops = bench.attention_flops(B, H, N, N, D, is_causal=is_causal)
        timed = {}
        for name, fn in {"torch SDPA": _sdpa, **impls}.items():
            timed[name] = t = _timed_pair(ctx, fn, q, k, v, d_out, is_causal)
            errors = dict(forward=bench.error_ulps(t["out"][:1], ref_out, dtype),
                          backward=max(bench.error_ulps(g[:1], r, dtype) for g, r in zip(t["grads"], ref_grads)))
            for what in ("forward", "backward"):
                seconds = t["fwd" if what == "forward" else "bwd"]
                flops = fwd_flops * (1.0 if what == "forward" else 2.5)   # the backward: 5 matmuls to the forward's 2
                tflops = flops / seconds / 1e12
                rows.append(dict(notebook=notebook[what], what=f"{what}{', causal' if is_causal else ''}", impl=name,
                                 shape=shape, dtype=ctx.dtype_name, is_causal=is_causal, ms=1e3 * seconds,
                                 tflops=tflops,
                                 peak_share=None if peaks[name] is None else tflops / peaks[name],
                                 vs_sdpa=seconds / timed["torch SDPA"]["fwd" if what == "forward" else "bwd"],
                                 err_ulps=errors[what], backend=backend[what] if name == "torch SDPA" else None))
            del t["out"], t["grads"]
        ctx.checkpoint(dict(summary_rows=rows))
    return dict(summary_rows=rows, sizes=dict(sizes, D=D, dtype=ctx.dtype_name),
                peak=bench.describe_peak(ctx.device, dtype), float64_check=_float64_check(rows, dtype))


def _float64_check(rows: list[dict], dtype: torch.dtype = DTYPE) -> dict:
    """Every kernel's error against float64 within max(DEFAULT_ULPS, 2 x SDPA's error) for the same pass
    and mask: a kernel as exact as torch's passes; a wrong mask or a lost rescale (hundreds of ulps) fails."""
    sdpa = {r["what"]: r["err_ulps"] for r in rows if r["impl"] == "torch SDPA"}
    bounds = {what: max(bench.DEFAULT_ULPS[dtype], 2 * err) for what, err in sdpa.items()}
    over = [f"{r['impl']} {r['what']}: {r['err_ulps']:.1f} ulps > {bounds[r['what']]:.1f}" for r in rows
            if r["err_ulps"] > bounds[r["what"]]]
    return dict(reference="float64, same rounded inputs", bound_ulps=bounds, over=over, passed=not over)


def _triton(ctx: Context, D: int) -> dict:
    """The Triton kernel's rows; each says, in the path column, how its tiles were fetched (TMA descriptors or
    pointers) and, for the backward, which dQ method the kernel's first backward timed faster
    (``triton_attention.dq_method_timings``: both methods' times are kept in the section's record)."""
    from .. import triton_attention

    def triton_fa(q, k, v, is_causal):
        return triton_attention.flash_attention(q, k, v, is_causal=is_causal)

    D = ctx.pick(D, D // 4)
    from .triton_bench import kernel_peak_tflops  # a T4 runs the kernel's dots on FMA: the FP32 peak there

    result = _kernel_rows(ctx, {"Triton flash_attention": triton_fa}, D=D,
                          notebook=dict(forward="15", backward="11,15"),
                          peaks={"Triton flash_attention": kernel_peak_tflops(ctx.device, ctx.dtype)})
    timings = triton_attention.dq_method_timings()
    result["dq_methods"] = timings
    probe = torch.empty(1, 1, 1, D, dtype=ctx.dtype, device=ctx.device)
    tma = triton_attention.tma_by_default(probe)
    for row in result["summary_rows"]:
        if row["impl"] != "Triton flash_attention":
            continue
        path = "TMA loads" if tma else "pointer loads"
        if row["what"].startswith("backward"):
            chosen = [t for t in timings if t["D"] == D and t["causal"] == row["is_causal"]]
            method = chosen[0]["chosen"] if chosen else "recompute"
            path += f", dQ {method} ({5 if method == 'atomic' else 7} matmuls)"
        row["backend"] = path
    return result


def triton_d64(ctx: Context) -> dict:
    """Notebook 15's Triton kernel (forward, autograd backward) against SDPA, d = 64 (16 in a dry run)."""
    return _triton(ctx, 64)


def triton_d128(ctx: Context) -> dict:
    """Notebook 15's Triton kernel (forward, autograd backward) against SDPA, d = 128 (32 in a dry run)."""
    return _triton(ctx, 128)


def tiled(ctx: Context) -> dict:
    """Notebook 08's tiled kernel (``efficient.flash_attention``, plain PyTorch; its backward is notebook 11's)
    against SDPA, d = 128 (16 in a dry run)."""
    from ..efficient import flash_attention

    def tiled_fa(q, k, v, is_causal):
        return flash_attention(q, k, v, is_causal=is_causal)

    return _kernel_rows(ctx, {"tiled (flash_attention)": tiled_fa}, D=ctx.pick(128, 16),
                        notebook=dict(forward="08", backward="11"))


def nb16(ctx: Context) -> dict:
    """Notebook 16's decoding step: SDPA over a growing cache against one step of each fixed-state mixer
    (delta rule, gated delta rule, linear attention, S6), whose work does not depend on the cache length.
    Each step is checked against its float32 twin, and SDPA against explicit attention, before timing."""
    from ..efficient import linear_attention_step
    from ..recurrent import delta_rule_step, selective_scan_step

    Ss = ctx.pick([1024, 4096, 16384, 65536], [64, 128])
    dtype = ctx.dtype
    h, dh, d_inner, n = ctx.pick((32, 128, 4096, 16), (2, 16, 32, 4))
    gen = torch.Generator(device=ctx.device).manual_seed(0)

    def rand(*shape):
        return bench.randn(*shape, device=ctx.device, dtype=dtype, generator=gen)

    q, k, v = rand(1, h, dh), F.normalize(rand(1, h, dh), dim=-1), rand(1, h, dh)
    S = rand(1, h, dh, dh)
    beta = torch.rand(1, h, device=ctx.device, generator=gen).to(dtype)
    g = -torch.rand(1, h, device=ctx.device, generator=gen).to(dtype)
    lin = (rand(1, h, dh, dh).abs(), rand(1, h, dh).abs())
    x, u = rand(1, d_inner, n), rand(1, d_inner)
    delta = torch.rand(1, d_inner, device=ctx.device, generator=gen).to(dtype)
    A, B, C = -torch.rand(d_inner, n, device=ctx.device, generator=gen).to(dtype), rand(1, n), rand(1, n)
    steps = {"delta rule step": (lambda: delta_rule_step(S, q, k, v, beta)[0],
                                 lambda: delta_rule_step(S.float(), q.float(), k.float(), v.float(), beta.float())[0]),
             "gated delta rule step": (lambda: delta_rule_step(S, q, k, v, beta, g=g)[0],
                                       lambda: delta_rule_step(S.float(), q.float(), k.float(), v.float(),
                                                               beta.float(), g=g.float())[0]),
             "linear attention step": (lambda: linear_attention_step(lin, q, k, v)[0],
                                       lambda: linear_attention_step(tuple(t.float() for t in lin), q.float(),
                                                                     k.float(), v.float())[0]),
             "S6 step": (lambda: selective_scan_step(x, u, delta, A, B, C)[0],
                         lambda: selective_scan_step(x.float(), u.float(), delta.float(), A.float(), B.float(),
                                                     C.float())[0])}
    records, checks = [], {}
    with torch.no_grad():
        for name, (fn, fn32) in steps.items():
            checks[name] = bench.error_ulps(fn(), fn32(), dtype)
            t = bench.time_stats(fn, device=ctx.device, budget_s=ctx.budget_s)
            records.append(dict(impl=name, S=None, median_s=t.median, min_s=t.min))
        for n_cache in Ss:
            qs, K, V = rand(1, h, 1, dh), rand(1, h, n_cache, dh), rand(1, h, n_cache, dh)
            checks[f"torch SDPA, S = {n_cache}"] = bench.error_ulps(
                F.scaled_dot_product_attention(qs, K, V), _explicit(qs.float(), K.float(), V.float()), dtype)
            t = bench.time_stats(lambda: F.scaled_dot_product_attention(qs, K, V), device=ctx.device,
                                 budget_s=ctx.budget_s)
            records.append(dict(impl="torch SDPA", S=n_cache, median_s=t.median, min_s=t.min))
    bound = bench.DEFAULT_ULPS[dtype] * 32
    check = dict(reference="float32, same rounded inputs", bound_ulps=bound, ulps=checks,
                 passed=all(e <= bound for e in checks.values()))
    if not check["passed"]:
        raise AssertionError(f"a decoding step disagrees with its float32 twin: {checks}")
    return dict(records=records, fp32_check=check,
                config=dict(h=h, head_dim=dh, d_inner=d_inner, d_state=n, Ss=Ss, dtype=ctx.dtype_name))
