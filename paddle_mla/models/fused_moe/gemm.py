"""The grouped GEMM of the fused MoE (one Triton kernel, two uses) and the top-k sum.

Rows of a BLOCK_M tile are pairs of one expert (see align.py). ``GATED``: A rows are tokens
(pair // top_k), two weight tiles (gate, up) share each A tile and the epilogue writes silu(g)*u;
``QUANT_OUT`` (w8a8) also quantizes that output per (row, BLOCK_N columns: 64 or 128) to e4m3 with
its fp32 scale, so the down GEMM reads FP8 without another kernel (its A_GROUP is that BLOCK_N). Not gated: the down
projection, A rows are pairs, the epilogue multiplies by the routing weight. FP8 (``BLOCK_SCALED``):
acc += dot(a_q, b_q) * a_scale[row, k/A_GROUP] * b_scale[e, n/128, k/128]; BLOCK_K divides A_GROUP
(128 for the layer input, 64 or 128 for the intermediate), which divides 128.
All row offsets are int64 (M * top_k * K passes 2^31 near 37k tokens at V3 sizes).
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)
FP8_MIN_SCALE = tl.constexpr(1e-10)


@triton.jit
def grouped_gemm_kernel(
        a_ptr, b_ptr, b2_ptr, c_ptr, a_scale_ptr, b_scale_ptr, b2_scale_ptr, c_scale_ptr, topk_weights_ptr,
        sorted_ids_ptr, expert_ids_ptr, total_ptr,
        N, K, num_pairs,
        stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
        stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm, stride_csn,
        A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED: tl.constexpr, BLOCK_SCALED: tl.constexpr,
        QUANT_OUT: tl.constexpr, IEEE: tl.constexpr, GROUP: tl.constexpr, A_GROUP: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_m = tl.num_programs(0) // num_pid_n       # the grid is (M blocks * N blocks,)
    group_id = pid // (GROUP_M * num_pid_n)
    first_m = group_id * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size

    total = tl.load(total_ptr)
    if pid_m * BLOCK_M >= total:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)
    row_ok = pair < num_pairs
    a_row = pair // A_ROW_DIV
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:      # a single-token call's pair of an expert another rank holds (expert parallel)
        return

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N                 # wrapped: loads stay in bounds, stores are masked
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_off = expert * stride_be + offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    b_ptrs = b_ptr + b_off
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        b2_ptrs = b2_ptr + b_off
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BLOCK_SCALED:
        as_ptrs = a_scale_ptr + a_row * stride_asm
        bs_off = expert * stride_bse + (offs_bn // GROUP) * stride_bsn
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if GATED:
            b2 = tl.load(b2_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if BLOCK_SCALED:
            kg = (kb * BLOCK_K) // GROUP
            a_s = tl.load(as_ptrs + ((kb * BLOCK_K) // A_GROUP) * stride_ask, mask=row_ok, other=0.0)
            b_s = tl.load(b_scale_ptr + bs_off + kg * stride_bsk)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
            if GATED:
                b2_s = tl.load(b2_scale_ptr + bs_off + kg * stride_bsk)
                acc2 += tl.dot(a, b2) * a_s[:, None] * b2_s[None, :]
        elif IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
            if GATED:
                acc2 += tl.dot(a, b2, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
            if GATED:
                acc2 += tl.dot(a, b2)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        if GATED:
            b2_ptrs += BLOCK_K * stride_bk

    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc2          # silu(gate) * up, in fp32
    if MUL_ROUTED:
        w = tl.load(topk_weights_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w.to(tl.float32)[:, None]
    col_ok = offs_n < N
    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if QUANT_OUT:
        # one scale per (row, this BLOCK_N wide column block): amax / 448, floored at 1e-10
        amax = tl.max(tl.where(col_ok[None, :], tl.abs(acc), 0.0), 1)
        scale = tl.maximum(amax / FP8_MAX, FP8_MIN_SCALE)
        q = tl.minimum(tl.maximum(acc / scale[:, None], -FP8_MAX), FP8_MAX)
        tl.store(c_ptrs, q.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        tl.store(c_scale_ptr + pair * stride_csm + pid_n * stride_csn, scale, mask=row_ok)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def sum_topk_kernel(y_ptr, out_ptr, ids_ptr, K, num_experts, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[t, :] = sum_k y[t, k, :] in fp32 (y contiguous [M, TOP_K, K], out contiguous [M, K]) over
    the pairs whose expert id (ids [M, TOP_K]) is in [0, num_experts): the others were never computed."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + k)
        ok = (e >= 0) & (e < num_experts)
        acc += tl.load(y_ptr + (t * TOP_K + k) * K + offs, mask=mask & ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * K + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
