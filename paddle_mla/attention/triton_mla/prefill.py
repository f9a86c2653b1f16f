"""Variable-length causal prefill ("extend") flash attention: queries are a request's new tokens,
keys and values its cached + new tokens (after kv_b_proj on the interleaved latent).

Query i of request b sits at position k_len_b - q_len_b + i and sees keys at positions <= it.

Keys may come in chunks (``extend_attention``): one launch sees the rows [k_start, k_start +
k_rows) of the packed key sequence (requests one after another, as ``cu_seqlens_k`` counts them),
held in a workspace whose row 0 is packed row k_start. Each launch writes the normalised partial
output and its log-sum-exp (log2 domain); with ``merge`` a request whose keys began in an earlier
chunk folds the stored partial into the new one (the flash-attention rescaling, across launches),
so the last chunk leaves the exact attention output. Query blocks that see no key of the chunk
are skipped, leaving the stored partial as it is.

The query/key head dim is given in two parts, A and B (MLA: nope and rope), each padded to a
power of two and masked; part B of the keys may be shared by every head (head stride 0: MLA's
k_pe, read straight from the latent rows). Dv is padded and masked.

Launch shape and tile order come from ``extend_config`` (the H100 sweep against SDPA flash and
SGLang's extend kernel: docs/benchmarks_history.md, "MLA prefill attention and b=1 decode";
``benchmarks.kernels.mla_prefill``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import dot_precision, env_overrides, interpreting, next_pow2, prev_pow2

LOG2E = 1.4426950408889634
PIECE_FIELDS = 8   # int32 fields of a piece record (``extend_pieces``)


@triton.jit
def _load_rows(ptrs, rmask, dmask, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Load with only the masks a tile needs: full tiles (ROWS False) and power-of-two dims
    (COLS False) load unmasked, which keeps the loads vectorised and the softmax mask-free."""
    if ROWS and COLS:
        return tl.load(ptrs, mask=rmask[:, None] & dmask[None, :], other=0.0)
    elif ROWS:
        return tl.load(ptrs, mask=rmask[:, None], other=0.0)
    elif COLS:
        return tl.load(ptrs, mask=dmask[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attend_tile(acc, m_i, l_i, q_a, q_b, ka_ptr, kb_ptr, v_ptr, mn, ma, mb, mv, kpos, qpos, sm_scale_log2,
                 DB: tl.constexpr, MASKED: tl.constexpr, MASK_A: tl.constexpr, MASK_B: tl.constexpr,
                 MASK_V: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key tile of the online softmax. MASKED: the tile holds the causal diagonal or the end of
    the keys; other tiles are visible to every query row of the block and skip the mask."""
    k_a = _load_rows(ka_ptr, mn, ma, MASKED, MASK_A)
    s = tl.dot(q_a, tl.trans(k_a), input_precision=DOT_PREC)
    if DB > 0:
        k_b = _load_rows(kb_ptr, mn, mb, MASKED, MASK_B)
        s = tl.dot(q_b, tl.trans(k_b), s, input_precision=DOT_PREC)
    if MASKED:
        ok = (kpos[None, :] <= qpos[:, None]) & mn[None, :]
        s = tl.where(ok, s * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see no key yet
    else:
        s = s * sm_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_rows(v_ptr, mn, mv, MASKED, MASK_V)
    # accumulate in place: one accumulator tile live (the decode kernel measured -16% with it)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["k_start", "k_rows"])   # per-chunk values: one compile for all
def _extend_kernel(
    QA, QB, KA, KB, V, O, LSE, CU_Q, CU_K, PIECE, sm_scale_log2, k_start, k_rows,
    stride_qat, stride_qah, stride_qbt, stride_qbh, stride_kat, stride_kah, stride_kbt, stride_kbh,
    stride_vt, stride_vh, stride_ot, stride_oh, stride_lt, stride_lh,
    DA: tl.constexpr, BLOCK_DA: tl.constexpr, DB: tl.constexpr, BLOCK_DB: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WRITE_LSE: tl.constexpr, MERGE: tl.constexpr, DOT_PREC: tl.constexpr,
    REVERSE_M: tl.constexpr, PIECES: tl.constexpr, NF: tl.constexpr,
):
    # REVERSE_M: the query blocks with the most keys (the last ones, causally) start first, so
    # the short blocks fill the tail of the grid
    if REVERSE_M:
        mblk = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        mblk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    if PIECES:
        # program b: one piece (``extend_pieces``): a request's keys [lo, hi) at workspace rows
        # from row0, and query blocks at absolute positions (block i holds positions
        # [i * BLOCK_M, (i + 1) * BLOCK_M)), so a query's tiles and their masks follow its position
        # alone, not where its chunk began
        rec = PIECE + b * NF
        q0 = tl.load(rec)
        q_len = tl.load(rec + 1)
        k_len = tl.load(rec + 2)
        lo = tl.load(rec + 3)
        hi = tl.load(rec + 4)
        k_base = tl.load(rec + 5) - lo      # workspace row of key position kpos: k_base + kpos
        offset = k_len - q_len
        m_begin = (offset // BLOCK_M + mblk) * BLOCK_M - offset
    else:
        q0 = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q0
        k0 = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k0
        offset = k_len - q_len
        # key positions of request b held by this launch: [lo, hi)
        lo = tl.maximum(k0, k_start) - k0
        hi = tl.minimum(k0 + k_len, k_start + k_rows) - k0
        k_base = k0 - k_start
        m_begin = mblk * BLOCK_M
    # keys past the last query of this block are never visible
    end = tl.minimum(hi, offset + tl.minimum(m_begin + BLOCK_M, q_len))
    if (m_begin < q_len) & (lo < end):
        offs_m = m_begin + tl.arange(0, BLOCK_M)
        mm = (offs_m >= 0) & (offs_m < q_len)
        qpos = offset + offs_m
        offs_a = tl.arange(0, BLOCK_DA)
        ma = offs_a < DA
        offs_b = tl.arange(0, BLOCK_DB)
        mb = offs_b < DB
        offs_v = tl.arange(0, BLOCK_DV)
        mv = offs_v < DV
        offs_n = tl.arange(0, BLOCK_N)
        rows_q = (q0 + offs_m).to(tl.int64)
        q_a = tl.load(QA + rows_q[:, None] * stride_qat + h * stride_qah + offs_a[None, :],
                      mask=mm[:, None] & ma[None, :], other=0.0)
        if DB > 0:
            q_b = tl.load(QB + rows_q[:, None] * stride_qbt + h * stride_qbh + offs_b[None, :],
                          mask=mm[:, None] & mb[None, :], other=0.0)
        else:
            q_b = q_a  # unused
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        # the workspace row of key position kpos is k_base + kpos
        ka_base = KA + h * stride_kah + offs_a[None, :]
        kb_base = KB + h * stride_kbh + offs_b[None, :]
        v_base = V + h * stride_vh + offs_v[None, :]
        # tiles of keys at positions <= the block's first query are visible to all its rows: no
        # causal mask there (H100: 10-15% faster than masking every tile, docs/benchmarks_history.md,
        # "MLA prefill attention and b=1 decode")
        full_end = tl.minimum(hi, offset + m_begin + 1)
        mid = lo + tl.maximum(full_end - lo, 0) // BLOCK_N * BLOCK_N
        for start in range(lo, mid, BLOCK_N):
            kpos = start + offs_n
            rows_k = (k_base + kpos).to(tl.int64)[:, None]
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_a, q_b, ka_base + rows_k * stride_kat, kb_base + rows_k * stride_kbt,
                v_base + rows_k * stride_vt, kpos < end, ma, mb, mv, kpos, qpos, sm_scale_log2,
                DB, False, DA < BLOCK_DA, DB < BLOCK_DB, DV < BLOCK_DV, DOT_PREC)
        for start in range(mid, end, BLOCK_N):
            kpos = start + offs_n
            rows_k = (k_base + kpos).to(tl.int64)[:, None]
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_a, q_b, ka_base + rows_k * stride_kat, kb_base + rows_k * stride_kbt,
                v_base + rows_k * stride_vt, kpos < end, ma, mb, mv, kpos, qpos, sm_scale_log2,
                DB, True, DA < BLOCK_DA, DB < BLOCK_DB, DV < BLOCK_DV, DOT_PREC)
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        o_ptr = O + rows_q[:, None] * stride_ot + h * stride_oh + offs_v[None, :]
        l_ptr = LSE + rows_q * stride_lt + h * stride_lh
        if MERGE:
            # keys of b before k_start were attended by earlier launches: fold their partial in
            # compared as a tensor: Triton 3.9's interpreter turns tensor & scalar-bool into an int mask
            if PIECES:
                prev = mm & (tl.zeros_like(rows_q) + lo > 0)
            else:
                prev = mm & (tl.zeros_like(rows_q) + k0 < k_start)
            lse_p = tl.load(l_ptr, mask=prev, other=float("-inf"))
            o_p = tl.load(o_ptr, mask=prev[:, None] & mv[None, :], other=0.0).to(tl.float32)
            m = tl.maximum(lse_p, lse)
            m = tl.where(m == float("-inf"), 0.0, m)
            w_p = tl.exp2(lse_p - m)
            w_c = tl.exp2(lse - m)
            den = w_p + w_c
            out = (o_p * w_p[:, None] + out * w_c[:, None]) / tl.where(den > 0, den, 1.0)[:, None]
            lse = tl.where(den > 0, m + tl.log2(tl.where(den > 0, den, 1.0)), float("-inf"))
        if PIECES:
            # a row that sees no key of the piece (its position below lo) keeps its stored partial
            # untouched (a no-op merge could still turn a -0.0 into +0.0, and rows see such pieces in
            # some chunkings only); by position, so a NaN in the scores is never hidden
            mm = mm & (qpos >= lo)
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mm[:, None] & mv[None, :])
        if WRITE_LSE:
            tl.store(l_ptr, lse, mask=mm)


@dataclass(frozen=True)
class ExtendConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    reverse_m: int = 1      # longest query blocks first (measured only with the rest of the default)


def extend_config(block_da: int, block_db: int, block_dv: int, elem_bytes: int = 2, **override) -> ExtendConfig:
    """Launch config from the padded head dims and the inputs' element size; ``override`` (or env
    PADDLE_MLA_EXTEND_CFG="block_n=128,num_stages=3") sets fields for tuning
    (benchmarks.kernels.mla_prefill --variants)."""
    if interpreting():
        cfg = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}
    elif block_da + block_db + block_dv <= 384:
        # MLA's 128+64 / 128: the best of the H100 sweep (docs/benchmarks_history.md, "MLA prefill
        # attention and b=1 decode"; 3 stages:
        # 155 KB of shared memory in bf16, one program per SM); fp32 tiles are twice the bytes and
        # 3 stages would need 295 KB, over the 227 KB an SM has, so fp32 keeps 2
        cfg = {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3 if elem_bytes <= 2 else 2}
    else:
        cfg = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    cfg.update(env_overrides("PADDLE_MLA_EXTEND_CFG"))
    cfg.update(override)
    return ExtendConfig(**cfg)


def extend_attention(q_a, q_b, k_a, k_b, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     sm_scale: float, k_start: int = 0, k_rows: int | None = None, merge: bool = False,
                     k_b_shared: bool = False, cfg: ExtendConfig | None = None):
    """One key chunk of the varlen causal extend attention, written into ``out`` (and ``lse``).

    q_a [Tq, H, DA], q_b [Tq, H, DB] (rows indexed by ``cu_seqlens_q``); k_a [k_rows, H, DA],
    k_b [k_rows, H, DB] or, with ``k_b_shared``, [k_rows, DB] read by every head; v [k_rows, H, Dv]:
    row r holds packed key k_start + r. out [Tq, H, Dv]; lse float32 [Tq, H] (log2 domain) or None
    when this is the only chunk. cu_seqlens int32 [B+1] (cu_k counts the cached prefix; both may be
    views into a larger batch: their values index q and the packed keys). max_seqlen_q: host-known
    upper bound of the query lengths. ``merge``: fold the partials stored by earlier chunks.
    """
    tq, H = q_a.shape[:2]
    bs = cu_seqlens_q.shape[0] - 1
    k_rows = k_a.shape[0] if k_rows is None else k_rows
    if tq == 0 or bs <= 0 or max_seqlen_q <= 0 or k_rows <= 0:
        return out
    cfg = cfg or _config_for(q_a, q_b, k_a, v)
    grid = (triton.cdiv(max_seqlen_q, cfg.block_m), bs, H)
    _launch(grid, q_a, q_b, k_a, k_b, v, out, lse, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q, sm_scale, k_start, k_rows,
            merge, k_b_shared, cfg, pieces=False)
    return out


def extend_pieces(q_a, q_b, k_a, k_b, v, out, lse, pieces, num_pieces: int, max_seqlen_q: int, sm_scale: float,
                  merge: bool, k_b_shared: bool = False, cfg: ExtendConfig | None = None):
    """``extend_attention`` over pieces: ``pieces`` int32 [num_pieces, PIECE_FIELDS], a record a piece
    (query row q0, q_len, k_len, key positions lo, hi, workspace row of key lo, ...); the keys are
    ``k_a``/``k_b``/``v`` rows. Query blocks sit at absolute positions, so a query's bits depend on its
    position, its keys and the pieces' bounds, not on the chunk it came in or on the other rows
    (``extend_segments.py``). ``merge``: every piece folds into the stored partial (pieces with
    lo > 0); rows that see no key of a piece keep the stored one."""
    H = q_a.shape[1]
    if num_pieces <= 0 or max_seqlen_q <= 0:
        return out
    cfg = cfg or _config_for(q_a, q_b, k_a, v)
    # a chunk of q queries spans at most cdiv(q, BLOCK_M) + 1 absolute blocks
    grid = (triton.cdiv(max_seqlen_q, cfg.block_m) + 1, num_pieces, H)
    _launch(grid, q_a, q_b, k_a, k_b, v, out, lse, pieces, pieces, pieces, sm_scale, 0, k_a.shape[0], merge,
            k_b_shared, cfg, pieces=True)
    return out


def _block_dim(d: int) -> int:
    """The kernel's block over a head dim of d (at least one 16-wide MMA step)."""
    return max(16, next_pow2(d))


def config_for_dims(da: int, db: int, dv: int, elem_bytes: int) -> ExtendConfig:
    """The extend kernel's config for head dims (da, db, dv): the one ``_launch`` runs with."""
    return extend_config(_block_dim(da), _block_dim(db) if db else 0, _block_dim(dv), elem_bytes)


def _config_for(q_a, q_b, k_a, v) -> ExtendConfig:
    return config_for_dims(q_a.shape[-1], q_b.shape[-1], v.shape[-1], k_a.element_size())


def _launch(grid, q_a, q_b, k_a, k_b, v, out, lse, cu_q, cu_k, piece, sm_scale, k_start, k_rows, merge, k_b_shared,
            cfg, pieces: bool):
    da, db, dv = q_a.shape[-1], q_b.shape[-1], v.shape[-1]
    assert q_a.stride(2) == 1 and q_b.stride(-1) == 1 and k_a.stride(2) == 1 and k_b.stride(-1) == 1
    assert v.stride(2) == 1 and out.stride(2) == 1 and (lse is not None or not merge)
    kb_t, kb_h = (k_b.stride(0), 0) if k_b_shared else (k_b.stride(0), k_b.stride(1))
    lse_t, lse_h = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    block_da, block_db, block_dv = _block_dim(da), _block_dim(db), _block_dim(dv)
    _extend_kernel[grid](
        q_a, q_b, k_a, k_b, v, out, out if lse is None else lse, cu_q, cu_k, piece,
        sm_scale * LOG2E, k_start, k_rows,
        q_a.stride(0), q_a.stride(1), q_b.stride(0), q_b.stride(1), k_a.stride(0), k_a.stride(1), kb_t, kb_h,
        v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse_t, lse_h,
        DA=da, BLOCK_DA=block_da, DB=db, BLOCK_DB=block_db, DV=dv, BLOCK_DV=block_dv,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WRITE_LSE=lse is not None, MERGE=merge,
        DOT_PREC=dot_precision(k_a.dtype), REVERSE_M=bool(cfg.reverse_m), PIECES=pieces, NF=PIECE_FIELDS,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, sm_scale: float, out=None):
    """q [Tq, H, Dqk], k [Tk, H, Dqk], v [Tk, H, Dv] -> [Tq, H, Dv]; cu_seqlens int32 [B+1];
    max_seqlen_q is the host-known upper bound of the per-request query lengths. All keys in one
    chunk; Dqk is split into a power-of-two part and a tail (192 = 128 + 64)."""
    tq, H, dqk = q.shape
    if out is None:
        out = torch.empty((tq, H, v.shape[-1]), dtype=q.dtype, device=q.device)
    da = prev_pow2(dqk) if dqk >= 16 else dqk
    return extend_attention(q[:, :, :da], q[:, :, da:], k[:, :, :da], k[:, :, da:], v, out, None, cu_seqlens_q,
                            cu_seqlens_k, max_seqlen_q, sm_scale)
