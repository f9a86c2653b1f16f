"""Triton kernels of the DSA indexer: scores over the paged key cache and top-k positions -> slots.

- ``index_scores``: ``score[t, j] = sum_h w[t, h] relu(q[t, h] . key_j)`` for the keys of token t's
  request, read straight from the paged indexer key cache through the block table. With key windows
  (prefill steps) token t sees request positions ``[ks - cu_k[b], ke - cu_k[b])``; without (pure
  decode) ``[0, position + 1)``; only the window is written. Rows are the step's tokens, columns
  request positions.
- ``index_topk``: the same scores and, in the same pass, the exact top-k columns of each row's window
  (the threshold and select pieces live in ``topk_select``).
- ``positions_to_slots``: top-k request positions -> physical cache slots, -1 kept.
References: ``paddle_mla.attention.dsa.reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.attention.dsa.topk_select import (TopkConfig, append_candidates, candidate_capacity, check_scratch,
                                                  publish_sample, row_threshold, row_window, select_candidates,
                                                  sortable_key, topk_scratch_shape)
from paddle_mla.attention.triton_mla._util import interpreting, next_pow2, num_sms


@triton.jit
def _row_queries(q_row, w_row, stride_qh, H, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The first ``BLOCK_H`` heads' queries and weights of a row (all of them where they fit one block)."""
    d = tl.arange(0, BLOCK_D)
    hh = tl.arange(0, BLOCK_H)
    q_blk = tl.load(q_row + hh[:, None] * stride_qh + d[None, :], mask=(hh[:, None] < H) & (d[None, :] < D), other=0.0)
    return q_blk, tl.load(w_row + hh, mask=hh < H, other=0.0).to(tl.float32)


