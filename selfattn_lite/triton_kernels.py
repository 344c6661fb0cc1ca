"""FlashAttention-2 as Triton kernels: the forward pass, the backward's delta = rowsum(dO * O), dK/dV and dQ.

Taught in notebook 15 ("The forward kernel", "The backward kernels").

Importing this module imports Triton (``pip install -e ".[triton]"``, Linux). Whether the kernels are
compiled for a GPU or run by Triton's CPU interpreter is decided in one place, the package's
``__init__``, which sets ``TRITON_INTERPRET=1`` without CUDA *before* anything imports Triton
(Triton reads the variable when a kernel is decorated).

Layout: contiguous (N, L, D) tensors, N = batch * heads. Program ``pid`` of a launch on the
one-dimensional grid of ``n_blocks * N`` programs works on block ``pid % n_blocks`` of head
``pid // n_blocks``; one grid axis holds up to 2^31 - 1 programs, where CUDA's second and third
hold 65,535. Element (n, i, d) of Q sits at ``Q + n * L * D + i * D + d``; the head offset
``n * L * D`` is computed in int64, so tensors past 2^31 elements do not wrap.

Two ways to fetch a tile (``load_block``, constexpr ``TMA``): with pointers (every thread computes the
addresses and masks of its elements), or, on Hopper (sm_90) in bfloat16/float16, through a tensor
descriptor: one request to Hopper's Tensor Memory Accelerator (TMA), the hardware unit that moves whole
tiles between global and shared memory, copies the tile and zero-fills what lies past the tensor's edge.
The interpreter runs both. ``D`` is the head dimension everywhere; the backward's row sums rowsum(dO * O)
are ``delta`` (``DELTA``), as in Triton's fused-attention tutorial (FlashAttention-2 calls them D, which here
is the head dimension).

Two ways to get dQ (constexpr ``ATOMIC_DQ`` of the dK/dV kernel): a second kernel that walks the key
blocks again for each query block (``attn_bwd_dq_kernel``: 4 + 3 = 7 matmuls per tile pair), or, as
FlashAttention-2 does, the dK/dV kernel adds each tile's dS K into a float32 dQ with atomics
(4 + 1 = 5 matmuls, at the price of L2 atomic traffic and a summation order that varies run to run).

Exponentials are taken in base 2 inside (``qk_scale = scale * log2(e)`` folded into the scores, so
2^(s * qk_scale) = e^(s * scale)); the log-sum-exp crosses the kernels' boundary in natural log,
as FlashAttention's CUDA kernels store it.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from . import efficient

__all__ = ["dot", "load_rows", "load_block", "store_block", "attn_fwd_inner", "attn_fwd_kernel",
           "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_inner", "attn_bwd_dkdv_kernel", "attn_bwd_dq_inner",
           "attn_bwd_dq_kernel"]

LN_2 = tl.constexpr(math.log(2.0))           # base-2 log-sum-exp -> natural
LOG2_E = tl.constexpr(efficient.LOG2_E)      # natural -> base 2, as a compile-time constant


def _fix_interpreter_loop_bounds() -> None:
    """Let Triton 3.6's interpreter take a runtime loop bound under numpy >= 2.4.

    The interpreter holds every scalar as a numpy array of shape (1,) and turned it into a Python int
    for ``range(...)`` with ``int(array)``, which numpy 2.4 refuses for arrays with a dimension
    ("only 0-dimensional arrays can be converted to Python scalars"). Triton 3.9 squeezes the array
    first; this gives older interpreters the same ``__index__``. No effect on compiled kernels.
    """
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "takes_one_element_arrays", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.takes_one_element_arrays = True
    interpreter._patch_lang_tensor = patch_lang_tensor


_fix_interpreter_loop_bounds()


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in float32 (``tl.dot``), a (M, K) and b (K, N) blocks.

    PRECISION is "tf32" for float32 inputs on a GPU (tensor cores, 10-bit mantissa products) and
    is ignored for bfloat16/float16. UPCAST is set under the interpreter for bfloat16 inputs: numpy
    has no bfloat16, the interpreter stores it as uint16 and has no bfloat16 arithmetic (its
    ``tl.dot`` multiplies the bit patterns, triton-lang/triton#11584). Converting to float32 first is
    exact for the products (a bfloat16 x bfloat16 product fits in float32).
    """
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def load_rows(base, rows, offs_d, n_rows, D: tl.constexpr, BLOCK_D: tl.constexpr, ROW_MASK: tl.constexpr):
    """Rows ``rows`` (R,) of a row-major (n_rows, D) matrix at ``base``: an (R, BLOCK_D) block.

    Taught in notebook 15, "The forward kernel".

    Columns past D read 0 (BLOCK_D is D rounded up to a power of 2); with ROW_MASK rows past n_rows
    read 0 too. Without it, and with D a power of 2, the load has no mask at all.
    """
    ptrs = base + rows[:, None] * D + offs_d[None, :]
    if ROW_MASK:
        if BLOCK_D == D:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < D), other=0.0)
    else:
        if BLOCK_D == D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < D, other=0.0)
    return x


