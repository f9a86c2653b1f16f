"""Exact top-k of the indexer scores per row, in Triton: a sampled threshold, then a radix select.

Why not the framework's ``topk``: it sorts the whole row (125 µs for [64, 32k] on an H100, a third of
the indexer), it must be given one width for every row, so a CUDA-graphed decode step would sort
``max_model_len`` columns, and its output is sorted, which sparse attention does not need.

Row t's candidates are the columns of its key window (``row_window``: ``[ks, ke)`` in prefill
steps, ``[0, position + 1)`` in decode), so columns outside it are never read (a decode score
row is only written up to its position). Where the window holds no more than ``topk`` keys the
row is all of them, in order, then ``-1``. Otherwise, on each score's float bits made
order-preserving as a signed int32 (``key``):
1. ``_candidates_kernel``, grid (rows, segments): a threshold, the key at rank ~ topk/n x SAMPLE
   (plus a 3-sigma margin) of an evenly spaced sample of the window (found by a radix select in
   registers; every segment program finds the same one), so about topk to 1.5 x topk keys pass; no
   threshold when the window fits the buffer. Each program appends its segment's passing keys and
   columns to the row's buffer of ``CAP`` = 2 x topk, reserving room with one atomic per chunk
   (the set does not depend on the order: step 2 picks tied keys by column, not by buffer slot).
2. ``_select_kernel``, grid (rows,): if topk <= passed <= CAP, the k-th largest buffered key by a
   radix select in registers (4 passes of 8-bit histograms; with ``short_select`` the 4th only where
   the k-th key's 24-bit bucket is neither taken whole nor decided by one max or min, and both ranks
   from one scan), then the columns above it and, of those equal to it, the earliest (the tie rule:
   ``_earliest_ties``): exact, since every key at or above the threshold is buffered. Else (the
   sample missed: rare) the same radix select over the whole window, chunk by chunk.
Ties at the k-th score go to the earlier columns on every path (docs/dsa.md), as in ``topk_ref``.
Measured on an H100 ([64, 32k], top-2048): the radix select alone over the window took 183 µs (the
histograms are compute-bound: 40 chunk passes in one program per row); a sampled threshold with
``tl.sort`` of the buffer took 118-132 µs (the sorts dominate); these two parallel passes, 75 µs
(with 512-bin histograms and a 4-digit sample threshold). Graph-safe: the grids depend only on the row count and width.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import triton
import triton.language as tl

from paddle_mla.platform.triton_host import interpreting, num_sms


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
def _sortable(x):
    """fp32 -> int32 with the same order (for finite values and +-inf). -0.0 becomes +0.0's key: the
    scores compare as floats (-0.0 == 0.0, as in the reference), so the two zeros must tie and fall
    to the earlier position, not order by sign bit."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)
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
    """The digit ``p`` of the ``need``-th largest candidate; ``need`` less the candidates above it;
    the candidates in its bucket (those sharing its digits 0..p)."""
    bins = tl.arange(0, 256)
    at_or_above = tl.cumsum(hist, 0, reverse=True)
    d = tl.sum((at_or_above >= need).to(tl.int32), 0) - 1
    need -= tl.sum(tl.where(bins == d, at_or_above - hist, 0), 0)
    bucket = tl.sum(tl.where(bins == d, hist, 0), 0)    # dead code (removed) where unused
    if p == 0:
        d = d ^ 0x80
    return prefix | (d << (24 - 8 * p)), need, bucket


@triton.jit
def _kth_key_in_registers(key, valid, K, PASSES: tl.constexpr = 4):
    """The K-th largest of ``key[valid]`` and how many keys equal to it belong to the top K. With
    ``PASSES`` < 4 the low digits stay 0: a lower bound of it, at most 2**(32 - 8 PASSES) keys below."""
    need = K
    prefix = tl.zeros((), tl.int32)
    for p in tl.static_range(PASSES):
        prefix, need, _ = _pass_pick(_pass_hist(key, valid, prefix, p), need, prefix, p)
    return prefix, need