@triton.jit
def _score_keys(q_row, w_row, q_all, w_all, cache, tables, bc, n, valid, stride_qh, stride_cb, stride_cs, stride_tb,
                H, D, PAGE: tl.constexpr, ONE_HEAD_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Scores of request positions ``n`` (masked by ``valid``) of request ``bc``, read through the block table."""
    d = tl.arange(0, BLOCK_D)
    page = tl.load(tables + bc * stride_tb + n // PAGE, mask=valid, other=0).to(tl.int64)
    krow = cache + page * stride_cb + (n % PAGE).to(tl.int64) * stride_cs
    keys = tl.load(krow[:, None] + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0.0)
    if ONE_HEAD_BLOCK:   # q_all / w_all: every head, loaded once per program
        dots = tl.dot(q_all, tl.trans(keys).to(q_all.dtype), out_dtype=tl.float32)    # [BLOCK_H, BLOCK_N]
        total = tl.sum(tl.maximum(dots, 0.0) * w_all[:, None], axis=0)
    else:
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            qh, wh = _row_queries(q_row + h0 * stride_qh, w_row + h0, stride_qh, H - h0, D, BLOCK_H, BLOCK_D)
            dots = tl.dot(qh, tl.trans(keys).to(qh.dtype), out_dtype=tl.float32)
            total += tl.sum(tl.maximum(dots, 0.0) * wh[:, None], axis=0)
    return total


@triton.jit
def _index_score_kernel(
    q, w, cache, tables, batch_ids, positions, ks, ke, cu_k, out, scratch,
    stride_qt, stride_qh, stride_wt, stride_cb, stride_cs, stride_tb, stride_ot, stride_xt, H, D, K,
    PAGE: tl.constexpr, USE_WINDOW: tl.constexpr, ONE_HEAD_BLOCK: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, APPEND: tl.constexpr, CAP: tl.constexpr,
):
    # grid (T, P): program p of row t takes the key blocks p, p + P, ... of the row's window, so the
    # grid does not depend on the context length (graph-safe) and q is loaded once per program.
    # APPEND (the top-k): the keys at or above the row's sampled threshold also go to its candidate
    # buffer as they are scored, so no pass re-reads the scores
    t = tl.program_id(0)
    P = tl.num_programs(1)
    b, lo, hi = row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW)
    bc = tl.maximum(b, 0).to(tl.int64)
    q_row = q + t.to(tl.int64) * stride_qt
    w_row = w + t.to(tl.int64) * stride_wt
    q_all, w_all = _row_queries(q_row, w_row, stride_qh, H, D, BLOCK_H, BLOCK_D)
    buf = scratch + t.to(tl.int64) * stride_xt
    hi_take = tl.where(hi - lo > K, hi, lo)     # windows of at most K keys are selected whole
    if APPEND:
        thr = row_threshold(buf, hi - lo, CAP)
    else:
        thr = tl.zeros((), tl.int32)
    for blk in range(lo // BLOCK_N + tl.program_id(1), tl.cdiv(hi, BLOCK_N), P):
        n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (n >= lo) & (n < hi)
        total = _score_keys(q_row, w_row, q_all, w_all, cache, tables, bc, n, valid, stride_qh, stride_cb, stride_cs,
                            stride_tb, H, D, PAGE, ONE_HEAD_BLOCK, BLOCK_H, BLOCK_D, BLOCK_N)
        tl.store(out + t.to(tl.int64) * stride_ot + n, total, mask=valid)
        if APPEND:
            key = sortable_key(total)
            append_candidates(buf, key, n, (n >= lo) & (n < hi_take) & (key >= thr), CAP)


@triton.jit
def _sample_kernel(
    q, w, cache, tables, batch_ids, positions, ks, ke, cu_k, scratch,
    stride_qt, stride_qh, stride_wt, stride_cb, stride_cs, stride_tb, stride_xt, H, D, K, MARGIN,
    PAGE: tl.constexpr, USE_WINDOW: tl.constexpr, ONE_HEAD_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
    THRESHOLD_DIGITS: tl.constexpr,
):
    # grid (T, SAMPLE / BLOCK_S): each program scores BLOCK_S of the row's SAMPLE evenly spaced keys;
    # the row's last program to finish sets its threshold (topk_select.publish_sample). Only rows whose
    # window overflows the candidate buffer need one
    t = tl.program_id(0)
    b, lo, hi = row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW)
    n = hi - lo
    if n > CAP:
        q_row = q + t.to(tl.int64) * stride_qt
        w_row = w + t.to(tl.int64) * stride_wt
        q_all, w_all = _row_queries(q_row, w_row, stride_qh, H, D, BLOCK_H, BLOCK_D)
        i = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        col = lo + (i.to(tl.int64) * n // SAMPLE).to(tl.int32)
        total = _score_keys(q_row, w_row, q_all, w_all, cache, tables, tl.maximum(b, 0).to(tl.int64), col, col < hi,
                            stride_qh, stride_cb, stride_cs, stride_tb, H, D, PAGE, ONE_HEAD_BLOCK, BLOCK_H, BLOCK_D,
                            BLOCK_S)
        publish_sample(scratch + t.to(tl.int64) * stride_xt, sortable_key(total), i, n, K, MARGIN, CAP, SAMPLE,
                       THRESHOLD_DIGITS)


def score_programs_per_row(rows: int, width: int, block_n: int, per_sm: int = 16) -> int:
    """Programs per row: about ``per_sm`` per SM over the whole grid, never more than the row has blocks."""
    target = per_sm * num_sms()
    return max(1, min(triton.cdiv(width, block_n), triton.cdiv(target, max(rows, 1))))


@dataclass(frozen=True)
class ScoreConfig:
    """Knobs of the score kernel (tools/bench_dsa.py --sweep). 64 keys x 8 warps, 16 programs per SM:
    82% of copy bandwidth at [64, 32k] on an H100 (the 128-key tile at 8 per SM: 72%)."""
    block_n: int = 0           # 0: 64 (16 under the interpreter)
    num_warps: int = 8
    per_sm: int = 16
    num_stages: int = 3


def _launch_args(q, index_cache, positions, ks, ke, cu_seqlens_k, name: str):
    """The window arguments and the shape constants shared by the score and sample kernels."""
    H, D = q.shape[1], q.shape[2]
    use_window = ks is not None
    if use_window and (ke is None or cu_seqlens_k is None):
        raise ValueError(f"{name}: ks needs ke and cu_seqlens_k")
    assert q.stride(2) == 1 and index_cache.stride(3) == 1
    block_h = min(max(16, next_pow2(H)), 64)
    win = (ks, ke, cu_seqlens_k) if use_window else (positions,) * 3
    shapes = dict(PAGE=index_cache.shape[1], USE_WINDOW=use_window, ONE_HEAD_BLOCK=block_h >= H, BLOCK_H=block_h,
                  BLOCK_D=max(16, next_pow2(D)))
    return win, shapes, use_window


def _scores(q, w, index_cache, block_tables, batch_ids, positions, width, out, win, shapes, cfg: ScoreConfig,
            scratch=None, topk: int = 0):
    """One launch of the score kernel; with ``scratch``, it also buffers the top-k candidates."""
    block_n = cfg.block_n or (16 if interpreting() else 64)
    assert out.stride(1) == 1
    append = scratch is not None
    _index_score_kernel[(q.shape[0], score_programs_per_row(q.shape[0], width, block_n, cfg.per_sm))](
        q, w, index_cache, block_tables, batch_ids, positions, *win, out, scratch if append else batch_ids,
        q.stride(0), q.stride(1), w.stride(0), index_cache.stride(0), index_cache.stride(1), block_tables.stride(0),
        out.stride(0), scratch.stride(0) if append else 0, q.shape[1], q.shape[2], topk, **shapes, BLOCK_N=block_n,
        APPEND=append, CAP=candidate_capacity(max(topk, 1)), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def index_scores(q, w, index_cache, block_tables, batch_ids, positions, width: int, out,
                 ks=None, ke=None, cu_seqlens_k=None, cfg: ScoreConfig = ScoreConfig()):
    """q [T, H, D], w [T, H] float32, index_cache [NB, bs, 1, D] -> out[:T, :width] float32 scores.

    ``ks``/``ke`` given (prefill steps): windows in gathered-key coordinates (with ``cu_seqlens_k``);
    else causal by ``positions``. Only each row's window is written: the rest of ``out`` (a
    caller-owned workspace of at least [T, width]) is left as it was. ``width`` only bounds the
    windows; the work follows each row's own window.
    """
    T = q.shape[0]
    if T == 0 or width == 0:
        return out[:T, :width]
    win, shapes, _ = _launch_args(q, index_cache, positions, ks, ke, cu_seqlens_k, "index_scores")
    _scores(q, w, index_cache, block_tables, batch_ids, positions, width, out, win, shapes, cfg)
    return out[:T, :width]


def index_topk(q, w, index_cache, block_tables, batch_ids, positions, width: int, scores, topk: int, out,
               ks=None, ke=None, cu_seqlens_k=None, scratch=None, fallbacks=None,
               cfg: ScoreConfig = ScoreConfig(), topk_cfg: TopkConfig = TopkConfig()):
    """The ``topk`` columns with the largest scores in each row's window -> out[:T] int64 (unsorted,
    -1 padded where the window holds fewer keys); ``scores`` [T, >= width] (as ``index_scores``)
    holds the windows' scores afterwards. Exact (topk_select): three launches, none of which
    depends on the context length, so decode steps are graph-safe:
    1. ``_sample_kernel``: each long row's threshold from its evenly spaced sample keys;
    2. ``_index_score_kernel`` with APPEND: the scores, and the keys at or above the threshold into
       the row's candidate buffer;
    3. ``topk_select.select_candidates``: the k-th key of the buffer, then the columns (a row whose
       sample kept too few or too many keys takes the radix select over its whole window instead).
    ``scratch``: a zeroed int32 workspace of ``topk_scratch_shape`` (allocated here if not given);
    ``fallbacks`` (int32 [1], optional) counts the rows whose sample missed (tests, benchmarks).
    """
    T = q.shape[0]
    res = out[:T]
    if T == 0:
        return res
    win, shapes, use_window = _launch_args(q, index_cache, positions, ks, ke, cu_seqlens_k, "index_topk")
    if scratch is None:
        scratch = batch_ids.new_zeros(topk_scratch_shape(T, topk))
    if fallbacks is None:
        fallbacks = batch_ids.new_zeros(1)
    check_scratch(scratch, T, topk, topk_cfg)
    cap = candidate_capacity(topk)
    if width > cap:      # else no window overflows the buffer: no threshold needed
        _sample_kernel[(T, topk_cfg.sample // topk_cfg.sample_block)](
            q, w, index_cache, block_tables, batch_ids, positions, *win, scratch,
            q.stride(0), q.stride(1), w.stride(0), index_cache.stride(0), index_cache.stride(1),
            block_tables.stride(0), scratch.stride(0), q.shape[1], q.shape[2], topk, topk_cfg.margin, **shapes,
            BLOCK_S=topk_cfg.sample_block, CAP=cap, SAMPLE=topk_cfg.sample,
            THRESHOLD_DIGITS=topk_cfg.threshold_digits, num_warps=topk_cfg.sample_warps,
        )
    if width > 0:
        _scores(q, w, index_cache, block_tables, batch_ids, positions, width, scores, win, shapes, cfg, scratch, topk)
    return select_candidates(scores, topk, res, scratch, fallbacks, batch_ids, positions, win, use_window, topk_cfg)


@triton.jit
def _pos_to_slot_kernel(pos, batch_ids, tables, out, stride_pt, stride_tb, stride_ot, K,
                        PAGE: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m = k < K
    p = tl.load(pos + t.to(tl.int64) * stride_pt + k, mask=m, other=-1)
    b = tl.load(batch_ids + t)
    ok = m & (p >= 0) & (tl.zeros_like(k) + b >= 0)     # b as a vector: the interpreter rejects a scalar in a mask
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