@triton.jit
def load_block(X, head, row0, offs_d, n_rows, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK: tl.constexpr, TMA: tl.constexpr):
    """Rows row0 ... row0 + BLOCK_R - 1 of head ``head`` of X (N, n_rows, D): an (BLOCK_R, BLOCK_D) block.

    Taught in notebook 15, "The forward kernel".

    TMA: X is a tensor descriptor of the (N, n_rows, D) tensor with block (1, BLOCK_R, BLOCK_D); one
    thread asks Hopper's Tensor Memory Accelerator (TMA) for the whole tile, which it writes to shared memory,
    zero-filling rows past n_rows and columns past D itself: no addresses, no masks in registers. Otherwise X is a
    pointer and the threads load the tile with ``load_rows`` (the head offset ``head * n_rows * D`` in int64).
    """
    if TMA:
        x = X.load([head, row0, 0]).reshape(BLOCK_R, BLOCK_D)
    else:
        rows = row0 + tl.arange(0, BLOCK_R)
        x = load_rows(X + head.to(tl.int64) * n_rows * D, rows, offs_d, n_rows, D, BLOCK_D, MASK)
    return x


@triton.jit
def store_block(X, head, row0, offs_d, n_rows, x, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                TMA: tl.constexpr):
    """Store the (BLOCK_R, BLOCK_D) block x into rows row0 ... of head ``head`` of X (N, n_rows, D).

    Taught in notebook 15, "The forward kernel".

    Rows past n_rows and columns past D are not written (TMA clips them; the pointer store masks them).
    """
    if TMA:
        X.store([head, row0, 0], x.reshape(1, BLOCK_R, BLOCK_D))
    else:
        rows = row0 + tl.arange(0, BLOCK_R)
        ptrs = X + head.to(tl.int64) * n_rows * D + rows[:, None] * D + offs_d[None, :]
        if BLOCK_D == D:
            tl.store(ptrs, x, mask=rows[:, None] < n_rows)
        else:
            tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < D))


# ------------------------------------------------------------------------------------------ forward

