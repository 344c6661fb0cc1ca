"""Compile every Triton kernel, for every GPU architecture learners have, on a CPU, and read what each launch needs.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", CC, 32))`` runs Triton's whole pipeline (TTIR,
TTGIR, LLVM IR, PTX, ptxas) without a GPU. The matrix: sm_75 (T4), sm_80 (A100), sm_86 (RTX 3090, A10G),
sm_89 (RTX 4090, L4) and sm_90 (H100/H200); float16 and float32 everywhere, bfloat16 from sm_80 (where it is
native); head dims 64 and 128; causal and not; the forward, dK/dV (with and without atomic dQ), dQ and
preprocessing kernels, each with every launch configuration ``triton_attention.kept_configs`` keeps for that
architecture (the autotuner's own pruning, ``early_config_prune``), with TMA descriptors where
``triton_attention.tma_for`` says the launch takes them (bf16/fp16 on sm_90) and pointer loads elsewhere.

For each compile it records what that GPU's launch checks: registers per thread, the stack (where ptxas puts
spilled registers) and local memory from ``cuobjdump --dump-resource-usage`` (shipped in Triton's NVIDIA
backend), the shared memory (static + the kernel's dynamic allocation) next to the estimate the pruning used,
and which matmul instruction the PTX holds: Hopper's warpgroup ``wgmma``, the ``mma.sync`` of sm_80-89, or
none (Triton lowers ``tl.dot`` to ``fma`` on the CUDA cores below sm_80). ``python -m
selfattn_lite.course.arch_compile`` writes ``figures/gpu/compile_sm{CC}.json``, one file per architecture;
``--arch 90`` compiles one. ``course.sm90_compile`` is the sm_90 subset (and the JIT dry run).

Run it with TRITON_INTERPRET unset or 0 (``main`` sets 0 before Triton is imported): under the interpreter
``@triton.jit`` gives interpreted functions, which cannot be compiled. Compiles run in a process pool and go
through Triton's on-disk cache, so a second run only reads the cubins back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

__all__ = ["ARCHS", "DTYPES", "HEAD_DIMS", "dtypes_for", "cases", "compile_case", "resources", "compile_all",
           "warps_contrast", "check", "groups", "main"]

ARCHS = (75, 80, 86, 89, 90)
DTYPES = ("bf16", "fp16", "fp32")
HEAD_DIMS = (64, 128)
SIZES = dict(N=64, L=4096, S=4096)      # B * H = 4 * 16 heads, n = 4096: the sizes the GPU report times
KERNELS = ("attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_bwd_preprocess_kernel")

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def dtypes_for(cc: int) -> tuple[str, ...]:
    """The input dtypes a GPU of capability cc runs the kernel in: bfloat16 only from sm_80, where it is native."""
    return DTYPES if cc >= 80 else ("fp16", "fp32")


def _signature(kernel: str, dtype: str, tma: bool, block_m: int, block_n: int, block_d: int) -> dict[str, str]:
    """Triton's type string of each runtime argument; with TMA the tiles' tensors are host-side tensor
    descriptors of 3-d (N, rows, D) tensors with blocks (1, BLOCK_M or BLOCK_N, BLOCK_D)."""
    from .. import triton_attention as ta

    t, f = _PTR[dtype], "*fp32"
    if kernel == "attn_fwd_kernel":
        ptrs = dict(Q=t, K=t, V=t, O=t, LSE=f)
        rest = dict(N="i32", L="i32", S="i32", qk_scale="fp32")
    elif kernel == "attn_bwd_preprocess_kernel":
        ptrs = dict(O=t, DO=t, DELTA=f)
        rest = dict(N="i32", L="i32")
    elif kernel == "attn_bwd_dkdv_kernel":
        ptrs = dict(Q=t, K=t, V=t, DO=t, LSE=f, DELTA=f, DK=t, DV=t, DQ_ACC=f)
        rest = dict(N="i32", L="i32", S="i32", qk_scale="fp32", scale="fp32")
    else:
        ptrs = dict(Q=t, K=t, V=t, DO=t, LSE=f, DELTA=f, DQ=t)
        rest = dict(N="i32", L="i32", S="i32", qk_scale="fp32", scale="fp32")
    if tma:
        blocks = dict(BLOCK_M=block_m, BLOCK_N=block_n)
        for arg, block in ta.DESCRIPTOR_BLOCKS[kernel].items():
            ptrs[arg] = f"tensordesc<{dtype}[1,{blocks[block]},{block_d}]>"
    return {**ptrs, **rest}


def cases(archs=ARCHS, head_dims=HEAD_DIMS, is_causal=(False, True)) -> list[dict]:
    """One dict per (arch, kernel, configuration, dtype, D, causal, atomic_dq) a launch on that GPU can make:
    each configuration ``kept_configs`` keeps there, with descriptors where ``tma_for`` says so."""
    import torch

    from .. import triton_attention as ta

    out = []
    for cc in archs:
        limits = ta.GPU_LIMITS[cc]
        for dtype in dtypes_for(cc):
            torch_dtype = getattr(torch, _TORCH_DTYPE[dtype])
            for D in head_dims:
                tma = ta.tma_for(limits, torch_dtype, D)
                for causal_flag in is_causal:
                    for kernel, atomic in (("attn_fwd_kernel", None), ("attn_bwd_dkdv_kernel", False),
                                           ("attn_bwd_dkdv_kernel", True), ("attn_bwd_dq_kernel", None)):
                        for config in ta.kept_configs(kernel, limits, torch_dtype, D, atomic=bool(atomic)):
                            out.append(dict(arch=cc, kernel=kernel, config=dict(config), dtype=dtype, D=D,
                                            causal=causal_flag, tma=tma, atomic_dq=atomic,
                                            smem_estimate=ta.smem_estimate(
                                                kernel, config, torch_dtype, D, atomic=bool(atomic),
                                                instruction=ta.matmul_instruction(limits))))
                config = dict(BLOCK_M=ta.PREPROCESS_BLOCK_M, num_warps=4, num_stages=1)
                out.append(dict(arch=cc, kernel="attn_bwd_preprocess_kernel", config=config, dtype=dtype, D=D,
                                causal=None, tma=False, atomic_dq=None,
                                smem_estimate=ta.smem_estimate("attn_bwd_preprocess_kernel", config, torch_dtype, D)))
    return out


def _cuobjdump() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def compile_case(case: dict) -> dict:
    """Compile one case for its architecture and read its resources off the cubin and the PTX."""
    os.environ["TRITON_INTERPRET"] = "0"
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .. import triton_attention as ta
    from .. import triton_kernels

    kernel, config, D, cc = case["kernel"], case["config"], case["D"], case["arch"]
    fn = getattr(triton_kernels, kernel)
    signature = _signature(kernel, case["dtype"], case["tma"], config["BLOCK_M"], config.get("BLOCK_N", 0), D)
    constexprs = dict(D=D, BLOCK_M=config["BLOCK_M"], BLOCK_D=D)
    if kernel != "attn_bwd_preprocess_kernel":
        precision = ta.precision_for(ta.GPU_LIMITS[cc], getattr(torch, _TORCH_DTYPE[case["dtype"]]))
        constexprs.update(IS_CAUSAL=case["causal"], BLOCK_N=config["BLOCK_N"], PRECISION=precision, UPCAST=False,
                          TMA=case["tma"])
    if kernel == "attn_bwd_dkdv_kernel":
        constexprs.update(ATOMIC_DQ=case["atomic_dq"])
    signature.update({name: "constexpr" for name in constexprs})
    names = list(fn.arg_names)
    signature = {name: signature[name] for name in names}
    # what a launch at SIZES sees: 16-byte aligned pointers, sizes divisible by 16
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
             if kind.startswith("*") or (kind == "i32" and SIZES.get(name, 1) % 16 == 0)}
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", cc, 32),
                              options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]))
    seconds = time.perf_counter() - start
    return dict(case, **resources(compiled), seconds=round(seconds, 1), triton=triton.__version__)


def resources(compiled) -> dict:
    """What one compiled kernel asks of the GPU, read off its cubin (cuobjdump) and its PTX and TTIR."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    ptx = compiled.asm["ptx"]
    ttir = compiled.asm["ttir"]
    return dict(registers=int(found["REG"]), stack=int(found["STACK"]), local=int(found["LOCAL"]),
                shared_bytes=int(found["SHARED"]) + int(compiled.metadata.shared),
                threads=32 * int(compiled.metadata.num_warps),
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                fma=len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
                tma_loads=ptx.count("cp.async.bulk.tensor"), atomics=len(re.findall(r"\b(?:red|atom)\.global", ptx)),
                int64_offsets=bool(re.search(r"arith\.extsi .*: i32 to i64", ttir)))


