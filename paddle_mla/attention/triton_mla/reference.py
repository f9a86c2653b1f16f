"""Plain-tensor references of the Triton MLA kernels: the oracle for their tests and the building
blocks of the ``native`` backend. Output sizes come from host-known arguments.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.cache.fp8_latent import is_fp8, read_rows, write_rows


def write_latent_cache_ref(latent, kv_cache, slot_mapping):
    """kv_cache[slot // page, slot % page, 0] = latent[t] for slot >= 0 (in place; returns kv_cache).

    The one reference that selects by a device mask (the skipped rows), which syncs on a GPU. Into
    an FP8 cache the rows go quantized (``cache.fp8_latent.quantize``).
    """
    nb, page, _, d = kv_cache.shape
    flat = kv_cache.view(nb * page, d)
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    write_rows(flat, slots[keep], latent[keep])
    return kv_cache


def cache_rows(kv_cache, slots, latent_dim: int):
    """Cache rows at flat ``slots`` (block * page + token, any shape) as [*slots.shape, width] in a float
    dtype: FP8 rows dequantized to float32 [.., latent_dim], a plain cache's rows as stored. Only the
    rows asked for are read."""
    nb, page, _, d = kv_cache.shape
    rows = read_rows(kv_cache.view(nb * page, d), slots.reshape(-1), latent_dim)
    return rows.view(*slots.shape, rows.shape[-1])


def decode_plan_ref(seq_lens_k, block_n: int, programs: int, max_kv_splits: int, min_tiles: int = 1,
                    split_cost: int = 0, search: int = 0):
    """(num_kv_splits int32 [B], cu_tiles int32 [B+1], tiles_per_prog) as ``decode_plan`` builds them
    (``split_cost`` > 0: the split-aware window size over ``search`` sizes, ``decode_plan.PLAN_SEARCH``)."""
    lens = seq_lens_k.to(torch.int64)
    tiles = (lens + block_n - 1) // block_n
    total = int(tiles.sum())
    q = max(-(-total // programs), min_tiles, -(-int(tiles.max()) // (max_kv_splits - 1)) if len(tiles) else 0, 1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64, device=lens.device), torch.cumsum(tiles, 0)])
    start = cu[:-1]

    def splits_of(q: int):
        return torch.where(tiles > 0, (start + tiles - 1) // q - start // q + 1, torch.ones_like(tiles))

    if split_cost > 0:
        costs = []
        for k in range(search):
            qk = q + k * max(q // 128, 1)
            n = splits_of(qk)
            costs.append((qk * programs * 64 + int(n[n > 1].sum()) * split_cost, k, qk))
        q = min(costs)[2]   # least cost, then the first tried
    return splits_of(q).to(torch.int32), cu.to(torch.int32), torch.tensor(q, dtype=torch.int32)


def _gather_pages(kv_cache, block_tables, d: int):
    """[B, M * page, d] latent rows of each request in logical order (-1 pages read block 0)."""
    page = kv_cache.shape[1]
    bt = block_tables.to(torch.int64).clamp(min=0)
    b, m = bt.shape
    slots = bt[:, :, None] * page + torch.arange(page, dtype=torch.int64, device=bt.device)
    return cache_rows(kv_cache, slots.reshape(b, m * page), d)


def mla_decode_ref(q, kv_cache, block_tables, seq_lens_k, kv_lora_rank: int, sm_scale: float):
    """Absorbed MLA decode: q [B, H, Lk] over each request's first seq_lens_k cached latent rows.

    Returns [B, H, kv_lora_rank] in q's dtype, fp32 math; zero-length rows are zeros.
    """
    kv = _gather_pages(kv_cache, block_tables, q.shape[-1]).to(torch.float32)   # [B, N, Lk]
    n = kv.shape[1]
    s = torch.matmul(q.to(torch.float32), kv.transpose(1, 2)) * sm_scale     # [B, H, N]
    pos = torch.arange(n, device=q.device)
    valid = pos[None, :] < seq_lens_k.to(torch.int64)[:, None]               # [B, N]
    s = torch.where(valid[:, None, :], s, torch.full_like(s, float("-inf")))
    m = torch.amax(s, -1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    out = torch.matmul(p, kv[:, :, :kv_lora_rank]) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out.to(q.dtype)


def read_cache_and_interleave_ref(kv_cache, block_tables, new_latent, cu_seqlens_q, cu_seqlens_k, total_k: int,
                                  k_start: int = 0):
    """Packed rows [k_start, k_start + total_k) of: per request its cached rows (k_len - q_len of
    them) then its new rows, in ``new_latent``'s dtype. From an FP8 cache every row comes from the cache
    (the step's rows were written first)."""
    page = kv_cache.shape[1]
    fp8 = is_fp8(kv_cache)
    cu_q = cu_seqlens_q.to(torch.int64)
    cu_k = cu_seqlens_k.to(torch.int64)
    t = torch.arange(total_k, dtype=torch.int64, device=new_latent.device) + k_start
    b = torch.searchsorted(cu_k[1:].contiguous(), t, right=True)
    i = t - cu_k[b]
    n_cached = (cu_k[b + 1] - cu_k[b]) - (cu_q[b + 1] - cu_q[b])
    cached = torch.ones_like(i, dtype=torch.bool) if fp8 else i < n_cached
    bt = block_tables.to(torch.int64)
    col = torch.where(cached, i // page, torch.zeros_like(i))
    slot = bt[b, col].clamp(min=0) * page + i % page
    from_cache = cache_rows(kv_cache, torch.where(cached, slot, torch.zeros_like(slot)),
                            new_latent.shape[1]).to(new_latent.dtype)
    new_row = torch.where(cached, torch.zeros_like(i), cu_q[b] + i - n_cached)
    if new_latent.shape[0] > 0:
        from_new = new_latent[new_row.clamp(max=new_latent.shape[0] - 1)]
    else:
        from_new = torch.zeros_like(from_cache)
    return torch.where(cached[:, None], from_cache, from_new)


def prefill_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, sm_scale: float, compute_dtype=None):
    """Varlen causal attention over [cached + new] keys; q [Tq, H, Dqk], k [Tk, H, Dqk], v [Tk, H, Dv].

    Query i of request b sits at position k_len_b - q_len_b + i and sees keys at positions <= it.
    Dense masked form: O(Tq * Tk * H) memory, meant for tests and small batches. ``compute_dtype``
    (default float32): float64 gives the tests a reference whose own rounding is negligible.
    """
    cd = torch.float32 if compute_dtype is None else compute_dtype
    tq, tk = q.shape[0], k.shape[0]
    cu_q = cu_seqlens_q.to(torch.int64)
    cu_k = cu_seqlens_k.to(torch.int64)
    iq = torch.arange(tq, dtype=torch.int64, device=q.device)
    ik = torch.arange(tk, dtype=torch.int64, device=q.device)
    bq = torch.searchsorted(cu_q[1:].contiguous(), iq, right=True)
    bk = torch.searchsorted(cu_k[1:].contiguous(), ik, right=True)
    qpos = (cu_k[bq + 1] - cu_k[bq]) - (cu_q[bq + 1] - cu_q[bq]) + iq - cu_q[bq]
    kpos = ik - cu_k[bk]
    allowed = (bq[:, None] == bk[None, :]) & (kpos[None, :] <= qpos[:, None])    # [Tq, Tk]
    s = torch.einsum("qhd,khd->hqk", q.to(cd), k.to(cd)) * sm_scale
    s = torch.where(allowed[None], s, torch.full_like(s, float("-inf")))
    m = torch.amax(s, -1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("hqk,khd->qhd", p, v.to(cd))
    return out if compute_dtype is not None else out.to(q.dtype)
