"""The H100/H200 (sm_90) subset of ``course.arch_compile``, and the GPU report's own calls through Triton's JIT.

``python -m selfattn_lite.course.sm90_compile`` compiles every kernel and every launch configuration sm_90 keeps
(``arch_compile --arch 90``: registers, spills, shared memory, ``wgmma`` and TMA use) into
``figures/gpu/compile_sm90.json``. With ``--jit`` it runs ``jit_dry_run``: the GPU report's ``flash_attention``
calls inside ``triton_attention.compile_only()``, so Triton's JIT and autotuner (with its pruning) compile them
from the real arguments and stop before each launch (``figures/gpu/sm90_jit.json``).

Run it with TRITON_INTERPRET unset or 0 (``main`` sets 0 before Triton is imported): under the
interpreter ``@triton.jit`` gives interpreted functions, which cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from . import arch_compile
from .arch_compile import resources

__all__ = ["SMEM_LIMIT", "jit_dry_run", "main"]

SMEM_LIMIT = 232_448               # bytes of shared memory one block may use on sm_90 (227 KB)
HEAD_DIMS = (64, 128)


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
        one dict per compiled kernel: name, signature, constexprs, num_warps, num_stages, and ``resources``.
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
                            **resources(kernel), triton=triton.__version__))
    return results


def main(argv: list[str] | None = None) -> None:
    """python -m selfattn_lite.course.sm90_compile [--out figures/gpu] [--jit [--out figures/gpu/sm90_jit.json]]"""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", default=None, help="folder for compile_sm90.json; with --jit the JSON file")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--jit", action="store_true",
                        help="instead: the GPU report's flash_attention calls through Triton's JIT (jit_dry_run)")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"
    if not args.jit:
        workers = [] if args.workers is None else ["--workers", str(args.workers)]
        arch_compile.main(["--arch", "90", "--out", args.out or "figures/gpu", *workers])
        return
    start = time.perf_counter()
    out = Path(args.out or "figures/gpu/sm90_jit.json")
    results = jit_dry_run()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(target="cuda sm_90 (H100/H200), via the JIT", smem_limit=SMEM_LIMIT,
                                   results=results), indent=1, default=str) + "\n")
    for r in results:
        c = r["constexprs"]
        print(f"{r['kernel']:<27} {c.get('BLOCK_M')}x{c.get('BLOCK_N', '-')} w{r['num_warps']} s{r['num_stages']} "
              f"d={c.get('D')} causal={c.get('IS_CAUSAL')!s:<5} tma={c.get('TMA')!s:<5} "
              f"atomic={c.get('ATOMIC_DQ')!s:<5} "
              f"reg {r['registers']:>3} stack {r['stack']} smem {r['shared_bytes']:>6} wgmma {r['wgmma']:>3} "
              f"mma.sync {r['mma_sync']} tma {r['tma_loads']}")
    print(f"{len(results)} kernels compiled through the JIT in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