def compile_all(case_list: list[dict] | None = None, *, workers: int | None = None) -> list[dict]:
    """``compile_case`` over every case, in ``workers`` processes (default: the CPU count), longest first."""
    case_list = cases() if case_list is None else case_list
    workers = workers or os.cpu_count() or 1
    os.environ["TRITON_INTERPRET"] = "0"
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_case, case_list))


def check(record: dict) -> list[str]:
    """What a launch of this compiled kernel on its GPU would refuse or run differently, as sentences (none:
    it fits). Registers x threads within the SM's register file and <= 255 a thread; shared memory within the
    GPU's opt-in limit per block and within the pruning's estimate; no spill where the GPU has tensor cores
    for the dtype; the matmul instruction expected there (``expected_instruction``: wgmma on sm_90, mma.sync on
    sm_80-89 and for sm_90's one float32 fallback tile, fma below)."""
    from .. import triton_attention as ta

    limits = ta.GPU_LIMITS[record["arch"]]
    problems = []
    if record["registers"] * record["threads"] > limits["regs_per_sm"]:
        problems.append(f"{record['registers']} registers x {record['threads']} threads > {limits['regs_per_sm']}")
    if record["registers"] > limits["regs_per_thread"]:
        problems.append(f"{record['registers']} registers a thread > {limits['regs_per_thread']}")
    if record["shared_bytes"] > limits["smem_per_block"]:
        problems.append(f"shared memory {record['shared_bytes']} B > the GPU's {limits['smem_per_block']} B")
    if record["shared_bytes"] > record["smem_estimate"]:
        problems.append(f"shared memory {record['shared_bytes']} B > the pruning's estimate "
                        f"{record['smem_estimate']} B")
    if record["kernel"] == "attn_bwd_preprocess_kernel":
        return problems
    want = ta.expected_instruction(record["kernel"], record["config"], limits, atomic=bool(record["atomic_dq"]))
    if limits["tensor_cores"] and (record["stack"] or record["local"]):
        problems.append(f"spills: stack {record['stack']} B, local {record['local']} B")
    found = {"wgmma": record["wgmma"] > 0, "mma.sync": record["mma_sync"] > 0,
             "fma": not record["wgmma"] and not record["mma_sync"] and record["fma"] > 0}
    if not found[want] or sum(found.values()) != 1:
        problems.append(f"matmuls: wgmma {record['wgmma']}, mma.sync {record['mma_sync']}, fma {record['fma']}; "
                        f"expected {want}")
    if (record["tma_loads"] > 0) != record["tma"]:
        problems.append(f"tma={record['tma']} but {record['tma_loads']} TMA loads")
    if (record["atomics"] > 0) != bool(record["atomic_dq"]):
        problems.append(f"atomic_dq={record['atomic_dq']} but {record['atomics']} global atomics")
    if not record["int64_offsets"]:
        problems.append("head offsets are 32-bit")
    return problems