@triton.jit
def attn_fwd_inner(acc, l_i, m_i, q, K, V, head, k_start, k_end, offs_m, offs_n, offs_d, S, qk_scale,
                   MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                   BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """One query block's walk over the key blocks k_start, k_start + BLOCK_N, ... < k_end.

    Taught in notebook 15, "The forward kernel".

    The online softmax: m_i (BLOCK_M,) running max, l_i (BLOCK_M,) running sum, acc (BLOCK_M, BLOCK_D)
    running output, all float32; q (BLOCK_M, BLOCK_D). With MASK the keys past S (and, causal, the
    keys after each query) get score -inf; without it no mask is built and the loads are unmasked.
    """
    for k0 in range(k_start, k_end, BLOCK_N):
        offs_k = k0 + offs_n                                                       # (BLOCK_N,) key rows
        k = load_block(K, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, MASK, TMA)     # (BLOCK_N, BLOCK_D)
        v = load_block(V, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, MASK, TMA)     # (BLOCK_N, BLOCK_D)
        s = dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale                      # (BLOCK_M, BLOCK_N), base 2
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
def attn_fwd_kernel(Q, K, V, O, LSE, N, L, S, qk_scale,
                    D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """Program pid: queries start_m * BLOCK_M ... + BLOCK_M - 1 of head n = pid // ceil(L / BLOCK_M).

    Taught in notebook 15, "The forward kernel".

    Q (N, L, D), K and V (N, S, D), O (N, L, D): pointers, or with TMA tensor descriptors of them;
    LSE (N, L) float32, natural log.
    Causal (top-left, key j <= query i): key blocks entirely at or below every query of the block
    run without a mask (stage 1), the blocks that straddle the diagonal with one (stage 2), and the
    blocks after the last query are never loaded: the loop ends there. Causal programs run the
    longest (last) query blocks of a head first.
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(L, BLOCK_M)
    head = pid // n_blocks                           # which (batch, head); pointer offsets are int64
    start_m = pid % n_blocks                         # which block of queries
    if IS_CAUSAL:
        start_m = n_blocks - 1 - start_m             # the busiest programs first
    q0 = start_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)              # (BLOCK_M,) query rows
    offs_n = tl.arange(0, BLOCK_N)                   # (BLOCK_N,) key rows within a block
    offs_d = tl.arange(0, BLOCK_D)                   # (BLOCK_D,) features, BLOCK_D = next power of 2 >= D
    q = load_block(Q, head, q0, offs_d, L, D, BLOCK_M, BLOCK_D, True, TMA)       # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)     # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                   # running sum
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)          # running output

    if IS_CAUSAL:
        k_end = tl.minimum(S, q0 + BLOCK_M)                       # no query here sees a key past q0 + BLOCK_M - 1
        unmasked_end = tl.minimum((q0 + 1) // BLOCK_N, S // BLOCK_N) * BLOCK_N   # blocks every query sees whole
    else:
        k_end = S
        unmasked_end = (S // BLOCK_N) * BLOCK_N                   # full blocks; the tail block needs the mask
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K, V, head, 0, unmasked_end, offs_m, offs_n, offs_d,
                                   S, qk_scale, False, IS_CAUSAL, BLOCK_N, D, BLOCK_D, PRECISION, UPCAST, TMA)  # 1
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K, V, head, unmasked_end, k_end, offs_m, offs_n, offs_d,
                                   S, qk_scale, True, IS_CAUSAL, BLOCK_N, D, BLOCK_D, PRECISION, UPCAST, TMA)   # 2

    out = acc / l_i[:, None]                                      # every row saw key 0, so l_i > 0
    store_block(O, head, q0, offs_d, L, out.to(q.dtype), D, BLOCK_M, BLOCK_D, TMA)
    tl.store(LSE + head.to(tl.int64) * L + offs_m, (m_i + tl.log2(l_i)) * LN_2, mask=offs_m < L)   # natural log


# ------------------------------------------------------------------------------------------ backward

@triton.jit
def attn_bwd_preprocess_kernel(O, DO, DELTA, N, L, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta_i = sum_d dO_id * O_id (the row sums, ``DELTA``), float32, for BLOCK_M rows per program: one float
    per query.

    Taught in notebook 15, "The backward kernels".
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(L, BLOCK_M)
    head = (pid // n_blocks).to(tl.int64)
    offs_m = (pid % n_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(O + head * L * D, offs_m, offs_d, L, D, BLOCK_D, True).to(tl.float32)    # (BLOCK_M, BLOCK_D)
    do = load_rows(DO + head * L * D, offs_m, offs_d, L, D, BLOCK_D, True).to(tl.float32)  # (BLOCK_M, BLOCK_D)
    tl.store(DELTA + head * L + offs_m, tl.sum(o * do, 1), mask=offs_m < L)


@triton.jit
def attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, DQ_ACC, LSE_head, DELTA_head, head, q_start, q_end, offs_k, offs_d,
                        L, qk_scale, scale, MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                        TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """One key block's walk over the query blocks q_start, q_start + BLOCK_M, ... < q_end: four matmuls a
    step, five with ATOMIC_DQ.

    Taught in notebook 15, "The backward kernels".

        P^T = 2^(K Q^T * qk_scale - lse_2),  dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - delta),
        dK += dS^T Q   (times scale, once, at the end)
        ATOMIC_DQ:  dQ_block += (dS^T)^T K * scale, added into the float32 DQ_ACC (N, L, D) with atomics

    k, v (BLOCK_N, BLOCK_D) stay; dk, dv (BLOCK_N, BLOCK_D) float32. With MASK, query rows past L read 0
    and (causal) pairs with key j > query i get P = 0; without it nothing is masked.
    """
    for q0 in range(q_start, q_end, BLOCK_M):
        offs_m = q0 + tl.arange(0, BLOCK_M)                                   # (BLOCK_M,) query rows
        q = load_block(Q, head, q0, offs_d, L, D, BLOCK_M, BLOCK_D, MASK, TMA)     # (BLOCK_M, BLOCK_D)
        do = load_block(DO, head, q0, offs_d, L, D, BLOCK_M, BLOCK_D, MASK, TMA)   # (BLOCK_M, BLOCK_D)
        if MASK:
            lse2 = tl.load(LSE_head + offs_m, mask=offs_m < L, other=0.0) * LOG2_E    # (BLOCK_M,) base 2
            delta = tl.load(DELTA_head + offs_m, mask=offs_m < L, other=0.0)          # (BLOCK_M,)
        else:
            lse2 = tl.load(LSE_head + offs_m) * LOG2_E
            delta = tl.load(DELTA_head + offs_m)
        pT = tl.exp2(dot(k, tl.trans(q), PRECISION, UPCAST) * qk_scale - lse2[None, :])   # (BLOCK_N, BLOCK_M)
        if MASK:
            keep = offs_m[None, :] < L
            if IS_CAUSAL:
                keep = keep & (offs_k[:, None] <= offs_m[None, :])
            pT = tl.where(keep, pT, 0.0)
        dv += dot(pT.to(do.dtype), do, PRECISION, UPCAST)
        dpT = dot(v, tl.trans(do), PRECISION, UPCAST)                         # (BLOCK_N, BLOCK_M) dP^T
        dsT = pT * (dpT - delta[None, :])                                     # (BLOCK_N, BLOCK_M) dS^T
        dk += dot(dsT.to(q.dtype), q, PRECISION, UPCAST)
        if ATOMIC_DQ:
            dq = dot(tl.trans(dsT.to(k.dtype)), k, PRECISION, UPCAST) * scale  # (BLOCK_M, BLOCK_D) dS K
            ptrs = DQ_ACC + head.to(tl.int64) * L * D + offs_m[:, None] * D + offs_d[None, :]
            tl.atomic_add(ptrs, dq, mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), sem="relaxed")
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, N, L, S, qk_scale, scale,
                         D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                         ATOMIC_DQ: tl.constexpr):
    """Program pid: dK, dV of keys start_n * BLOCK_N ... + BLOCK_N - 1 of head n = pid // ceil(S / BLOCK_N);
    with ATOMIC_DQ also this key block's share of dQ, added into DQ_ACC.

    Taught in notebook 15, "The backward kernels".

    Walks the query blocks in up to three stages: causal, the blocks on the diagonal (masked); then
    the full query blocks below it (no mask); then the last, partial query block (masked). Query
    blocks that end before the key block starts see none of its keys: the loop starts after them.
    Keys past S are loaded as 0; their rows of dK and dV are computed and never stored.
    Q, K, V, DO, DK, DV: pointers, or with TMA tensor descriptors; DQ_ACC (N, L, D) float32, zeroed by
    the caller (ATOMIC_DQ; otherwise unused); LSE, DELTA (N, L) float32.
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(S, BLOCK_N)
    head = pid // n_blocks
    k0 = (pid % n_blocks) * BLOCK_N
    offs_k = k0 + tl.arange(0, BLOCK_N)              # (BLOCK_N,) key rows
    offs_d = tl.arange(0, BLOCK_D)
    k = load_block(K, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, True, TMA)        # (BLOCK_N, BLOCK_D)
    v = load_block(V, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, True, TMA)        # (BLOCK_N, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    LSE_head, DELTA_head = LSE + head.to(tl.int64) * L, DELTA + head.to(tl.int64) * L

    full_end = (L // BLOCK_M) * BLOCK_M              # query blocks before full_end have BLOCK_M rows
    if IS_CAUSAL:
        q_start = (k0 // BLOCK_M) * BLOCK_M          # the first query block with a query i >= k0
        diag_end = tl.minimum(tl.cdiv(k0 + BLOCK_N, BLOCK_M) * BLOCK_M, full_end)  # past it: every i >= every j
        diag_end = tl.maximum(diag_end, q_start)
    else:
        q_start = 0
        diag_end = 0
    dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, DQ_ACC, LSE_head, DELTA_head, head, q_start, diag_end, offs_k,
                                 offs_d, L, qk_scale, scale, True, IS_CAUSAL, BLOCK_M, D, BLOCK_D, PRECISION,
                                 UPCAST, TMA, ATOMIC_DQ)
    dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, DQ_ACC, LSE_head, DELTA_head, head, diag_end, full_end, offs_k,
                                 offs_d, L, qk_scale, scale, False, IS_CAUSAL, BLOCK_M, D, BLOCK_D, PRECISION,
                                 UPCAST, TMA, ATOMIC_DQ)
    tail_start = tl.maximum(full_end, diag_end)
    dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, Q, DO, DQ_ACC, LSE_head, DELTA_head, head, tail_start, L, offs_k,
                                 offs_d, L, qk_scale, scale, True, IS_CAUSAL, BLOCK_M, D, BLOCK_D, PRECISION,
                                 UPCAST, TMA, ATOMIC_DQ)
    store_block(DK, head, k0, offs_d, S, (dk * scale).to(k.dtype), D, BLOCK_N, BLOCK_D, TMA)
    store_block(DV, head, k0, offs_d, S, dv.to(k.dtype), D, BLOCK_N, BLOCK_D, TMA)


