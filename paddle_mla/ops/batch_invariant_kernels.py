"""The Triton GEMM of ``batch_invariant``: one tile config, no split-K, fp32 accumulation.

Each program owns a TILE_M x TILE_N output tile and walks K in TILE_K steps from 0 upwards, so an
output element is the same sequence of MMA steps whatever M is and whichever tile row it lands in.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.ops.batch_invariant import GROUP_M, NUM_STAGES, NUM_WARPS, TILE_K, TILE_M, TILE_N


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 stride_ag, stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cg, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                 PREC: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP row tiles share their B columns in L2 (placement only, not arithmetic)
    width = GROUP * num_n
    first_m = (pid // width) * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + g * stride_ag + rows.to(tl.int64)[:, None] * stride_am
    b_base = b_ptr + g * stride_bg + cols.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(a_base + kk[None, :] * stride_ak, mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_base + kk[:, None] * stride_bk, mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
    c = c_ptr + g * stride_cg + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _launch(a, b, out, G: int, M: int, N: int, K: int, sa, sb, sc) -> None:
    if M == 0 or N == 0:
        return
    prec = "ieee" if a.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(M, TILE_M) * triton.cdiv(N, TILE_N), G)
    _gemm_kernel[grid](a, b, out, M, N, K, *sa, *sb, *sc, BLOCK_M=TILE_M, BLOCK_N=TILE_N, BLOCK_K=TILE_K,
                       GROUP=GROUP_M, PREC=prec, num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def gemm_nt(x, w):
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype."""
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _launch(x, w, out, 1, M, N, K, (0, x.stride(0), x.stride(1)), (0, w.stride(1), w.stride(0)),
            (0, out.stride(0), out.stride(1)))
    return out


def bmm_nn(a, b):
    """a [G, M, K] @ b [G, K, N] -> [G, M, N] in a's dtype."""
    G, M, K = a.shape
    N = b.shape[2]
    out = torch.empty((G, M, N), dtype=a.dtype, device=a.device)
    _launch(a, b, out, G, M, N, K, a.stride(), b.stride(), out.stride())
    return out


@triton.jit(do_not_specialize=["N"])
def _row_logsumexp_kernel(x_ptr, out_ptr, N, stride, BLOCK: tl.constexpr):
    """One program per row: the max, then the sum of exp over BLOCK-wide chunks in column order."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for n0 in range(0, N, BLOCK):
        v = tl.load(base + n0 + cols, mask=n0 + cols < N, other=float("-inf")).to(tl.float32)
        run_max = tl.maximum(run_max, v)
    m = tl.max(run_max, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)   # an all -inf row: log(0) = -inf, not NaN
    acc = tl.zeros([BLOCK], tl.float32)
    for n0 in range(0, N, BLOCK):
        v = tl.load(base + n0 + cols, mask=n0 + cols < N, other=float("-inf")).to(tl.float32)
        acc += tl.exp(v - m_safe)
    tl.store(out_ptr + row, m_safe + tl.log(tl.sum(acc, 0)))


def row_logsumexp(x):
    """x [B, N] (last dim contiguous) -> float32 [B, 1]."""
    B, N = x.shape
    out = torch.empty((B, 1), dtype=torch.float32, device=x.device)
    if B:
        _row_logsumexp_kernel[(B,)](x, out, N, x.stride(0), BLOCK=1024, num_warps=4)
    return out