def groups(records: list[dict]) -> dict[tuple, list[dict]]:
    """The records by (kernel with its dQ variant, dtype, D, causal): each group is one launch's choice."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        name = r["kernel"] + (" +atomic dQ" if r["atomic_dq"] else "")
        out.setdefault((name, r["dtype"], r["D"], r["causal"]), []).append(r)
    return out


def _summary(cc: int, records: list[dict]) -> str:
    from .. import triton_attention as ta

    tiles = [r for r in records if r["kernel"] != "attn_bwd_preprocess_kernel"]
    bad = [r for r in records if check(r)]
    return (f"sm_{cc} ({ta.GPU_LIMITS[cc]['name']}): {len(records)} compiles, {len(groups(records))} "
            f"(kernel, dtype, D, causal) groups, max shared memory {max(r['shared_bytes'] for r in records)} B "
            f"of {ta.GPU_LIMITS[cc]['smem_per_block']}, max registers {max(r['registers'] for r in records)}, "
            f"matmuls {ta.matmul_instruction(ta.GPU_LIMITS[cc])} ({sum(r['mma_sync'] > 0 for r in tiles)} of "
            f"{len(tiles)} on mma.sync), {len(bad)} over a limit")


def warps_contrast(warps=(4, 8)) -> list[dict]:
    """The sm_90 forward at FlashAttention-2's D = 128 tile (128 x 64, bf16, TMA, 3 stages) compiled with each
    number of warps: on 4 warps a thread holds more than its 255 registers (STACK > 0), on 8 it does not."""
    return [compile_case(dict(arch=90, kernel="attn_fwd_kernel", dtype="bf16", D=128, causal=False, tma=True,
                              atomic_dq=None, smem_estimate=None,
                              config=dict(BLOCK_M=128, BLOCK_N=64, num_warps=w, num_stages=3))) for w in warps]


def main(argv: list[str] | None = None, *, default_out: str = "figures/gpu") -> None:
    """python -m selfattn_lite.course.arch_compile [--arch 75 80 86 89 90] [--out figures/gpu]"""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS)
    parser.add_argument("--out", default=default_out, help="folder for compile_sm{CC}.json")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="one line per compile")
    parser.add_argument("--warps", action="store_true",
                        help="only the 4- and 8-warp sm_90 forward at 128 x 64 (sm90_fwd_warps.json)")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"
    from .. import triton_attention as ta

    if args.warps:
        records = warps_contrast()
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sm90_fwd_warps.json").write_text(json.dumps(dict(target="cuda sm_90", results=records),
                                                                      indent=1) + "\n")
        for r in records:
            print(f"{r['config']['num_warps']} warps: {r['registers']} registers, stack {r['stack']} B")
        return

    start = time.perf_counter()
    results = compile_all(cases(args.arch), workers=args.workers)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for cc in args.arch:
        mine = [r for r in results if r["arch"] == cc]
        (out / f"compile_sm{cc}.json").write_text(json.dumps(dict(target=f"cuda sm_{cc}", limits=ta.GPU_LIMITS[cc],
                                                                  results=mine), indent=1) + "\n")
        if args.verbose:
            for r in mine:
                c = r["config"]
                variant = ("tma" if r["tma"] else "ptr") + (" atomic-dq" if r["atomic_dq"] else "")
                print(f"sm_{cc} {r['kernel']:<27} {c.get('BLOCK_M')}x{c.get('BLOCK_N', '-')} w{c['num_warps']} "
                      f"s{c['num_stages']} {r['dtype']} d={r['D']:<3} causal={r['causal']!s:<5} {variant:<13} "
                      f"reg {r['registers']:>3} stack {r['stack']:>4} smem {r['shared_bytes']:>6} "
                      f"(est {r['smem_estimate']:>6}) wgmma {r['wgmma']:>3} mma.sync {r['mma_sync']:>3} "
                      f"fma {r['fma']:>5} {'; '.join(check(r))}")
        print(_summary(cc, mine))
    print(f"{len(results)} compiles in {seconds:.0f} s")


if __name__ == "__main__":
    main()
