"""Absorbed-MLA decode over the paged latent cache: split-KV, two stages.

Stage 1: a fixed grid (head_groups, P). Program p takes the global KV tiles [p*Q, (p+1)*Q) of
the GPU-built plan (``decode_plan``), crossing request boundaries, so the work is balanced to the
tile (the batch-invariant plan has more windows than programs: p takes windows p, p + P, ...).
For each request it touches, it processes BLOCK_H heads at once and walks its tiles through
the block table: S = q_nope K_c^T + q_pe K_pe^T, fp32 online softmax (exp2), acc += P V with V =
the same K_c tile in shared memory (the latent is read once per head group). A request touched by
one program writes its output directly; others write normalised fp32 partials and their LSE, and
stage 2 merges them by LSE (and writes zeros for zero-length rows).

Query groups (``QueryGroups``, used for short extend rows): a "request" b of the plan may be QG
consecutive query tokens of one sequence (rows ROW0[b] .. ROW0[b] + NTOK[b] - 1 of q and out), with
causal lengths SEQ[b] - (NTOK[b] - 1 - g). Their QG x H (token, head) rows share the M dimension of
the head block, as FlashMLA does for multi-token queries, so each KV tile is read once per group
instead of once per token (and at H=16 the dots are 64 rows tall instead of 16).

No allocation and no host sync per call: workspaces come from ``alloc_decode_workspace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: F401  (runtime-selected tensor library; tensors come from the caller)
import triton
import triton.language as tl

from paddle_mla.cache.fp8_latent import cache_width, is_fp8, scale_offset
from paddle_mla.platform.triton_host import device_index, dot_precision, env_overrides, interpreting, next_pow2, num_sms
from paddle_mla.attention.triton_mla.decode_plan import (  # noqa: F401  (re-exported)
    MAX_DV_SPLIT, DecodeWorkspace, alloc_decode_workspace, build_decode_plan, partial_rows, split_cap, split_cost_of,
    PLAN_SEARCH,
)

LOG2E = 1.4426950408889634
# decode batches of at most this many rows use ``decode_config(..., small_batch=True)`` (backend.py):
# there every request has many splits (b=1, s=4k: 43), so deeper KV prefetch and a one-step merge
# pay; measured at b=1 (and losing at b=16, docs/benchmarks_history.md,
# "MLA prefill attention and b=1 decode")
SMALL_BATCH = 4
# Stage 2 takes DecodeConfig.stage2_heads rows a program once a launch has more than this many
# (token, head) rows an SM (below it, one row a program keeps small launches spread over the SMs)
STAGE2_ROWS_PER_SM = 32


@dataclass(frozen=True)
class QueryGroups:
    """``count`` plan rows, each ``ntok[b]`` (<= ``qg``) consecutive query tokens of one sequence
    starting at row ``row0[b]`` of q/out; the plan's seq_lens are the last token's causal lengths."""

    row0: Any     # int32 [>= count]
    ntok: Any     # int32 [>= count]
    qg: int
    count: int


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    programs: int        # stage-1 programs per head group (persistent grid)
    min_tiles: int = 1   # fewest tiles per split (bounds the partial-output traffic)
    q_in_loop: int = 0   # re-load q per KV tile (frees registers when BLOCK_H is large)
    # value-column slices: dv_split programs per (head block, split), each computes QK over all
    # 576 dims but accumulates only Lv/dv_split value columns (a [BLOCK_H, Lv/dv_split] fp32
    # accumulator instead of [BLOCK_H, Lv]: the h=128 spill fix, docs/triton_decode_notes.md)
    dv_split: int = 1
    merge_splits: int = 16  # splits stage 2 loads per step (all of them at once when >= max_kv_splits)
    # programmatic dependent launch: stage 2 starts (and reads its plan) while stage 1's last
    # programs still run, and waits (griddepcontrol.wait) before reading the partials (sm_90+)
    pdl: int = 0
    # (token, head) rows a stage-2 program on large launches (STAGE2_ROWS_PER_SM): one row a program
    # makes a prefill of 8192 pseudo-row tokens at 16 heads half a million programs, most of which find
    # their row finished by stage 1 (one split): 95 µs a layer on an H200 (docs/benchmarks_history.md,
    # "Determinism cost"). Each row's merge is unchanged; 1 is the one-row form.
    stage2_heads: int = 8

    @property
    def target_items(self) -> int:
        return self.programs


def decode_config(num_heads: int, device_idx: int = 0, small_batch: bool = False, elem_bytes: int = 2,
                  **override) -> DecodeConfig:
    """Host-known launch config from the head count (and SM count).

    ``override`` (or env PADDLE_MLA_DECODE_CFG="block_n=32,num_stages=3") sets fields for tuning;
    ``waves`` sets programs = SMs * waves / (head groups * dv_split) unless ``programs`` is given,
    so the grid stays about SMs * waves programs whatever the variant.
    Variants (docs/triton_decode_notes.md): ``dv_split=2|4`` splits the value columns across
    programs; ``block_h=16|32`` splits the heads into more, smaller blocks.
    ``small_batch``: the config for batches of at most ``SMALL_BATCH`` rows; it differs only in
    launch details (pipeline depth, merge step, PDL), so it runs on the same plan as the default.
    ``elem_bytes``: the cache's element size. The configs are tuned for 2-byte caches; a 4-byte
    (fp32) cache gets 16-key tiles: in fp32 the 64-row config needs 311,552 bytes of shared memory
    at 64 keys and 229,632 at 32, against the SM's 232,448; 188,672 at 16 (offline sm_90 compile).
    """
    if interpreting():
        cfg = {"block_h": max(16, min(next_pow2(num_heads), 64)), "block_n": 16, "num_warps": 4,
               "num_stages": 1, "min_tiles": 1, "waves": 1}
    elif num_heads <= 32:
        # memory-bound: small tiles, deep pipeline, 2 programs per SM (H100 sweep, .notes/triton_perf.md)
        cfg = {"block_h": max(16, next_pow2(num_heads)), "block_n": 32, "num_warps": 4, "num_stages": 3,
               "min_tiles": 1, "waves": 2}
        if small_batch:
            # 5 stages: two KV tiles in flight per program instead of one (the page-table load
            # takes a stage of its own); all splits merged in one load; stage 2 launched early
            # (PDL). H100, b=1, graph replay: s=4k 22.8 -> 20.8 µs, s=16k 40.7 -> 33.3 µs
            cfg.update(num_stages=5, merge_splits=64, pdl=1)
    else:
        # near the ridge: 64 heads x 64 tokens per wgmma step, one program per SM per head group.
        # dv_split stays 1 until the H100 comparison of the variants (docs/triton_decode_notes.md)
        cfg = {"block_h": 64, "block_n": 64, "num_warps": 8, "num_stages": 2, "min_tiles": 2, "waves": 1,
               "dv_split": 1}
    if elem_bytes > 2 and not interpreting():
        cfg["block_n"] = 16
    cfg.update(env_overrides("PADDLE_MLA_DECODE_CFG"))
    cfg.update(override)
    waves = cfg.pop("waves")
    if interpreting():
        cfg["pdl"] = 0
    if "programs" not in cfg:
        groups = triton.cdiv(num_heads, cfg["block_h"]) * cfg.get("dv_split", 1)
        cfg["programs"] = 4 if interpreting() else max(num_sms(device_idx) * waves // groups, 1)
    return DecodeConfig(**cfg)


# bs varies per step (the pseudo rows' group count most of all): one compile for every value,
# not one per divisibility class met in the middle of a run
@triton.jit(do_not_specialize=["bs"])
def _decode_stage1(
    Q, KV, BT, SEQ, NSPLIT, CU_T, SPLIT0, TPP, O, PO, PLSE, ROW0, NTOK,
    sm_scale_log2,
    stride_qb, stride_qh, stride_kvb, stride_kvs, stride_bt,
    stride_ob, stride_oh, stride_por, stride_poh, stride_lr, stride_lh,
    H, bs,
    PAGE: tl.constexpr, LKV: tl.constexpr, LR: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_KV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DV_SPLIT: tl.constexpr, Q_IN_LOOP: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr, QG: tl.constexpr,
    FP8: tl.constexpr, SOFF: tl.constexpr,
):
    if PDL:
        # stage 2 may launch now: it only reads the plan before its grid-dependency wait
        tl.extra.cuda.gdc_launch_dependents()
    # axis 0 = (head group, value slice): the DV_SPLIT programs of one head group are adjacent, so
    # they read the same KV tiles close together in time (L2 hits after the first)
    hg = tl.program_id(0) // DV_SPLIT
    pv = tl.program_id(0) % DV_SPLIT
    pid = tl.program_id(1)
    BV: tl.constexpr = BLOCK_KV // DV_SPLIT
    q_tiles = tl.load(TPP)
    total_tiles = tl.load(CU_T + bs)
    heads = hg * BLOCK_H + tl.arange(0, BLOCK_H)   # (token, head) rows: token heads // H of the group
    mh = heads < H * QG
    grp = heads // H
    hh = heads % H
    offs_bv = tl.arange(0, BV)
    # this program's value columns: QK uses them first, then the other slices (rotated order), so
    # the V operand is the K tile already loaded for QK (no second load of the latent)
    offs_v = pv * BV + offs_bv
    mv = offs_v < LKV
    offs_r = tl.arange(0, BLOCK_R)
    mr = offs_r < LR
    offs_n = tl.arange(0, BLOCK_N)
    # windows of q_tiles global tiles, one per program: the balanced plan has at most one per
    # program; the fixed-size plan (deterministic) may have more, taken in strides of the grid
    for win in range(pid, (total_tiles + q_tiles - 1) // q_tiles, tl.num_programs(1)):
        p_start = win * q_tiles
        p_end = tl.minimum(p_start + q_tiles, total_tiles)
        # requests overlapping this program's tiles [p_start, p_end): b_first .. b_last
        ob = tl.arange(0, BLOCK_B)
        starts = tl.load(CU_T + ob, mask=ob < bs, other=2147483647)
        ends = tl.load(CU_T + 1 + ob, mask=ob < bs, other=2147483647)
        b_first = tl.sum((ends <= p_start).to(tl.int32), 0)
        b_stop = tl.sum((starts < p_end).to(tl.int32), 0)
        one64 = tl.full((), 1, tl.int64)
        for b32 in range(b_first, b_stop):
            b = b32 * one64  # int64 row offsets (a plain int under the interpreter)
            c0 = tl.load(CU_T + b)
            seq_len = tl.load(SEQ + b)
            n_split = tl.load(NSPLIT + b)
            split = win - c0 // q_tiles
            t0 = tl.maximum(c0, p_start) - c0
            # a fixed-size plan pads a request's span to whole windows: stop at its last real tile
            t_end = tl.minimum(tl.load(CU_T + b + 1), c0 + (seq_len + BLOCK_N - 1) // BLOCK_N)
            t1 = tl.minimum(t_end, p_end) - c0

            if t1 > t0:  # zero-length rows are left to stage 2
                if QG == 1:
                    qrow = b + grp
                    mq = mh
                else:
                    ntok = tl.load(NTOK + b)
                    qrow = tl.load(ROW0 + b).to(tl.int64) + grp
                    mq = mh & (grp < ntok)
                    row_len = seq_len - (ntok - 1 - grp)   # each token's own causal length
                q_base = Q + qrow[:, None] * stride_qb + hh[:, None] * stride_qh
                if not Q_IN_LOOP:
                    q_v = tl.load(q_base + offs_v[None, :], mask=mq[:, None] & mv[None, :], other=0.0)
                    q_r = tl.load(q_base + LKV + offs_r[None, :], mask=mq[:, None] & mr[None, :], other=0.0)
                m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
                l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
                acc = tl.zeros([BLOCK_H, BV], dtype=tl.float32)
                bt_row = BT + b * stride_bt
                for t in range(t0, t1):
                    tok = t * BLOCK_N + offs_n
                    mn = tok < seq_len
                    page = tl.load(bt_row + tok // PAGE, mask=mn, other=0).to(tl.int64)
                    row = KV + page * stride_kvb + (tok % PAGE) * stride_kvs
                    k_v = tl.load(row[:, None] + offs_v[None, :], mask=mn[:, None] & mv[None, :], other=0.0)
                    k_r = tl.load(row[:, None] + LKV + offs_r[None, :], mask=mn[:, None] & mr[None, :], other=0.0)
                    if FP8:
                        # each key's scale (cache.fp8_latent) multiplies its score and its probability,
                        # so the tile feeds both dots as it is, in the query's dtype
                        k_scale = tl.load((row + SOFF).to(tl.pointer_type(tl.float32), bitcast=True),
                                          mask=mn, other=0.0)
                        k_v = k_v.to(Q.dtype.element_ty)
                        k_r = k_r.to(Q.dtype.element_ty)
                    if Q_IN_LOOP:
                        # many heads: q re-read per tile (L1/L2 hits) stays a shared-memory MMA operand
                        # instead of occupying registers next to the [BLOCK_H, BV] fp32 accumulator
                        q_v = tl.load(q_base + offs_v[None, :], mask=mq[:, None] & mv[None, :], other=0.0)
                        q_r = tl.load(q_base + LKV + offs_r[None, :], mask=mq[:, None] & mr[None, :], other=0.0)
                    s = tl.dot(q_v, tl.trans(k_v), input_precision=DOT_PREC)
                    for j in tl.static_range(1, DV_SPLIT):
                        # the other value slices only feed QK; their q slices are re-read per tile
                        # (L1 hits) rather than held next to the accumulator
                        offs_o = ((pv + j) % DV_SPLIT) * BV + offs_bv
                        mo = offs_o < LKV
                        k_o = tl.load(row[:, None] + offs_o[None, :], mask=mn[:, None] & mo[None, :],
                                      other=0.0).to(Q.dtype.element_ty)
                        q_o = tl.load(q_base + offs_o[None, :], mask=mq[:, None] & mo[None, :], other=0.0)
                        s = tl.dot(q_o, tl.trans(k_o), s, input_precision=DOT_PREC)
                    s = tl.dot(q_r, tl.trans(k_r), s, input_precision=DOT_PREC)
                    if FP8:
                        s = s * k_scale[None, :]
                    if QG == 1:
                        s = tl.where(mn[None, :], s * sm_scale_log2, float("-inf"))
                        m_new = tl.maximum(m_i, tl.max(s, 1))
                        m_use = m_new
                    else:
                        s = tl.where(tok[None, :] < row_len[:, None], s * sm_scale_log2, float("-inf"))
                        m_new = tl.maximum(m_i, tl.max(s, 1))
                        # a token whose causal length ends before this split's tiles sees no key here
                        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp2(m_i - m_use)
                    p = tl.exp2(s - m_use[:, None])
                    l_i = l_i * alpha + tl.sum(p, 1)
                    if FP8:
                        p = p * k_scale[None, :]
                    # accumulate in place: one acc tile live
                    acc = tl.dot(p.to(k_v.dtype), k_v, acc * alpha[:, None], input_precision=DOT_PREC)
                    m_i = m_new

                safe_l = tl.where(l_i > 0, l_i, 1.0)
                out = acc / safe_l[:, None]
                if n_split == 1:
                    o_ptr = O + qrow[:, None] * stride_ob + hh[:, None] * stride_oh + offs_v[None, :]
                    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mq[:, None] & mv[None, :])
                else:
                    # compact workspace: request b's splits own rows SPLIT0[b] .. SPLIT0[b] + n_split - 1;
                    # each value slice keeps its own LSE (its QK summed in its own order), so the merge
                    # of every column uses the statistics its partial was normalised with
                    r = tl.load(SPLIT0 + b).to(tl.int64) + split
                    po_ptr = PO + r * stride_por + heads[:, None] * stride_poh + offs_v[None, :]
                    tl.store(po_ptr, out, mask=mh[:, None] & mv[None, :])
                    tl.store(PLSE + r * stride_lr + heads * stride_lh + pv, m_i + tl.log2(safe_l), mask=mh)


@triton.jit
def _decode_stage2(
    PO, PLSE, NSPLIT, SPLIT0, SEQ, O, ROW0, NTOK,
    stride_por, stride_poh, stride_lr, stride_lh, stride_ob, stride_oh, H,
    LV: tl.constexpr, BV: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_SC: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr, QG: tl.constexpr, HEADS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(2) * BLOCK_DV
    pv = d0 // BV  # the value slice (stage-1 program) these columns came from; BLOCK_DV <= BV
    offs_d = d0 + tl.arange(0, BLOCK_DV)
    n_split = tl.load(NSPLIT + b)
    seq_len = tl.load(SEQ + b)
    r0 = tl.load(SPLIT0 + b).to(tl.int64)
    if QG != 1:
        row0 = tl.load(ROW0 + b).to(tl.int64)
        ntok = tl.load(NTOK + b)
    if PDL:
        # launched early (programmatic dependent launch): wait for all of stage 1 and its writes;
        # what is read above (the plan, the query groups) was written before stage 1 started
        tl.extra.cuda.gdc_wait()
    # HEADS (token, head) rows of the plan row a program: one program a row would be mostly launch
    # cost where stage 1 finished every row itself (one split: prefill's pseudo rows)
    for i in range(HEADS):
        h = tl.program_id(1) * HEADS + i   # (token, head) row of the plan row; QG == 1: the head
        md = (offs_d < LV) & (tl.zeros_like(offs_d) + h < H * QG)
        if QG == 1:
            orow = b
        else:   # the group's padding rows (token >= NTOK) are computed but never stored
            orow = row0 + h // H
            md = md & (tl.zeros_like(offs_d) + h // H < ntok)   # a tensor compare (interpreter)
        o_base = O + orow * stride_ob + (h % H) * stride_oh
        if seq_len == 0:
            tl.store(o_base + offs_d, tl.zeros([BLOCK_DV], dtype=O.dtype.element_ty), mask=md)
        elif n_split > 1:
            lse_base = PLSE + r0 * stride_lr + h * stride_lh + pv
            offs_s = tl.arange(0, BLOCK_S)
            lse_all = tl.load(lse_base + offs_s * stride_lr, mask=offs_s < n_split, other=float("-inf"))
            m = tl.max(lse_all, 0)
            denom = tl.sum(tl.exp2(lse_all - m), 0)
            acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
            base = PO + r0 * stride_por + h * stride_poh
            # Weights are known up front, so the chunk loads below are independent (pipelined).
            for c in range(0, MAX_SPLITS, BLOCK_SC):
                if c < n_split:
                    sc = c + tl.arange(0, BLOCK_SC)
                    ms = sc < n_split
                    lse_c = tl.load(lse_base + sc * stride_lr, mask=ms, other=float("-inf"))
                    w_c = tl.exp2(lse_c - m) / denom
                    part = tl.load(base + sc[:, None] * stride_por + offs_d[None, :],
                                   mask=ms[:, None] & md[None, :], other=0.0)
                    acc += tl.sum(part * w_c[:, None], 0)
            tl.store(o_base + offs_d, acc.to(O.dtype.element_ty), mask=md)


def mla_decode(q, kv_cache, block_tables, seq_lens_k, out, ws: DecodeWorkspace, kv_lora_rank: int,
               sm_scale: float, cfg: DecodeConfig, groups: QueryGroups | None = None):
    """q [bs, H, kv_lora_rank + rope] -> out [bs, H, kv_lora_rank] (written in place).

    kv_cache [NB, page, 1, kv_lora_rank + rope] in q's dtype, or FP8 rows with their scales
    (``paddle_mla.cache.fp8_latent``); block_tables int32 [>= bs, M]; seq_lens_k int32
    [>= bs]. The plan in ``ws`` must come from ``build_decode_plan`` with ``cfg.block_n``.
    ``groups``: the plan's rows are query groups (module doc): bs = ``groups.count`` and q/out hold
    the groups' tokens; ``ws`` and ``cfg`` are sized for ``groups.qg * H`` heads.
    Returns stage 1's launch handle (``n_regs`` / ``n_spills`` for tuning), or None when bs is 0.
    """
    bs, H, Lk = q.shape
    qg = groups.qg if groups is not None else 1
    if groups is not None:
        bs = groups.count
        row0, ntok = groups.row0, groups.ntok
    else:
        row0 = ntok = seq_lens_k   # unread (QG == 1)
    if bs == 0:
        return None
    Lv = kv_lora_rank
    fp8 = is_fp8(kv_cache)
    assert Lk > Lv and kv_cache.shape[-1] == cache_width(kv_cache, Lk) and out.shape[-1] == Lv
    assert qg * H <= ws.num_heads
    assert bs <= ws.max_bs
    assert q.stride(2) == 1 and kv_cache.stride(3) == 1 and out.stride(2) == 1
    assert cfg.dv_split in (1, 2, 4) and cfg.dv_split <= MAX_DV_SPLIT
    assert ws.programs == 0 or cfg.programs <= ws.programs, "the workspace was sized for fewer programs"
    po, lse = ws.partial_out, ws.partial_lse
    head_groups = triton.cdiv(qg * H, cfg.block_h)
    block_kv = max(16, next_pow2(Lv))
    bv = block_kv // cfg.dv_split
    assert bv >= 16, "value slices narrower than 16 columns do not make a tl.dot operand"
    handle = _decode_stage1[(head_groups * cfg.dv_split, cfg.programs)](
        q, kv_cache, block_tables, seq_lens_k, ws.num_kv_splits, ws.cu_tiles, ws.split_start, ws.tiles_per_prog,
        out, po, lse, row0, ntok,
        sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), po.stride(0), po.stride(1), lse.stride(0), lse.stride(1),
        H, bs,
        PAGE=kv_cache.shape[1], LKV=Lv, LR=Lk - Lv, BLOCK_B=ws.block_b,
        BLOCK_KV=block_kv, BLOCK_R=max(16, next_pow2(Lk - Lv)), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        DV_SPLIT=cfg.dv_split, Q_IN_LOOP=bool(cfg.q_in_loop), DOT_PREC=dot_precision(q.dtype), QG=qg,
        PDL=bool(cfg.pdl), FP8=fp8, SOFF=scale_offset(Lk), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    block_dv = min(128, bv)  # one stage-2 program never spans two value slices (their LSEs differ)
    rows = qg * H
    heads = cfg.stage2_heads if bs * rows > STAGE2_ROWS_PER_SM * num_sms(device_index(q)) else 1
    _decode_stage2[(bs, triton.cdiv(rows, heads), triton.cdiv(Lv, block_dv))](
        po, lse, ws.num_kv_splits, ws.split_start, seq_lens_k, out, row0, ntok,
        po.stride(0), po.stride(1), lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), H,
        LV=Lv, BV=bv, MAX_SPLITS=ws.max_kv_splits, BLOCK_S=next_pow2(ws.max_kv_splits),
        BLOCK_SC=min(next_pow2(cfg.merge_splits), next_pow2(ws.max_kv_splits)), BLOCK_DV=block_dv, PDL=bool(cfg.pdl),
        QG=qg, HEADS=heads, num_warps=4, **({"launch_pdl": True} if cfg.pdl else {}),
    )
    return handle
