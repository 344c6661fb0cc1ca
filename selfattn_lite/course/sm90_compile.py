"""Compile every Triton kernel and every autotune configuration for the H100/H200 (sm_90), on a CPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs Triton's whole pipeline
(TTIR, TTGIR, LLVM IR, PTX, ptxas) without a GPU. For each kernel, configuration, dtype and head
dim this records what the H200 will see: registers per thread, the stack (where ptxas puts spilled
registers: STACK > 0 is a spill) and local memory from ``cuobjdump --dump-resource-usage`` (shipped
in Triton's NVIDIA backend), the shared memory (static + the kernel's dynamic allocation), whether
the matmuls are Hopper's warpgroup ``wgmma`` or the older ``mma.sync``, and whether the head offset
is computed in 64 bits. ``python -m selfattn_lite.course.sm90_compile --out figures/gpu/sm90_resources.json``.

Run it with TRITON_INTERPRET unset or 0 (``main`` sets 0 before Triton is imported): under the
interpreter ``@triton.jit`` gives interpreted functions, which cannot be compiled.
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

__all__ = ["SMEM_LIMIT", "cases", "compile_case", "compile_all", "jit_dry_run", "main"]

SMEM_LIMIT = 232_448               # bytes of shared memory one block may use on sm_90 (227 KB)
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
SIZES = dict(N=64, L=4096, S=4096)   # B * H = 4 * 16 heads, n = 4096: the sizes the GPU report times

_PTR = {"bf16": "*bf16", "fp16": "*fp16"}


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


def cases(dtypes=DTYPES, head_dims=HEAD_DIMS, is_causal=(False, True)) -> list[dict]:
    """One dict per (kernel, configuration, dtype, D, causal, tma, atomic_dq) that ``flash_attention`` can launch
    on sm_90: every configuration with TMA descriptors (what bfloat16/float16 at D = 64, 128 runs there), the
    dK/dV kernel with and without atomic dQ, and each kernel's first configuration with pointer loads (what
    runs where descriptors cannot: a D that is not a multiple of 8), not causal."""
    from .. import triton_attention as ta

    out = []
    for dtype in dtypes:
        for D in head_dims:
            for causal in is_causal:
                for kernel, configs, atomic in (("attn_fwd_kernel", ta.FWD_CONFIGS, None),
                                                ("attn_bwd_dkdv_kernel", ta.DKDV_CONFIGS, False),
                                                ("attn_bwd_dkdv_kernel", ta.ATOMIC_CONFIGS, True),
                                                ("attn_bwd_dq_kernel", ta.DQ_CONFIGS, None)):
                    for i, config in enumerate(configs):
                        for tma in (True, False) if i == 0 and not causal and atomic is not True else (True,):
                            out.append(dict(kernel=kernel, config=dict(config), dtype=dtype, D=D, causal=causal,
                                            tma=tma, atomic_dq=atomic))
            out.append(dict(kernel="attn_bwd_preprocess_kernel",
                            config=dict(BLOCK_M=ta.PREPROCESS_BLOCK_M, num_warps=4, num_stages=1),
                            dtype=dtype, D=D, causal=None, tma=False, atomic_dq=None))
    return out


def _cuobjdump() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def compile_case(case: dict) -> dict:
    """Compile one case for sm_90 and read its resources off the cubin and the PTX."""
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .. import triton_kernels

    kernel, config, D = case["kernel"], case["config"], case["D"]
    fn = getattr(triton_kernels, kernel)
    signature = _signature(kernel, case["dtype"], case["tma"], config["BLOCK_M"], config.get("BLOCK_N", 0), D)
    constexprs = dict(D=D, BLOCK_M=config["BLOCK_M"], BLOCK_D=D)
    if kernel != "attn_bwd_preprocess_kernel":
        constexprs.update(IS_CAUSAL=case["causal"], BLOCK_N=config["BLOCK_N"], PRECISION="tf32", UPCAST=False,
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
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]))
    seconds = time.perf_counter() - start
    import triton

    return dict(case, **_resources(compiled), seconds=round(seconds, 1), triton=triton.__version__)


def _resources(compiled) -> dict:
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
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                tma_loads=ptx.count("cp.async.bulk.tensor"), atomics=len(re.findall(r"\b(?:red|atom)\.global", ptx)),
                int64_offsets=bool(re.search(r"arith\.extsi .*: i32 to i64", ttir)))


def compile_all(case_list: list[dict] | None = None, *, workers: int | None = None) -> list[dict]:
    """``compile_case`` over every case, in ``workers`` processes (default: the CPU count)."""
    case_list = cases() if case_list is None else case_list
    workers = workers or os.cpu_count() or 1
    os.environ["TRITON_INTERPRET"] = "0"
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_case, case_list))


def jit_dry_run(head_dims=HEAD_DIMS, *, B: int = 4, H: int = 16, N: int = 4096, dtype: str = "bf16") -> list[dict]:
    """The GPU report's Triton calls, made on a CPU, compiled for sm_90 by Triton's own JIT and autotuner.

    ``flash_attention(q, k, v, is_causal=...)`` forward and backward at (B, H, N, d) for each head dim, causal and
    not, inside ``triton_attention.compile_only((9, 0))``: exactly the code a GPU runs (the checks, tensor
    descriptors, ``_launch``, ``@triton.autotune`` with its pre-hooks and ``reset_to_zero``, the dQ-method
    choice, the JIT's argument binding and specialisation), except that every launch stops after its compile.
    It proves that every kernel and configuration the report will launch compiles from the arguments it will
    really pass, and reads their resources; it cannot prove the launch itself (the descriptors' encoding by the
    CUDA driver, the kernels' run) or any speed.

    Returns:
        one dict per compiled kernel: name, signature, constexprs, num_warps, num_stages, and ``_resources``.
    """
    os.environ["TRITON_INTERPRET"] = "0"
    import torch
    import triton

    from .. import triton_attention as ta

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with ta.compile_only((9, 0)) as compiled:
        for D in head_dims:
            q, k, v = (torch.zeros(B, H, N, D, dtype=torch_dtype, requires_grad=True) for _ in range(3))
            for is_causal in (False, True):
                out = ta.flash_attention(q, k, v, is_causal=is_causal)
                out.backward(torch.zeros_like(out))
    results = []
    for name, kernel in compiled:
        params = list(kernel.src.fn.arg_names)
        constexprs = {}
        for key, value in kernel.src.constants.items():
            index = key[0] if isinstance(key, tuple) else key
            if isinstance(value, (bool, int, str)):
                constexprs[params[index] if isinstance(index, int) else str(index)] = value
        results.append(dict(kernel=name, signature=dict(kernel.src.signature), constexprs=constexprs,
                            num_warps=kernel.metadata.num_warps, num_stages=kernel.metadata.num_stages,
                            **_resources(kernel), triton=triton.__version__))
    return results


def main(argv: list[str] | None = None) -> None:
    """python -m selfattn_lite.course.sm90_compile --out figures/gpu/sm90_resources.json [--jit]"""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", default="figures/gpu/sm90_resources.json")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--jit", action="store_true",
                        help="instead: the GPU report's flash_attention calls through Triton's JIT (jit_dry_run)")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"
    start = time.perf_counter()
    if args.jit:
        results = jit_dry_run()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(target="cuda sm_90 (H100/H200), via the JIT", smem_limit=SMEM_LIMIT,
                                                  results=results), indent=1, default=str) + "\n")
        for r in results:
            c = r["constexprs"]
            print(f"{r['kernel']:<27} {c.get('BLOCK_M')}x{c.get('BLOCK_N', '-')} w{r['num_warps']} s{r['num_stages']} "
                  f"d={c.get('D')} causal={c.get('IS_CAUSAL')!s:<5} tma={c.get('TMA')!s:<5} "
                  f"atomic={c.get('ATOMIC_DQ')!s:<5} "
                  f"reg {r['registers']:>3} stack {r['stack']} smem {r['shared_bytes']:>6} wgmma {r['wgmma']:>3} "
                  f"mma.sync {r['mma_sync']} tma {r['tma_loads']}")
        print(f"{len(results)} kernels compiled through the JIT in {time.perf_counter() - start:.0f} s")
        return
    results = compile_all(workers=args.workers)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(target="cuda sm_90 (H100/H200)", smem_limit=SMEM_LIMIT,
                                              results=results), indent=1) + "\n")
    for r in results:
        c = r["config"]
        variant = ("tma" if r["tma"] else "ptr") + (" atomic-dq" if r["atomic_dq"] else "")
        print(f"{r['kernel']:<27} {c.get('BLOCK_M')}x{c.get('BLOCK_N', '-')} w{c['num_warps']} s{c['num_stages']} "
              f"{r['dtype']} d={r['D']:<3} causal={r['causal']!s:<5} {variant:<13} reg {r['registers']:>3} "
              f"stack {r['stack']:>4} local {r['local']} smem {r['shared_bytes']:>6} wgmma {r['wgmma']:>3} "
              f"mma.sync {r['mma_sync']} tma {r['tma_loads']:>2} atomics {r['atomics']}")
    print(f"{len(results)} compiles in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
