"""FlashAttention-2 as Triton kernels: the forward pass and the two backward kernels.

Importing this module needs Triton (``pip install -e ".[triton]"``, Linux). Without CUDA it sets
``TRITON_INTERPRET=1`` *before* ``import triton``: every ``@triton.jit`` below then becomes an
interpreted function that runs the very same kernel body on the CPU with numpy, one program
instance after another. (Triton reads the variable when a kernel is decorated, so it must be set
before this module's decorators run; set it yourself to interpret on a machine with a GPU.)

All tensors are contiguous (N, L, D) with N = batch * heads; a program finds its rows by pointer
arithmetic: element (n, i, d) of Q sits at ``Q + n * L * D + i * D + d``. The exponentials are taken
in base 2: ``qk_scale = scale * log2(e)`` is folded into the scores, so 2^(s * qk_scale) =
e^(s * scale), and the saved log-sum-exp ``LSE2`` is in base 2 as well (``lse = LSE2 * ln 2``).

``selfattn_lite.triton_attention`` launches these kernels, checks the inputs and wraps them
in a ``torch.autograd.Function``.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():                      # no GPU: run the kernels under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["dot", "attn_fwd_kernel", "attn_fwd_inner", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "interpreting"]


def interpreting() -> bool:
    """True when ``@triton.jit`` kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in float32 (``tl.dot``), a (M, K) and b (K, N) blocks.

    UPCAST is set under the interpreter for bfloat16 inputs: numpy has no bfloat16, the interpreter
    stores it as uint16 and has no bfloat16 arithmetic (its ``tl.dot`` multiplies the bit patterns,
    triton-lang/triton#11584). Converting to float32 first is exact for the products (a bfloat16 x
    bfloat16 product fits in float32), so the result is what the GPU's tensor cores compute, up to
    the order of the additions. On a GPU UPCAST is False and the dot runs in bfloat16.
    """
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def attn_fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, k_start, k_end, offs_m, offs_n, offs_d, S, D, qk_scale,
                   MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """One query block's walk over the key blocks k_start, k_start + BLOCK_N, ... < k_end.

    The online softmax: m_i (BLOCK_M,) running max, l_i (BLOCK_M,) running sum, acc (BLOCK_M, BLOCK_D)
    running output, all float32; q (BLOCK_M, BLOCK_D). With MASK the keys past S (and, causal, the
    keys after each query) get score -inf; without it no mask is built at all.
    """
    for k0 in range(k_start, k_end, BLOCK_N):
        offs_k = k0 + offs_n                                                       # (BLOCK_N,) key rows
        kv_mask = (offs_k[:, None] < S) & (offs_d[None, :] < D)
        k = tl.load(K_ptr + offs_k[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)   # (BLOCK_N, BLOCK_D)
        v = tl.load(V_ptr + offs_k[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)   # (BLOCK_N, BLOCK_D)
        s = dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale          # (BLOCK_M, BLOCK_N), base 2
        if MASK:
            keep = offs_k[None, :] < S
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_m[:, None])                # key j <= query i
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                                      # (BLOCK_M,)
        alpha = tl.exp2(m_i - m_new)                                               # rescales the old sums
        p = tl.exp2(s - m_new[:, None])                                            # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(Q, K, V, O, LSE2, L, S, D, qk_scale,
                    IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Program (start_m, n): queries start_m * BLOCK_M ... + BLOCK_M - 1 of (batch, head) n.

    Q (N, L, D), K and V (N, S, D), O (N, L, D), LSE2 (N, L) float32, base 2.
    Causal (top-left, key j <= query i): key blocks entirely at or below every query of the block
    run without a mask (stage 1), the blocks that straddle the diagonal with one (stage 2), and the
    blocks after the last query are never loaded: the loop ends there.
    """
    start_m = tl.program_id(0)                       # which block of queries
    n = tl.program_id(1)                             # which (batch, head)
    q0 = start_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)              # (BLOCK_M,) query rows
    offs_n = tl.arange(0, BLOCK_N)                   # (BLOCK_N,) key rows within a block
    offs_d = tl.arange(0, BLOCK_D)                   # (BLOCK_D,) features, BLOCK_D = next power of 2 >= D
    Q_ptr, K_ptr, V_ptr = Q + n * L * D, K + n * S * D, V + n * S * D
    q_mask = (offs_m[:, None] < L) & (offs_d[None, :] < D)
    q = tl.load(Q_ptr + offs_m[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)   # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)     # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                   # running sum
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)          # running output

    if IS_CAUSAL:
        k_end = tl.minimum(S, q0 + BLOCK_M)                       # no query here sees a key past q0 + BLOCK_M - 1
        unmasked_end = tl.minimum((q0 + 1) // BLOCK_N, S // BLOCK_N) * BLOCK_N   # blocks every query sees whole
    else:
        k_end = S
        unmasked_end = (S // BLOCK_N) * BLOCK_N                   # full blocks; the tail block needs the mask
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, 0, unmasked_end, offs_m, offs_n, offs_d,
                                   S, D, qk_scale, False, IS_CAUSAL, BLOCK_N, PRECISION, UPCAST)      # stage 1
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, unmasked_end, k_end, offs_m, offs_n, offs_d,
                                   S, D, qk_scale, True, IS_CAUSAL, BLOCK_N, PRECISION, UPCAST)       # stage 2

    out = acc / l_i[:, None]                                      # every row saw key 0, so l_i > 0
    tl.store(O + n * L * D + offs_m[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty), mask=q_mask)
    tl.store(LSE2 + n * L + offs_m, m_i + tl.log2(l_i), mask=offs_m < L)


