"""Exact top-k of the indexer scores per row, in Triton: a sampled threshold, then a radix select.

Why not the framework's ``topk``: it sorts the whole row (125 µs for [64, 32k] on an H100, a third of
the indexer), it must be given one width for every row, so a CUDA-graphed decode step would sort
``max_model_len`` columns, and its output is sorted, which sparse attention does not need.

Row t's candidates are the columns of its key window (``row_window``: ``[ks, ke)`` in prefill
steps, ``[0, position + 1)`` in decode), so columns outside it are never read (a decode score
row is only written up to its position). Where the window holds no more than ``topk`` keys the
row is all of them, in order, then ``-1``. Otherwise, on each score's float bits made
order-preserving as a signed int32 (``sortable_key``), in three launches
(``index_kernels.index_topk``):
1. the sample kernel, grid (rows, SAMPLE / 64): scores an evenly spaced sample of the window; the
   row's last program to finish (``publish_sample``) takes the key at rank ~ topk/n x SAMPLE plus a
   3-sigma margin (a radix select in registers) as the row's threshold, so about topk to 1.5 x topk
   keys pass; no threshold when the window fits the buffer (``row_threshold``);
2. the score kernel appends the keys at or above the threshold, with their columns, to the row's
   buffer of ``CAP`` = 2 x topk as it writes the scores, reserving room with one atomic per tile
   (``append_candidates``; the order does not matter: step 3 is order-free);
3. ``_select_kernel``, grid (rows,): if topk <= passed <= CAP, the k-th largest buffered key by a
   radix select in registers (4 passes of 8-bit histograms), then the columns above it and the
   first ones equal to it: exact, since every key at or above the threshold is buffered. Else (the
   sample missed: rare) the same radix select over the whole window of written scores, chunk by chunk.
Measured on an H100 ([64, 32k], top-2048; BENCHMARKS.md section 5): the radix select alone over
the window took 183 µs (the histograms are compute-bound: 40 chunk passes in one program per row);
a sampled threshold with ``tl.sort`` of the buffer took 118-132 µs (the sorts dominate); a separate
candidate pass over the written scores plus the select, 50 µs. Graph-safe: the grids depend only
on the row count and width, and every call leaves the workspace's counts at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import interpreting


@triton.jit
def row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW: tl.constexpr):
    """Columns ``[lo, hi)`` (request positions) that token ``t`` may attend; empty for padded rows."""
    b = tl.load(batch_ids + t)
    if USE_WINDOW:
        base = tl.load(cu_k + tl.maximum(b, 0))
        lo = tl.load(ks + t) - base
        hi = tl.load(ke + t) - base
    else:
        lo = tl.zeros((), tl.int32)
        hi = tl.load(positions + t).to(tl.int32) + 1
    hi = tl.where(b >= 0, hi, lo)
    return b, lo, hi


@triton.jit
def sortable_key(x):
    """fp32 -> int32 with the same order (for finite values and +-inf)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _pass_hist(key, cand, prefix, p: tl.constexpr):
    """Histogram of digit ``p`` (8 bits, most significant first) of the candidates matching ``prefix``."""
    shift: tl.constexpr = 24 - 8 * p
    digit = (key >> shift) & 0xFF
    if p == 0:
        digit = digit ^ 0x80        # the sign bit: negative keys come first
    else:
        cand = cand & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
    return tl.histogram(digit, 256, mask=cand)


@triton.jit
def _pass_pick(hist, need, prefix, p: tl.constexpr):
    """The digit ``p`` of the ``need``-th largest candidate; ``need`` less the candidates above it."""
    bins = tl.arange(0, 256)
    at_or_above = tl.cumsum(hist, 0, reverse=True)
    d = tl.sum((at_or_above >= need).to(tl.int32), 0) - 1
    need -= tl.sum(tl.where(bins == d, at_or_above - hist, 0), 0)
    if p == 0:
        d = d ^ 0x80
    return prefix | (d << (24 - 8 * p)), need


@triton.jit
def _kth_key_in_registers(key, valid, K, PASSES: tl.constexpr = 4):
    """The K-th largest of ``key[valid]`` and how many keys equal to it belong to the top K. With
    ``PASSES`` < 4 the low digits stay 0: a lower bound of it, at most 2**(32 - 8 PASSES) keys below."""
    need = K
    prefix = tl.zeros((), tl.int32)
    for p in tl.static_range(PASSES):
        prefix, need = _pass_pick(_pass_hist(key, valid, prefix, p), need, prefix, p)
    return prefix, need


