"""Triton kernels for FP8 (e4m3) block-scaled linears: per-token-group activation quant and the
w8a8 block-scaled GEMM (the DeepSeek-V3 recipe, as vLLM / SGLang run it).

Plain-tensor references live in ``paddle_mla.models.fp8``; these kernels need a GPU with FP8 tensor
cores (sm_89+): the Triton interpreter has no float8 dot.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = 448.0            # largest finite float8_e4m3fn
INV_FP8_MAX = 1.0 / 448.0  # scales are amax * this (a multiply: the reference reproduces it bit for bit)
SCALE_MIN = 1e-10          # scale floor: an all-zero group quantizes to zeros, not NaN


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, groups_per_row,
                        GROUP: tl.constexpr, BLOCK: tl.constexpr, scale_min, inv_fp8_max, fp8_max):
    """One program per (row, group): scale = max(amax * (1/448), floor); q = clamp(x/scale) as e4m3."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // groups_per_row
    g = pid % groups_per_row
    cols = tl.arange(0, BLOCK)
    mask = cols < GROUP
    x = tl.load(x_ptr + row * stride_xm + g * GROUP + cols, mask=mask, other=0.0).to(tl.float32)
    # the reference's exact arithmetic: one fp32 multiply for the scale, an IEEE-rounded division
    # for the codes (Triton's default fp32 '/' is approximate), so the codes match bit for bit
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * inv_fp8_max, scale_min)
    q = tl.clamp(tl.div_rn(x, scale), -fp8_max, fp8_max)
    tl.store(q_ptr + row * stride_qm + g * GROUP + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + g, scale)


def group_quant(x, x_q, x_s, group: int) -> None:
    """x [M, K] (K % group == 0) -> x_q [M, K] e4m3, x_s [M, K/group] fp32, written in place."""
    M, K = x.shape
    gpr = K // group
    if M == 0:
        return
    _group_quant_kernel[(M * gpr,)](x, x_q, x_s, K, x.stride(0), x_q.stride(0), x_s.stride(0), gpr,
                                    GROUP=group, BLOCK=triton.next_power_of_2(group), scale_min=SCALE_MIN,
                                    inv_fp8_max=INV_FP8_MAX, fp8_max=FP8_MAX, num_warps=1 if group <= 128 else 4)


@triton.jit
def _w8a8_block_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
                       stride_am, stride_bn, stride_cm, stride_asm, stride_bsn,
                       BLOCK_N_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = sum_k (A_q[m, kblk] * As[m, kblk]) @ (B_q[n, kblk] * Bs[n // BN_SCALE, kblk])^T.

    BLOCK_K equals the quant group along K, so each K step has one activation scale per row and
    one weight scale per output column (edge weight blocks included: the column picks its block).
    """
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    # int64 row offsets: M * K overflows int32 at prefill sizes of the largest layers
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm
    bs_ptrs = bs_ptr + (offs_n // BLOCK_N_SCALE) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        a_s = tl.load(as_ptrs + kb)
        b_s = tl.load(bs_ptrs + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _config(M: int, N: int) -> dict:
    """Launch config by shape. Small M is weight-bandwidth bound: narrow N tiles give enough
    programs to keep every SM streaming weights; large M wants big tiles for tensor-core reuse."""
    if M <= 16:
        bm, bn, warps, stages = 16, 32 if N >= 4096 else 16, 4, 4
    elif M <= 64:
        bm, bn, warps, stages = 64 if M > 32 else 32, 64 if N >= 4096 else 32, 4, 4
    elif M <= 256:
        bm, bn, warps, stages = 64, 64, 4, 3
    else:
        bm, bn, warps, stages = 128, 128, 8, 3
    return dict(BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=warps, num_stages=stages)


def w8a8_block_matmul(a_q, a_s, b_q, b_s, out, block: tuple[int, int]) -> None:
    """out[M, N] = dequant(a_q, a_s) @ dequant(b_q, b_s)^T, written in place.

    a_q [M, K] e4m3 with per-row group scales a_s [M, K/bk]; b_q [N, K] e4m3 with block scales
    b_s [ceil(N/bn), K/bk]. K must be a multiple of bk (edge blocks along N are fine).
    """
    M, K = a_q.shape
    N = b_q.shape[0]
    bn, bk = block
    if M == 0:
        return
    cfg = _config(M, N)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    _w8a8_block_kernel[grid](a_q, b_q, out, a_s, b_s, M, N, K, a_q.stride(0), b_q.stride(0), out.stride(0),
                             a_s.stride(0), b_s.stride(0), BLOCK_N_SCALE=bn, BLOCK_K=bk, **cfg)
