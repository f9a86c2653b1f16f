"""Chunked prefill + prefix cache: gather each request's cached latent rows from the paged cache
and interleave them with the step's new rows, so kv_b_proj and the prefill attention see the whole
context. Output per request: [cached (k_len - q_len rows)..., new (q_len rows)...], requests one
after another (the packed key sequence that ``cu_seqlens_k`` counts). ``k_start`` / ``total_k``
select a window of it, so a long context is read chunk by chunk into a bounded workspace. A pure
copy (or, from an FP8 cache, a dequantization): bitwise equal to ``reference.read_cache_and_interleave_ref``.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla.prefill import PIECE_FIELDS
from paddle_mla.cache.fp8_latent import cache_width, is_fp8, scale_offset
from paddle_mla.platform.triton_host import next_pow2

_BLOCK_T = 16
_BLOCK_D = 128


@triton.jit(do_not_specialize=["k_start", "num_rows"])   # per-chunk values: one compile for all
def _interleave_kernel(
    CACHE, BT, NEW, CU_Q, CU_K, PIECE, OUT,
    k_start, num_rows, bs, D,
    stride_cb, stride_cs, stride_bt, stride_new, stride_out,
    PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr,
    PIECES: tl.constexpr, NF: tl.constexpr, FP8: tl.constexpr, SOFF: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)     # output row
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mt = r < num_rows
    md = d < D
    ob = tl.arange(0, BLOCK_B)
    if PIECES:
        # piece of each row: number of piece ends (row0 + hi - lo) <= r; ``bs`` pieces
        rec = PIECE + ob * NF
        ends = tl.load(rec + 5, mask=ob < bs, other=0) + tl.load(rec + 4, mask=ob < bs, other=0) \
            - tl.load(rec + 3, mask=ob < bs, other=0)
        ends = tl.where(ob < bs, ends, 2147483647)
        j = tl.minimum(tl.sum((ends[None, :] <= r[:, None]).to(tl.int32), 1), bs - 1)
        rec_j = PIECE + j * NF
        q0 = tl.load(rec_j, mask=mt, other=0)
        n_cached = tl.load(rec_j + 2, mask=mt, other=0) - tl.load(rec_j + 1, mask=mt, other=0)
        i = tl.load(rec_j + 3, mask=mt, other=0) + r - tl.load(rec_j + 5, mask=mt, other=0)
        b = tl.load(rec_j + 6, mask=mt, other=0)               # the piece's block-table row
    else:
        t = k_start + r                                         # packed key row (cu_k coordinates)
        # request of each token: number of cu_k[1..bs] entries <= t (a vectorised search)
        ends = tl.load(CU_K + 1 + ob, mask=ob < bs, other=2147483647)
        b = tl.sum((ends[None, :] <= t[:, None]).to(tl.int32), 1)
        b = tl.minimum(b, bs - 1)
        k0 = tl.load(CU_K + b, mask=mt, other=0)
        k1 = tl.load(CU_K + b + 1, mask=mt, other=0)
        q0 = tl.load(CU_Q + b, mask=mt, other=0)
        q1 = tl.load(CU_Q + b + 1, mask=mt, other=0)
        i = t - k0
        n_cached = (k1 - k0) - (q1 - q0)
    if FP8:
        # the step's rows are in the cache already: read them back rounded, as every later step will
        cached = mt
    else:
        cached = mt & (i < n_cached)
    page = tl.load(BT + b.to(tl.int64) * stride_bt + i // PAGE, mask=cached, other=0).to(tl.int64)
    src_c = CACHE + page * stride_cb + (i % PAGE) * stride_cs
    row_c = tl.load(src_c[:, None] + d[None, :], mask=cached[:, None] & md[None, :], other=0.0)
    if FP8:
        scale = tl.load((src_c + SOFF).to(tl.pointer_type(tl.float32), bitcast=True), mask=cached, other=0.0)
        row = row_c.to(tl.float32) * scale[:, None]
    else:
        src_n = NEW + (q0 + i - n_cached).to(tl.int64) * stride_new
        fresh = mt & (i >= n_cached)
        row_n = tl.load(src_n[:, None] + d[None, :], mask=fresh[:, None] & md[None, :], other=0.0)
        row = tl.where(cached[:, None], row_c, row_n.to(row_c.dtype))
    tl.store(OUT + r.to(tl.int64)[:, None] * stride_out + d[None, :], row.to(OUT.dtype.element_ty),
             mask=mt[:, None] & md[None, :])


def read_cache_and_interleave(kv_cache, block_tables, new_latent, cu_seqlens_q, cu_seqlens_k, total_k: int,
                              out=None, k_start: int = 0):
    """kv_cache [NB, page, 1, D], block_tables int32 [B, M], new_latent [T_new, D], cu_seqlens_q/k
    int32 [B+1] (cu_k counts the cached prefix). Returns the packed rows [k_start, k_start + total_k)
    as [total_k, D] in ``new_latent``'s dtype (``out`` to reuse a buffer); host-known sizes. From an FP8
    cache every row, the step's too, is read back from the cache and dequantized.

    The cu arrays may be views starting at a later request (their values are then offsets into
    ``new_latent`` and the packed sequence, and k_start >= cu_seqlens_k[0]); ``block_tables`` is
    sliced alike."""
    D = new_latent.shape[1]
    bs = cu_seqlens_k.shape[0] - 1
    if out is None:
        out = torch.empty((total_k, D), dtype=new_latent.dtype, device=new_latent.device)
    if total_k == 0 or bs <= 0:
        return out
    _launch(kv_cache, block_tables, new_latent, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q, out, k_start, total_k, bs,
            pieces=False)
    return out


def read_pieces(kv_cache, block_tables, new_latent, pieces, num_pieces: int, total_k: int, out):
    """The key rows of ``pieces`` (``prefill.extend_pieces``' records: a piece's rows [row0, row0 +
    hi - lo) hold its request's key positions [lo, hi), from the cache below the request's cached
    count and from ``new_latent`` above) into ``out[:total_k]``; ``block_tables`` is the step's,
    indexed by each record's table row. A pure copy, like ``read_cache_and_interleave``."""
    if total_k and num_pieces:
        _launch(kv_cache, block_tables, new_latent, pieces, pieces, pieces, out, 0, total_k, num_pieces, pieces=True)
    return out


def _launch(kv_cache, block_tables, new_latent, cu_q, cu_k, piece, out, k_start, total_k, bs, pieces: bool):
    page, D = kv_cache.shape[1], out.shape[1]
    assert kv_cache.shape[3] == cache_width(kv_cache, D)
    assert (new_latent.numel() == 0 or new_latent.stride(1) == 1) and kv_cache.stride(3) == 1 and out.stride(1) == 1
    grid = (triton.cdiv(total_k, _BLOCK_T), triton.cdiv(D, _BLOCK_D))
    _interleave_kernel[grid](
        kv_cache, block_tables, new_latent, cu_q, cu_k, piece, out,
        k_start, total_k, bs, D,
        kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0), new_latent.stride(0), out.stride(0),
        PAGE=page, BLOCK_T=_BLOCK_T, BLOCK_D=_BLOCK_D, BLOCK_B=next_pow2(max(bs, 2)), PIECES=pieces,
        NF=PIECE_FIELDS, FP8=is_fp8(kv_cache), SOFF=scale_offset(D),
    )
