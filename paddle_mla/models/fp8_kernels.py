"""Triton kernels for FP8 (e4m3) block-scaled linears: per-token-group activation quant and the
w8a8 block-scaled GEMM (the DeepSeek-V3 recipe, as vLLM / SGLang run it).

Plain-tensor references and the workspace live in ``paddle_mla.models.fp8``; these kernels need a GPU with FP8 tensor
cores (sm_89+): the Triton interpreter has no float8 dot.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

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
                       stride_am, stride_bn, stride_cm, stride_asm, stride_bsn, num_splits, stride_cs,
                       BLOCK_N_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = sum_k (A_q[m, kblk] * As[m, kblk]) @ (B_q[n, kblk] * Bs[n // BN_SCALE, kblk])^T.

    BLOCK_K equals the quant group along K, so each K step has one activation scale per row and
    one weight scale per output column (edge weight blocks included: the column picks its block).
    Split-K: program_id(1) = s sums K blocks [s * KB // S, (s + 1) * KB // S) (KB = K / BLOCK_K,
    S = num_splits <= KB: chunks differ by at most one block, none empty, none splits a scale block)
    into the fp32 slice C + s * stride_cs; ``_split_k_reduce_kernel`` sums the slices.
    Unsplit: S = 1, stride_cs = 0, C = out.
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    kblocks = tl.cdiv(K, BLOCK_K)
    kb_start = split * kblocks // num_splits
    kb_end = (split + 1) * kblocks // num_splits
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = kb_start * BLOCK_K + tl.arange(0, BLOCK_K)
    # int64 row offsets: M * K overflows int32 at prefill sizes of the largest layers
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm
    bs_ptrs = bs_ptr + (offs_n // BLOCK_N_SCALE) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        a_s = tl.load(as_ptrs + kb)
        b_s = tl.load(bs_ptrs + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + split.to(tl.int64) * stride_cs + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _split_k_reduce_kernel(ws_ptr, c_ptr, M, N, stride_cm, SPLIT, BLOCK: tl.constexpr):
    """out[m, n] = sum_s ws[s, m, n] in a fixed order (deterministic), cast to out's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    tl.store(c_ptr + (offs // N) * stride_cm + offs % N, acc.to(c_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemmTile:
    """One launch config of the w8a8 GEMM (BLOCK_K is the weight's K block, not part of the tile)."""

    max_m: int           # the row applies to M <= max_m (first match wins)
    block_m: int
    block_n: int
    group_m: int
    num_warps: int
    num_stages: int


# Decode (M <= 64) is weight-bandwidth bound: small M tiles, and split-K (below) supplies the
# parallelism that narrow N tiles used to. Prefill wants big tiles for tensor-core reuse.
GEMM_TILES = (
    GemmTile(16, 16, 64, 8, 4, 5),
    GemmTile(32, 32, 64, 8, 4, 4),
    GemmTile(64, 64, 64, 8, 4, 4),
    GemmTile(256, 64, 128, 8, 4, 3),
    GemmTile(1023, 128, 128, 8, 8, 3),
    GemmTile(1 << 62, 128, 128, 8, 8, 4),
)
# ``deterministic: true``: this one tile for every M and no split-K, so a row's sums never depend
# on how many rows share the GEMM (``fp8.w8a8_plan``)
BATCH_INVARIANT_TILE = GemmTile(1 << 62, 64, 128, 8, 4, 3)
SPLIT_K_MAX_M = 64          # beyond this the fp32 partials' traffic outweighs idle SMs
SPLIT_K_PROGRAMS_PER_SM = 3  # aim for ~3 programs per SM (2-4 keeps every SM streaming)


@dataclass(frozen=True)
class GemmPlan:
    tile: GemmTile
    split: int           # number of K chunks (1: no split-K, no workspace)


def gemm_plan(M: int, N: int, K: int, bk: int, sms: int) -> GemmPlan:
    """The tile for M, and the split-K factor when the output tiles alone leave SMs idle: fewer
    than two waves of tiles and M <= SPLIT_K_MAX_M -> S chunks so that tiles * S ~ 3 * SMs, each
    chunk whole K blocks (S <= K / bk)."""
    tile = next(t for t in GEMM_TILES if M <= t.max_m)
    kblocks = -(-K // bk)
    tiles = -(-M // tile.block_m) * -(-N // tile.block_n)
    if M > SPLIT_K_MAX_M or tiles >= 2 * sms or kblocks < 2:
        return GemmPlan(tile, 1)
    return GemmPlan(tile, min(kblocks, max(1, round(SPLIT_K_PROGRAMS_PER_SM * sms / tiles))))


def w8a8_block_matmul(a_q, a_s, b_q, b_s, out, block: tuple[int, int], plan: GemmPlan, workspace=None) -> None:
    """out[M, N] = dequant(a_q, a_s) @ dequant(b_q, b_s)^T, written in place.

    a_q [M, K] e4m3 with per-row group scales a_s [M, K/bk]; b_q [N, K] e4m3 with block scales
    b_s [ceil(N/bn), K/bk]. K must be a multiple of bk (edge blocks along N are fine).
    ``plan`` from ``gemm_plan``; with plan.split > 1, ``workspace`` is contiguous fp32 with at least
    split * M * N elements (the per-chunk partials).
    """
    M, K = a_q.shape
    N = b_q.shape[0]
    bn, bk = block
    if M == 0:
        return
    t = plan.tile
    cfg = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, GROUP_M=t.group_m, num_warps=t.num_warps,
               num_stages=t.num_stages)
    grid = (triton.cdiv(M, t.block_m) * triton.cdiv(N, t.block_n), plan.split)
    if plan.split == 1:
        _w8a8_block_kernel[grid](a_q, b_q, out, a_s, b_s, M, N, K, a_q.stride(0), b_q.stride(0), out.stride(0),
                                 a_s.stride(0), b_s.stride(0), 1, 0,
                                 BLOCK_N_SCALE=bn, BLOCK_K=bk, **cfg)
        return
    if workspace is None or workspace.numel() < plan.split * M * N:
        raise ValueError(f"split-K {plan.split} needs a fp32 workspace of {plan.split * M * N} elements")
    _w8a8_block_kernel[grid](a_q, b_q, workspace, a_s, b_s, M, N, K, a_q.stride(0), b_q.stride(0), N,
                             a_s.stride(0), b_s.stride(0), plan.split, M * N,
                             BLOCK_N_SCALE=bn, BLOCK_K=bk, **cfg)
    _split_k_reduce_kernel[(triton.cdiv(M * N, 1024),)](workspace, out, M, N, out.stride(0), plan.split,
                                                       BLOCK=1024, num_warps=4)