@triton.jit
def attn_bwd_dq_inner(dq, q, do, lse2, delta, K, V, head, k_start, k_end, offs_m, offs_n, offs_d, S, qk_scale,
                      MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                      BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """One query block's walk over key blocks k_start, ... < k_end: three matmuls a step.

    Taught in notebook 15, "The backward kernels".

        P = 2^(Q K^T * qk_scale - lse_2),  dP = dO V^T,  dS = P * (dP - delta),  dQ += dS K
    With MASK keys past S (and, causal, keys after each query) get P = 0.
    """
    for k0 in range(k_start, k_end, BLOCK_N):
        offs_k = k0 + offs_n
        k = load_block(K, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, MASK, TMA)   # (BLOCK_N, BLOCK_D)
        v = load_block(V, head, k0, offs_d, S, D, BLOCK_N, BLOCK_D, MASK, TMA)   # (BLOCK_N, BLOCK_D)
        p = tl.exp2(dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale - lse2[:, None])   # (BLOCK_M, BLOCK_N)
        if MASK:
            keep = offs_k[None, :] < S
            if IS_CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = dot(do, tl.trans(v), PRECISION, UPCAST)                             # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq += dot(ds.to(k.dtype), k, PRECISION, UPCAST)
    return dq


@triton.jit
def attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, N, L, S, qk_scale, scale,
                       D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """Program pid: dQ of queries start_m * BLOCK_M ... + BLOCK_M - 1 of head n = pid // ceil(L / BLOCK_M).

    Taught in notebook 15, "The backward kernels".

    Walks the key blocks with the forward's two stages (no mask, then the diagonal and the tail of S),
    recomputing P from the saved log-sum-exp; causal, the busiest query blocks run first.
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(L, BLOCK_M)
    head = pid // n_blocks
    start_m = pid % n_blocks
    if IS_CAUSAL:
        start_m = n_blocks - 1 - start_m
    q0 = start_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_block(Q, head, q0, offs_d, L, D, BLOCK_M, BLOCK_D, True, TMA)       # (BLOCK_M, BLOCK_D)
    do = load_block(DO, head, q0, offs_d, L, D, BLOCK_M, BLOCK_D, True, TMA)     # (BLOCK_M, BLOCK_D)
    lse2 = tl.load(LSE + head.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0) * LOG2_E
    delta = tl.load(DELTA + head.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if IS_CAUSAL:
        k_end = tl.minimum(S, q0 + BLOCK_M)
        unmasked_end = tl.minimum((q0 + 1) // BLOCK_N, S // BLOCK_N) * BLOCK_N
    else:
        k_end = S
        unmasked_end = (S // BLOCK_N) * BLOCK_N
    dq = attn_bwd_dq_inner(dq, q, do, lse2, delta, K, V, head, 0, unmasked_end, offs_m, offs_n, offs_d, S,
                           qk_scale, False, IS_CAUSAL, BLOCK_N, D, BLOCK_D, PRECISION, UPCAST, TMA)
    dq = attn_bwd_dq_inner(dq, q, do, lse2, delta, K, V, head, unmasked_end, k_end, offs_m, offs_n, offs_d, S,
                           qk_scale, True, IS_CAUSAL, BLOCK_N, D, BLOCK_D, PRECISION, UPCAST, TMA)
    store_block(DQ, head, q0, offs_d, L, (dq * scale).to(q.dtype), D, BLOCK_M, BLOCK_D, TMA)
