"""Triton kernels of the DSA indexer: scores over the paged key cache and top-k positions -> slots.

- ``index_scores``: ``score[t, j] = sum_h w[t, h] relu(q[t, h] . key_j)`` for the keys of token t's
  request, read straight from the paged indexer key cache through the block table. With key windows
  (prefill steps) token t sees request positions ``[ks - cu_k[b], ke - cu_k[b])``; without (pure
  decode) ``[0, position + 1)``. Outside the window the score is -inf. Rows are the step's tokens,
  columns request positions (width ``max_seqlen_k``).
- ``positions_to_slots``: top-k request positions -> physical cache slots, -1 kept.
References: ``paddle_mla.attention.dsa.reference``.
"""

from __future__ import annotations

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import next_pow2


@triton.jit
def _index_score_kernel(
    q, w, cache, tables, batch_ids, positions, ks, ke, cu_k, out,
    stride_qt, stride_qh, stride_wt, stride_cb, stride_cs, stride_tb, stride_ot,
    H, D, N_OUT, PAGE: tl.constexpr, USE_WINDOW: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.load(batch_ids + t)
    bc = tl.maximum(b, 0)
    if USE_WINDOW:
        base = tl.load(cu_k + bc)
        lo = tl.load(ks + t) - base
        hi = tl.load(ke + t) - base
    else:
        lo = 0
        hi = tl.load(positions + t).to(tl.int32) + 1
    hi = tl.where(b >= 0, hi, 0)
    valid = (n >= lo) & (n < hi)
    blk = tl.load(tables + bc.to(tl.int64) * stride_tb + n // PAGE, mask=valid, other=0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    krow = cache + blk * stride_cb + (n % PAGE).to(tl.int64) * stride_cs
    keys = tl.load(krow[:, None] + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0.0)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        qh = tl.load(q + t.to(tl.int64) * stride_qt + h[:, None] * stride_qh + d[None, :],
                     mask=(h[:, None] < H) & (d[None, :] < D), other=0.0)
        dots = tl.dot(qh, tl.trans(keys).to(qh.dtype), out_dtype=tl.float32)            # [BLOCK_H, BLOCK_N]
        wh = tl.load(w + t.to(tl.int64) * stride_wt + h, mask=h < H, other=0.0).to(tl.float32)
        total += tl.sum(tl.maximum(dots, 0.0) * wh[:, None], axis=0)
    total = tl.where(valid, total, float("-inf"))
    tl.store(out + t.to(tl.int64) * stride_ot + n, total, mask=n < N_OUT)


def index_scores(q, w, index_cache, block_tables, batch_ids, positions, width: int, out,
                 ks=None, ke=None, cu_seqlens_k=None):
    """q [T, H, D], w [T, H] float32, index_cache [NB, bs, 1, D] -> out[:T, :width] float32 scores.

    ``ks``/``ke`` given (prefill steps): windows in gathered-key coordinates (with ``cu_seqlens_k``);
    else causal by ``positions``. ``out`` is a caller-owned workspace with at least [T, width].
    """
    T, H, D = q.shape
    if T == 0 or width == 0:
        return out[:T, :width]
    use_window = ks is not None
    if use_window and (ke is None or cu_seqlens_k is None):
        raise ValueError("index_scores: ks needs ke and cu_seqlens_k")
    assert q.stride(2) == 1 and index_cache.stride(3) == 1 and out.stride(1) == 1
    block_n = min(64, max(16, next_pow2(width)))
    block_d = max(16, next_pow2(D))
    grid = (T, triton.cdiv(width, block_n))
    dummy = positions
    _index_score_kernel[grid](
        q, w, index_cache, block_tables, batch_ids, positions,
        ks if use_window else dummy, ke if use_window else dummy, cu_seqlens_k if use_window else dummy, out,
        q.stride(0), q.stride(1), w.stride(0), index_cache.stride(0), index_cache.stride(1), block_tables.stride(0),
        out.stride(0), H, D, width, PAGE=index_cache.shape[1], USE_WINDOW=use_window,
        BLOCK_H=min(max(16, next_pow2(H)), 64), BLOCK_D=block_d, BLOCK_N=block_n,
    )
    return out[:T, :width]


def topk_positions(scores, topk: int, out):
    """Top-k columns per row, -1 where the row has fewer finite scores; into ``out`` [>= T, topk] int64.

    Uses the framework's top-k (a device op: no host sync); a Triton radix select is left to do.
    """
    T, n = scores.shape
    res = out[:T]
    res.fill_(-1)
    k = min(topk, n)
    if T == 0 or k == 0:
        return res
    vals, idx = torch.topk(scores, k, dim=-1)
    res[:, :k] = torch.where(vals == float("-inf"), torch.full_like(idx, -1), idx.to(torch.int64))
    return res


@triton.jit
def _pos_to_slot_kernel(pos, batch_ids, tables, out, stride_pt, stride_tb, stride_ot, K,
                        PAGE: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m = k < K
    p = tl.load(pos + t.to(tl.int64) * stride_pt + k, mask=m, other=-1)
    b = tl.load(batch_ids + t)
    ok = m & (p >= 0) & (b >= 0)
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