@triton.jit
def _kth_key_short(key, valid, K):
    """As ``_kth_key_in_registers`` (returning a threshold ``thr`` and ``need`` with the same meaning:
    the top K are the keys above ``thr`` and ``need`` of those equal to it), but the 4th digit's
    histogram only where nothing cheaper is exact. After 3 digits the k-th key's bucket (keys sharing
    its top 24 bits) holds ``bucket`` keys of which the top K takes the ``need`` largest; at the
    indexer's scale it is nearly always 1 or 2 keys, and since the kernel's time is that of its
    slowest row, every common case must skip the pass:
    - ``need == bucket``: the bucket is taken whole; every key >= its prefix (thr = prefix - 1,
      need 0; a prefix of INT_MIN, only a negative NaN, takes the histogram instead);
    - ``need == 1``: only its largest key: thr = that key (one max), need 1;
    - ``need == bucket - 1``: all but its smallest: thr = that key (one min), need = its copies - 1;
    - else the 4th histogram. Also returns which of these ran (0, 1, 2, 3: histogram)."""
    need = K
    prefix = tl.zeros((), tl.int32)
    bucket = K
    for p in tl.static_range(3):
        prefix, need, bucket = _pass_pick(_pass_hist(key, valid, prefix, p), need, prefix, p)
    inb = valid & ((key >> 8) == (prefix >> 8))
    thr = prefix
    path = tl.full((), 3, tl.int32)     # int32 tensors in every branch: older Triton front ends insist
    if (need == bucket) & (prefix != -2147483648):
        thr = prefix - 1
        need = tl.zeros((), tl.int32)
        path = tl.full((), 0, tl.int32)
    elif need == 1:
        thr = tl.max(tl.where(inb, key, -2147483648), 0)
        path = tl.full((), 1, tl.int32)
    elif need == bucket - 1:
        thr = tl.min(tl.where(inb, key, 2147483647), 0)
        need -= tl.sum((inb & (key > thr)).to(tl.int32), 0)
        path = tl.full((), 2, tl.int32)
    else:
        thr, need, _ = _pass_pick(_pass_hist(key, valid, prefix, 3), need, prefix, 3)
    return thr, need, path