@triton.jit
def _kth_key_in_row(row, lo, hi, K, BLOCK: tl.constexpr):
    """As ``_kth_key_in_registers`` over the scores ``row[lo:hi]``, chunk by chunk."""
    need = K
    prefix = tl.zeros((), tl.int32)
    for p in tl.static_range(4):
        hist = tl.zeros([256], tl.int32)
        for c0 in range(lo, hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            key = sortable_key(tl.load(row + c, mask=c < hi, other=float("-inf")))
            hist += _pass_hist(key, c < hi, prefix, p)
        prefix, need = _pass_pick(hist, need, prefix, p)
    return prefix, need


# per row of the int32 workspace: [CAP keys | CAP columns | header | SAMPLE_MAX sample keys]; the header
# holds the candidate count, the sample programs' arrival count and the row's threshold
HEADER = tl.constexpr(16)  # a multiple of 16 ints, so the sample keys stay 64-byte aligned
COUNT, ARRIVALS, THRESHOLD = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
SAMPLE_MAX = 1024


@triton.jit
def _sample_threshold(sample, n, K, MARGIN, SAMPLE: tl.constexpr, THRESHOLD_DIGITS: tl.constexpr):
    """The threshold of a window of ``n`` keys from ``SAMPLE`` evenly spaced ones: the key at rank
    ~ topk/n x SAMPLE plus a 3-sigma margin, so about topk to 1.5 x topk keys pass."""
    want = K * SAMPLE // n
    rank = want + (MARGIN * tl.sqrt(want.to(tl.float32) + 1.0)).to(tl.int32) + 4
    # 3 digits: a threshold within 2**-16 of the sampled key is as good, for one pass less
    thr, _ = _kth_key_in_registers(sample, tl.arange(0, SAMPLE) < SAMPLE,
                                   tl.minimum(tl.maximum(rank, 1), SAMPLE), THRESHOLD_DIGITS)
    return thr


@triton.jit
def publish_sample(buf, key, i, n, K, MARGIN, CAP: tl.constexpr, SAMPLE: tl.constexpr,
                   THRESHOLD_DIGITS: tl.constexpr):
    """Store this program's sample keys ``key`` (sample indices ``i``) in the row's workspace ``buf``;
    the last of the row's programs to arrive turns the whole sample into the row's threshold and
    resets the arrival count (for the next call and graph replays)."""
    head = buf + 2 * CAP
    tl.store(head + HEADER + i, key)
    tl.debug_barrier()      # every thread's sample stores precede the release below
    if tl.atomic_add(head + ARRIVALS, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        sample = tl.load(head + HEADER + tl.arange(0, SAMPLE), cache_modifier=".cg")
        tl.store(head + THRESHOLD, _sample_threshold(sample, n, K, MARGIN, SAMPLE, THRESHOLD_DIGITS))
        tl.store(head + ARRIVALS, 0)


@triton.jit
def row_threshold(buf, n, CAP: tl.constexpr):
    """The key a candidate must reach: the sampled threshold where the window exceeds the buffer,
    else none (every key of the window fits)."""
    thr = tl.load(buf + 2 * CAP + THRESHOLD)
    return tl.where(n > CAP, thr, -2147483648)


@triton.jit
def append_candidates(buf, key, col, take, CAP: tl.constexpr):
    """Append the ``take`` keys and their columns to the row's buffer, reserving room with one atomic
    (the order does not matter: the select is order-free). Past CAP only the count grows, which
    sends the row to the select's fallback. Relaxed: only a later launch reads the buffer, and an
    acq_rel atomic would first wait for this program's score stores."""
    cnt = tl.sum(take.to(tl.int32), 0)
    base = tl.atomic_add(buf + 2 * CAP + COUNT, cnt, sem="relaxed")
    idx = base + tl.cumsum(take.to(tl.int32), 0) - 1
    ok = take & (idx < CAP)
    tl.store(buf + idx, key, mask=ok)
    tl.store(buf + CAP + idx, col, mask=ok)


@triton.jit
def _select_kernel(
    scores, out, scratch, fallbacks, batch_ids, positions, ks, ke, cu_k, stride_st, stride_ot, stride_xt, K,
    USE_WINDOW: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr,
):
    t = tl.program_id(0)
    _, lo, hi = row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW)
    n = tl.maximum(hi - lo, 0)
    row = scores + t.to(tl.int64) * stride_st
    dst = out + t.to(tl.int64) * stride_ot
    buf = scratch + t.to(tl.int64) * stride_xt
    if n <= K:   # every key of the window, then -1
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            tl.store(dst + k, tl.where(k < n, lo + k, -1).to(tl.int64), mask=k < K)
    else:
        m = tl.load(buf + 2 * CAP + COUNT)
        if (m >= K) & (m <= CAP):
            j = tl.arange(0, CAP)
            valid = j < m
            key = tl.load(buf + j, mask=valid, other=0)
            col = tl.load(buf + CAP + j, mask=valid, other=0)
            thr, need = _kth_key_in_registers(key, valid, K)
            above = valid & (key > thr)
            equal = valid & (key == thr)
            ie = tl.cumsum(equal.to(tl.int32), 0) - 1
            tl.store(dst + tl.cumsum(above.to(tl.int32), 0) - 1, col.to(tl.int64), mask=above)
            tl.store(dst + (K - need) + ie, col.to(tl.int64), mask=equal & (ie < need))
        else:   # the sample kept too few or too many keys: the same select over the whole window
            tl.atomic_add(fallbacks, 1)
            thr, need = _kth_key_in_row(row, lo, hi, K, BLOCK)
            taken_above = tl.zeros((), tl.int32)
            taken_equal = tl.zeros((), tl.int32)
            for c0 in range(lo, hi, BLOCK):
                c = c0 + tl.arange(0, BLOCK)
                key = sortable_key(tl.load(row + c, mask=c < hi, other=float("-inf")))
                above = (c < hi) & (key > thr)
                equal = (c < hi) & (key == thr)
                ia = tl.cumsum(above.to(tl.int32), 0) - 1 + taken_above
                ie = tl.cumsum(equal.to(tl.int32), 0) - 1 + taken_equal
                tl.store(dst + ia, c.to(tl.int64), mask=above)
                tl.store(dst + (K - need) + ie, c.to(tl.int64), mask=equal & (ie < need))
                taken_above += tl.sum(above.to(tl.int32), 0)
                taken_equal += tl.sum(equal.to(tl.int32), 0)
    tl.store(buf + 2 * CAP + COUNT, 0)    # the count, ready for the next call (and graph replay)


def candidate_capacity(topk: int) -> int:
    """Candidates buffered per row: twice ``topk``, a power of two."""
    return max(16, triton.next_power_of_2(2 * topk))


def topk_scratch_shape(rows: int, topk: int) -> tuple[int, int]:
    """int32 workspace of the top-k: per row CAP keys, CAP columns, a header (counts, threshold) and the
    sample keys. Zero it once at allocation: every call leaves the counts at zero."""
    return rows, 2 * candidate_capacity(topk) + HEADER.value + SAMPLE_MAX


@dataclass(frozen=True)
class TopkConfig:
    """Knobs of the top-k (tools/bench_dsa.py --sweep). ``sample`` keys per row set the threshold,
    scored ``sample_block`` at a time by as many programs; ``margin`` sigmas above the expected rank
    (tests force the fallback with +-1000)."""
    sample: int = 1024
    sample_block: int = 64
    margin: int = 3
    threshold_digits: int = 3
    sample_warps: int = 4
    select_warps: int = 16


def check_scratch(scratch, rows: int, topk: int, cfg: TopkConfig) -> None:
    shape = topk_scratch_shape(rows, topk)
    assert scratch.shape[0] >= rows and scratch.shape[1] >= shape[1] and scratch.stride(1) == 1, \
        f"top-k workspace {tuple(scratch.shape)} smaller than {shape}"
    assert cfg.sample <= SAMPLE_MAX and cfg.sample % cfg.sample_block == 0


def select_candidates(scores, topk: int, out, scratch, fallbacks, batch_ids, positions, win: tuple,
                      use_window: bool, cfg: TopkConfig):
    """The select pass over the candidates the score kernel buffered -> out[:T] int64 (-1 padded)."""
    T = scores.shape[0]
    interp = interpreting()
    _select_kernel[(T,)](
        scores, out, scratch, fallbacks, batch_ids, positions, *win, scores.stride(0), out.stride(0),
        scratch.stride(0), topk, USE_WINDOW=use_window, BLOCK=128 if interp else 4096,
        BLOCK_K=min(1024, triton.next_power_of_2(topk)), CAP=candidate_capacity(topk), num_warps=cfg.select_warps,
    )
    return out