@triton.jit
def attn_bwd_dkdv_kernel(Q, K, V, DO, LSE2, DELTA, DK, DV, L, S, D, qk_scale, scale,
                         IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Program (start_n, n): dK and dV of keys start_n * BLOCK_N ... + BLOCK_N - 1 of (batch, head) n.

    Walks over the query blocks, recomputing each tile of probabilities from the saved LSE2
    (P = 2^(S * qk_scale - LSE2), no softmax pass needed) and accumulating, in float32,
        dV += P^T dO,      dP = dO V^T,      dS = P * (dP - DELTA),      dK += dS^T Q * scale
    with DELTA = rowsum(dO * O). Causal: query blocks that end before k0 see none of these keys and
    are skipped by the loop's start.
    """
    start_n = tl.program_id(0)
    n = tl.program_id(1)
    k0 = start_n * BLOCK_N
    offs_k = k0 + tl.arange(0, BLOCK_N)              # (BLOCK_N,) key rows
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_k[:, None] < S) & (offs_d[None, :] < D)
    kv_offsets = n * S * D + offs_k[:, None] * D + offs_d[None, :]
    k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)          # (BLOCK_N, BLOCK_D)
    v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)          # (BLOCK_N, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    q_start = 0
    if IS_CAUSAL:
        q_start = (k0 // BLOCK_M) * BLOCK_M                       # the first query block with a query i >= k0
    for q_blk in range(q_start, L, BLOCK_M):
        offs_m = q_blk + tl.arange(0, BLOCK_M)                    # (BLOCK_M,) query rows
        q_mask = (offs_m[:, None] < L) & (offs_d[None, :] < D)
        q_offsets = n * L * D + offs_m[:, None] * D + offs_d[None, :]
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)        # (BLOCK_M, BLOCK_D)
        do = tl.load(DO + q_offsets, mask=q_mask, other=0.0)      # (BLOCK_M, BLOCK_D)
        lse2 = tl.load(LSE2 + n * L + offs_m, mask=offs_m < L, other=0.0)    # (BLOCK_M,)
        delta = tl.load(DELTA + n * L + offs_m, mask=offs_m < L, other=0.0)  # (BLOCK_M,)
        sT = dot(k, tl.trans(q), PRECISION, UPCAST) * qk_scale   # (BLOCK_N, BLOCK_M) scores, transposed
        keep = (offs_k[:, None] < S) & (offs_m[None, :] < L)
        if IS_CAUSAL:
            keep = keep & (offs_k[:, None] <= offs_m[None, :])
        pT = tl.where(keep, tl.exp2(sT - lse2[None, :]), 0.0)    # (BLOCK_N, BLOCK_M) probabilities P^T
        dv += dot(pT.to(do.dtype), do, PRECISION, UPCAST)
        dpT = dot(v, tl.trans(do), PRECISION, UPCAST)             # (BLOCK_N, BLOCK_M) dP^T
        dsT = pT * (dpT - delta[None, :])                                   # (BLOCK_N, BLOCK_M) dS^T
        dk += dot(dsT.to(q.dtype), q, PRECISION, UPCAST)
    tl.store(DK + kv_offsets, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def attn_bwd_dq_kernel(Q, K, V, DO, LSE2, DELTA, DQ, L, S, D, qk_scale, scale,
                       IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Program (start_m, n): dQ of queries start_m * BLOCK_M ... + BLOCK_M - 1 of (batch, head) n.

    Walks over the key blocks like the forward pass (causal: ending after the block's last query),
    recomputing P from LSE2 and accumulating dQ += dS K * scale, dS = P * (dO V^T - DELTA).
    """
    start_m = tl.program_id(0)
    n = tl.program_id(1)
    q0 = start_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m[:, None] < L) & (offs_d[None, :] < D)
    q_offsets = n * L * D + offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)            # (BLOCK_M, BLOCK_D)
    do = tl.load(DO + q_offsets, mask=q_mask, other=0.0)          # (BLOCK_M, BLOCK_D)
    lse2 = tl.load(LSE2 + n * L + offs_m, mask=offs_m < L, other=0.0)
    delta = tl.load(DELTA + n * L + offs_m, mask=offs_m < L, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    k_end = S
    if IS_CAUSAL:
        k_end = tl.minimum(S, q0 + BLOCK_M)                       # keys after the block's last query: skipped
    for k0 in range(0, k_end, BLOCK_N):
        offs_k = k0 + offs_n
        kv_mask = (offs_k[:, None] < S) & (offs_d[None, :] < D)
        kv_offsets = n * S * D + offs_k[:, None] * D + offs_d[None, :]
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)      # (BLOCK_N, BLOCK_D)
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)      # (BLOCK_N, BLOCK_D)
        s = dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale    # (BLOCK_M, BLOCK_N)
        keep = (offs_k[None, :] < S) & (offs_m[:, None] < L)
        if IS_CAUSAL:
            keep = keep & (offs_k[None, :] <= offs_m[:, None])
        p = tl.where(keep, tl.exp2(s - lse2[:, None]), 0.0)      # (BLOCK_M, BLOCK_N)
        dp = dot(do, tl.trans(v), PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq += dot(ds.to(k.dtype), k, PRECISION, UPCAST)
    tl.store(DQ + q_offsets, (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