@triton.jit
def _kth_key_in_row(row, lo, hi, K, BLOCK: tl.constexpr):
    """As ``_kth_key_in_registers`` over the scores ``row[lo:hi]``, chunk by chunk."""
    need = K
    prefix = tl.zeros((), tl.int32)
    for p in tl.static_range(4):
        hist = tl.zeros([256], tl.int32)
        for c0 in range(lo, hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            key = _sortable(tl.load(row + c, mask=c < hi, other=float("-inf")))
            hist += _pass_hist(key, c < hi, prefix, p)
        prefix, need, _ = _pass_pick(hist, need, prefix, p)
    return prefix, need


@triton.jit
def _earliest_ties(equal, col, need):
    """The ``need`` keys of ``equal`` (tied at the k-th score) with the smallest columns: the tie rule.
    Buffered candidates sit in append order, not column order, so where more keys tie than the top-k
    takes, a radix select over the columns (``~col``: the largest is the earliest column; columns are
    distinct, so exactly ``need`` pass) picks the earliest. Rows without such a tie skip it."""
    tied = tl.sum(equal.to(tl.int32), 0)
    take = equal & (need > 0)
    if (need > 0) & (tied > need):
        first, _ = _kth_key_in_registers(~col, equal, need)
        take = equal & (~col >= first)
    return take


@triton.jit
def _candidates_kernel(
    scores, scratch, batch_ids, positions, ks, ke, cu_k, stride_st, stride_xt, K, MARGIN,
    USE_WINDOW: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr,
    THRESHOLD_DIGITS: tl.constexpr, SEM: tl.constexpr,
):
    t = tl.program_id(0)
    S = tl.num_programs(1)
    _, lo, hi = row_window(t, batch_ids, positions, ks, ke, cu_k, USE_WINDOW)
    n = hi - lo
    if n > K:
        row = scores + t.to(tl.int64) * stride_st
        thr = tl.full((), -2147483648, tl.int32)
        if n > CAP:
            i = tl.arange(0, SAMPLE)
            sample = _sortable(tl.load(row + lo + (i.to(tl.int64) * n // SAMPLE).to(tl.int32)))
            want = K * SAMPLE // n
            rank = want + (MARGIN * tl.sqrt(want.to(tl.float32) + 1.0)).to(tl.int32) + 4
            # 3 digits: a threshold within 2**-16 of the sampled key is as good, for one pass less
            thr, _ = _kth_key_in_registers(sample, i < SAMPLE, tl.minimum(tl.maximum(rank, 1), SAMPLE),
                                           THRESHOLD_DIGITS)
        keys = scratch + t.to(tl.int64) * stride_xt           # [CAP keys | CAP columns | count]
        seg = tl.cdiv(tl.cdiv(n, S), BLOCK) * BLOCK
        start = lo + tl.program_id(1) * seg
        for c0 in range(start, tl.minimum(start + seg, hi), BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            key = _sortable(tl.load(row + c, mask=c < hi, other=float("-inf")))
            take = (c < hi) & (key >= thr)
            cnt = tl.sum(take.to(tl.int32), 0)
            # relaxed is enough: in this launch the count is read only through this atomic's
            # return value and the buffer not at all; the select reads both in a later launch
            base = tl.atomic_add(keys + 2 * CAP, cnt, sem=SEM)
            idx = base + tl.cumsum(take.to(tl.int32), 0) - 1
            ok = take & (idx < CAP)
            tl.store(keys + idx, key, mask=ok)
            tl.store(keys + CAP + idx, c, mask=ok)


@triton.jit
def _select_kernel(
    scores, out, scratch, fallbacks, paths, batch_ids, positions, ks, ke, cu_k, stride_st, stride_ot, stride_xt, K,
    USE_WINDOW: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr,
    SHORT: tl.constexpr, STATS: tl.constexpr,
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
        m = tl.load(buf + 2 * CAP)
        if (m >= K) & (m <= CAP):
            j = tl.arange(0, CAP)
            valid = j < m
            key = tl.load(buf + j, mask=valid, other=0)
            col = tl.load(buf + CAP + j, mask=valid, other=0)
            if SHORT:
                thr, need, path = _kth_key_short(key, valid, K)
            else:
                thr, need = _kth_key_in_registers(key, valid, K)
                path = 3
            if STATS:
                tl.atomic_add(paths + path, 1)
            above = valid & (key > thr)
            tie = _earliest_ties(valid & (key == thr), col, need)     # exactly ``need`` keys
            if SHORT:   # both ranks from one scan (each count <= CAP < 2**15: no overflow), one store
                both = tl.cumsum(above.to(tl.int32) + (tie.to(tl.int32) << 16), 0)
                at = tl.where(above, (both & 0xFFFF) - 1, (K - need) + (both >> 16) - 1)
                tl.store(dst + at, col.to(tl.int64), mask=above | tie)
            else:
                ie = tl.cumsum(tie.to(tl.int32), 0) - 1
                tl.store(dst + tl.cumsum(above.to(tl.int32), 0) - 1, col.to(tl.int64), mask=above)
                tl.store(dst + (K - need) + ie, col.to(tl.int64), mask=tie)
        else:   # the sample kept too few or too many keys: the same select over the whole window,
            # in column order, so the tied keys taken are the first ``need`` (the earliest)
            tl.atomic_add(fallbacks, 1)
            thr, need = _kth_key_in_row(row, lo, hi, K, BLOCK)
            taken_above = tl.zeros((), tl.int32)
            taken_equal = tl.zeros((), tl.int32)
            for c0 in range(lo, hi, BLOCK):
                c = c0 + tl.arange(0, BLOCK)
                key = _sortable(tl.load(row + c, mask=c < hi, other=float("-inf")))
                above = (c < hi) & (key > thr)
                equal = (c < hi) & (key == thr)
                ia = tl.cumsum(above.to(tl.int32), 0) - 1 + taken_above
                ie = tl.cumsum(equal.to(tl.int32), 0) - 1 + taken_equal
                tl.store(dst + ia, c.to(tl.int64), mask=above)
                tl.store(dst + (K - need) + ie, c.to(tl.int64), mask=equal & (ie < need))
                taken_above += tl.sum(above.to(tl.int32), 0)
                taken_equal += tl.sum(equal.to(tl.int32), 0)
        tl.store(buf + 2 * CAP, 0)    # the count, ready for the next call (and graph replay)


def candidate_capacity(topk: int) -> int:
    """Candidates buffered per row: twice ``topk``, a power of two."""
    return max(16, triton.next_power_of_2(2 * topk))


def topk_scratch_shape(rows: int, topk: int) -> tuple[int, int]:
    """int32 workspace of ``topk_select``: per row CAP keys, CAP columns and the count. Zero it once
    at allocation: every call leaves the counts at zero."""
    return rows, 2 * candidate_capacity(topk) + 1


def topk_select(scores, topk: int, out, batch_ids, positions, ks=None, ke=None, cu_seqlens_k=None,
                scratch=None, fallbacks=None, block: int = 0, margin: int = 3, sample: int = 1024,
                segments: int = 0, candidate_warps: int = 4, select_warps: int = 16, threshold_digits: int = 2,
                append_sem: str = "relaxed", short_select: bool | None = None, path_counts=None):
    """Top-``topk`` columns of each row's window of ``scores`` [T, >= width] float32 -> out[:T] int64.

    Windows as in ``index_kernels.index_scores`` (``ks``/``ke``/``cu_seqlens_k`` in prefill steps,
    ``positions`` in decode). Unsorted; -1 padded where the window holds fewer than ``topk`` keys.
    ``scratch``: a zeroed int32 workspace of ``topk_scratch_shape`` (allocated here if not given).
    ``fallbacks`` (int32 [1], optional) counts the rows whose sample missed (tests, benchmarks).
    ``segments``: programs per row of the candidate pass (default: about 4 per SM in all; 1 appends in
    column order, so the output's order, not only its set, follows from the row alone); the other
    keywords are tuning knobs (benchmarks.kernels.dsa --sweep). ``append_sem``: the memory order of the
    candidate pass's append atomic ("relaxed" is enough: see the kernel). ``short_select``: the select
    skips its 4th radix pass where a cheaper step is exact (``_kth_key_short``); None: on wherever it
    can be (topk <= 8192). Defaults: the fastest exact variant of ``benchmarks.kernels.dsa --indexer-ab``
    (H100, BENCHMARKS.md, "DSA": relaxed append, short select, 2-digit sample threshold). Every variant
    selects the same set, ties to the earliest columns, on every run. ``path_counts`` (int32 [4],
    optional, with ``short_select``) counts the buffered rows by ``_kth_key_short``'s path (tests,
    benchmarks.kernels.dsa --indexer-ab).
    """
    T, width = scores.shape[0], scores.shape[1]
    res = out[:T]
    if T == 0:
        return res
    use_window = ks is not None
    if use_window and (ke is None or cu_seqlens_k is None):
        raise ValueError("topk_select: ks needs ke and cu_seqlens_k")
    cap = candidate_capacity(topk)
    if scratch is None:
        scratch = batch_ids.new_zeros(topk_scratch_shape(T, topk))
    assert scratch.shape[0] >= T and scratch.shape[1] >= 2 * cap + 1 and scratch.stride(1) == 1
    if short_select is None:
        short_select = cap < 1 << 15
    if short_select and cap >= 1 << 15:
        raise ValueError("topk_select: short_select packs two counts in one int32; topk must be <= 8192")
    if fallbacks is None:
        fallbacks = batch_ids.new_zeros(1)
    interp = interpreting()
    block = block or (128 if interp else 1024)        # the interpreter's cost follows the block width
    segments = segments or max(1, min(triton.cdiv(4 * num_sms(), T), triton.cdiv(width, block)))
    dummy = positions
    win = (ks if use_window else dummy, ke if use_window else dummy, cu_seqlens_k if use_window else dummy)
    _candidates_kernel[(T, segments)](
        scores, scratch, batch_ids, positions, *win, scores.stride(0), scratch.stride(0), topk, margin,
        USE_WINDOW=use_window, BLOCK=block, CAP=cap, SAMPLE=sample, THRESHOLD_DIGITS=threshold_digits,
        SEM=append_sem, num_warps=candidate_warps,
    )
    _select_kernel[(T,)](
        scores, res, scratch, fallbacks, fallbacks if path_counts is None else path_counts, batch_ids, positions, *win,
        scores.stride(0), res.stride(0),
        scratch.stride(0), topk, USE_WINDOW=use_window, BLOCK=block if interp else 4096,
        BLOCK_K=min(1024, triton.next_power_of_2(topk)), CAP=cap, SHORT=short_select,
        STATS=path_counts is not None, num_warps=select_warps,
    )
    return res
