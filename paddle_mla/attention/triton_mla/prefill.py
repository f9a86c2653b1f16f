"""Variable-length causal prefill ("extend") flash attention: queries are a request's new tokens,
keys and values its cached + new tokens (after kv_b_proj on the interleaved latent).

Query i of request b sits at position k_len_b - q_len_b + i and sees keys at positions <= it.
Head dims need not be powers of two: Dqk is split into a power-of-two part and a padded tail
(192 = 128 + 64 exactly), Dv is padded and masked.
"""

from __future__ import annotations

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import interpreting, next_pow2, prev_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    Q, K, V, O, CU_Q, CU_K, sm_scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    DA: tl.constexpr, DB: tl.constexpr, BLOCK_DB: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    mblk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q0 = tl.load(CU_Q + b)
    q_len = tl.load(CU_Q + b + 1) - q0
    if mblk * BLOCK_M < q_len:
        k0 = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k0
        offset = k_len - q_len
        offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        mm = offs_m < q_len
        qpos = offset + offs_m
        offs_a = tl.arange(0, DA)
        offs_b = tl.arange(0, BLOCK_DB)
        mb = offs_b < DB
        offs_v = tl.arange(0, BLOCK_DV)
        mv = offs_v < DV
        offs_n = tl.arange(0, BLOCK_N)
        q_ptr = Q + (q0 + offs_m).to(tl.int64)[:, None] * stride_qt + h * stride_qh
        q_a = tl.load(q_ptr + offs_a[None, :], mask=mm[:, None], other=0.0)
        if DB > 0:
            q_b = tl.load(q_ptr + DA + offs_b[None, :], mask=mm[:, None] & mb[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        # keys past the last query of this block are never visible
        end = tl.minimum(k_len, offset + tl.minimum((mblk + 1) * BLOCK_M, q_len))
        for start in range(0, end, BLOCK_N):
            kpos = start + offs_n
            mn = kpos < end
            k_ptr = K + (k0 + kpos).to(tl.int64)[:, None] * stride_kt + h * stride_kh
            k_a = tl.load(k_ptr + offs_a[None, :], mask=mn[:, None], other=0.0)
            s = tl.dot(q_a, tl.trans(k_a))
            if DB > 0:
                k_b = tl.load(k_ptr + DA + offs_b[None, :], mask=mn[:, None] & mb[None, :], other=0.0)
                s = tl.dot(q_b, tl.trans(k_b), s)
            ok = (kpos[None, :] <= qpos[:, None]) & mn[None, :]
            s = tl.where(ok, s * sm_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows past q_len see nothing
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + (k0 + kpos).to(tl.int64)[:, None] * stride_vt + h * stride_vh + offs_v[None, :],
                        mask=mn[:, None] & mv[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptr = O + (q0 + offs_m).to(tl.int64)[:, None] * stride_ot + h * stride_oh + offs_v[None, :]
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mm[:, None] & mv[None, :])


def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, sm_scale: float, out=None):
    """q [Tq, H, Dqk], k [Tk, H, Dqk], v [Tk, H, Dv] -> [Tq, H, Dv]; cu_seqlens int32 [B+1];
    max_seqlen_q is the host-known upper bound of the per-request query lengths."""
    tq, H, dqk = q.shape
    dv = v.shape[-1]
    bs = cu_seqlens_q.shape[0] - 1
    if out is None:
        out = torch.empty((tq, H, dv), dtype=q.dtype, device=q.device)
    if tq == 0 or bs <= 0 or max_seqlen_q <= 0:
        return out
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and out.stride(2) == 1
    da = prev_pow2(dqk) if dqk >= 16 else 16
    db = max(dqk - da, 0)
    if interpreting():
        block_m, block_n, warps, stages = 16, 16, 4, 1
    else:
        block_m, block_n = (128, 64) if dqk + dv <= 384 else (64, 64)
        warps, stages = (8 if block_m == 128 else 4), 2
    grid = (triton.cdiv(max_seqlen_q, block_m), bs, H)
    _prefill_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, sm_scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        DA=da, DB=db, BLOCK_DB=max(16, next_pow2(db)) if db > 0 else 16, DV=dv, BLOCK_DV=max(16, next_pow2(dv)),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages,
    )
    return out
