"""Triton kernels of the DSA indexer: scores over the paged key cache and top-k positions -> slots.

- ``index_scores``: ``score[t, j] = sum_h w[t, h] relu(q[t, h] . key_j)`` for the keys of token t's
  request, read straight from the paged indexer key cache through the block table. With key windows
  (prefill steps) token t sees request positions ``[ks - cu_k[b], ke - cu_k[b])``; without (pure
  decode) ``[0, position + 1)``; only the window is written. Rows are the step's tokens, columns
  request positions. The top-k over each row's window is ``topk_select.topk_select``.
- ``positions_to_slots``: top-k request positions -> physical cache slots, -1 kept.
References: ``paddle_mla.attention.dsa.reference``.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.attention.dsa.topk_select import row_window
from paddle_mla.platform.triton_host import interpreting, next_pow2, num_sms


@triton.jit
def _index_score_kernel(
    q, w, cache, tables, batch_ids, positions, ks, ke, cu_k, out,
    stride_qt, stride_qh, stride_wt, stride_cb, stride_cs, stride_tb, stride_ot,
    H, D, PAGE: tl.constexpr, USE_WINDOW: tl.constexpr, ONE_HEAD_BLOCK: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # grid (T, P): program p of row t takes the key blocks p, p + P, ... of the row's window, so the
    # grid does not depend on the context length (graph-safe) and q is loaded once per program
    t = tl.program_id(0)
    P = tl.num_programs(1)
    b, lo, hi = row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW)
    bc = tl.maximum(b, 0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    hh = tl.arange(0, BLOCK_H)
    q_row = q + t.to(tl.int64) * stride_qt
    if ONE_HEAD_BLOCK:   # all heads' queries stay in registers for the whole row
        q_all = tl.load(q_row + hh[:, None] * stride_qh + d[None, :], mask=(hh[:, None] < H) & (d[None, :] < D),
                        other=0.0)
        w_all = tl.load(w + t.to(tl.int64) * stride_wt + hh, mask=hh < H, other=0.0).to(tl.float32)
    for blk in range(lo // BLOCK_N + tl.program_id(1), tl.cdiv(hi, BLOCK_N), P):
        n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (n >= lo) & (n < hi)
        page = tl.load(tables + bc * stride_tb + n // PAGE, mask=valid, other=0).to(tl.int64)
        krow = cache + page * stride_cb + (n % PAGE).to(tl.int64) * stride_cs
        keys = tl.load(krow[:, None] + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0.0)
        if ONE_HEAD_BLOCK:
            dots = tl.dot(q_all, tl.trans(keys).to(q_all.dtype), out_dtype=tl.float32)    # [BLOCK_H, BLOCK_N]
            total = tl.sum(tl.maximum(dots, 0.0) * w_all[:, None], axis=0)
        else:
            total = tl.zeros([BLOCK_N], dtype=tl.float32)
            for h0 in range(0, H, BLOCK_H):
                h = h0 + hh
                qh = tl.load(q_row + h[:, None] * stride_qh + d[None, :], mask=(h[:, None] < H) & (d[None, :] < D),
                             other=0.0)
                dots = tl.dot(qh, tl.trans(keys).to(qh.dtype), out_dtype=tl.float32)
                wh = tl.load(w + t.to(tl.int64) * stride_wt + h, mask=h < H, other=0.0).to(tl.float32)
                total += tl.sum(tl.maximum(dots, 0.0) * wh[:, None], axis=0)
        tl.store(out + t.to(tl.int64) * stride_ot + n, total, mask=valid)


def score_programs_per_row(rows: int, width: int, block_n: int, per_sm: int = 16) -> int:
    """Programs per row: about ``per_sm`` per SM over the whole grid, never more than the row has blocks."""
    target = per_sm * num_sms()
    return max(1, min(triton.cdiv(width, block_n), triton.cdiv(target, max(rows, 1))))


def index_scores(q, w, index_cache, block_tables, batch_ids, positions, width: int, out,
                 ks=None, ke=None, cu_seqlens_k=None, block_n: int = 0, num_warps: int = 0, per_sm: int = 16,
                 num_stages: int = 3):
    """q [T, H, D], w [T, H] float32, index_cache [NB, bs, 1, D] -> out[:T, :width] float32 scores.

    ``ks``/``ke`` given (prefill steps): windows in gathered-key coordinates (with ``cu_seqlens_k``);
    else causal by ``positions``. Only each row's window is written: the rest of ``out`` (a
    caller-owned workspace of at least [T, width]) is left as it was. ``width`` only bounds the
    windows; the work follows each row's own window.
    """
    T, H, D = q.shape
    if T == 0 or width == 0:
        return out[:T, :width]
    use_window = ks is not None
    if use_window and (ke is None or cu_seqlens_k is None):
        raise ValueError("index_scores: ks needs ke and cu_seqlens_k")
    assert q.stride(2) == 1 and index_cache.stride(3) == 1 and out.stride(1) == 1
    # 64 keys x 8 warps, 16 programs per SM: 82% of copy bandwidth at [64, 32k] on an H100 (the
    # 128-key tile at 8 per SM: 72%); benchmarks.kernels.dsa --sweep
    block_n = block_n or (16 if interpreting() else 64)
    block_d = max(16, next_pow2(D))
    block_h = min(max(16, next_pow2(H)), 64)
    grid = (T, score_programs_per_row(T, width, block_n, per_sm))
    dummy = positions
    _index_score_kernel[grid](
        q, w, index_cache, block_tables, batch_ids, positions,
        ks if use_window else dummy, ke if use_window else dummy, cu_seqlens_k if use_window else dummy, out,
        q.stride(0), q.stride(1), w.stride(0), index_cache.stride(0), index_cache.stride(1), block_tables.stride(0),
        out.stride(0), H, D, PAGE=index_cache.shape[1], USE_WINDOW=use_window, ONE_HEAD_BLOCK=block_h >= H,
        BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n,
        num_warps=num_warps or 8, num_stages=num_stages,
    )
    return out[:T, :width]


@triton.jit
def _pos_to_slot_kernel(pos, batch_ids, tables, out, stride_pt, stride_tb, stride_ot, K,
                        PAGE: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m = k < K
    p = tl.load(pos + t.to(tl.int64) * stride_pt + k, mask=m, other=-1)
    b = tl.load(batch_ids + t)
    ok = m & (p >= 0) & (tl.zeros_like(k) + b >= 0)     # b as a vector (Triton 3.9's interpreter: int32 mask)
    blk = tl.load(tables + tl.maximum(b, 0).to(tl.int64) * stride_tb + tl.where(ok, p, 0) // PAGE, mask=ok, other=0)
    slot = tl.where(ok, blk.to(tl.int64) * PAGE + p % PAGE, -1)
    tl.store(out + t.to(tl.int64) * stride_ot + k, slot, mask=m)


def positions_to_slots(topk_pos, batch_ids, block_tables, block_size: int, out):
    """topk_pos int64 [T, K] (request positions, -1 padded) -> out[:T] int64 cache slots (-1 kept)."""
    T, K = topk_pos.shape
    res = out[:T]
    if T == 0:
        return res
    block_k = min(1024, next_pow2(K))
    _pos_to_slot_kernel[(T, triton.cdiv(K, block_k))](
        topk_pos, batch_ids, block_tables, res, topk_pos.stride(0), block_tables.stride(0), res.stride(0), K,
        PAGE=block_size, BLOCK_K=block_k)
    return res
