"""The native MLA backend: plain tensor ops, one request at a time. The oracle for every other backend.

Per step: write the new latents into the paged cache at ``meta.slot_mapping``; then, for each
request (a host loop over the scheduler's numpy lengths, never reading device tensors back),
gather its ``num_cached + q_len`` latent rows through its block table and attend causally in
absorbed form: query i of the request sits at position ``num_cached + i`` and sees keys at
positions <= that. Scores and softmax in float32. Cached prefix tokens (prefix caching, earlier
chunks, decode history) come from the cache, so one code path covers prefill, decode, mixed
batches, chunked prefill and prefix caching.
"""

from __future__ import annotations

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.attention.backend import MLABackend, register_backend
from paddle_mla.cache.fp8_latent import read_rows, write_rows


def write_latent(kv_cache, latent, slot_mapping):
    """Reference cache write: kv_cache.view(-1, D)[slot] = latent[t] (every slot here is real),
    quantized into an FP8 cache (``cache.fp8_latent``)."""
    write_rows(kv_cache.view(-1, kv_cache.shape[-1]), slot_mapping, latent)


def gather_latent(kv_cache, block_table_row, k_len: int, block_size: int, latent_dim: int = 0):
    """Rows 0..k_len-1 of one request's latent sequence, [k_len, D], via its (device) block table row
    (float32 from an FP8 cache, whose rows need ``latent_dim``)."""
    n_blocks = (k_len + block_size - 1) // block_size
    blocks = block_table_row[:n_blocks].to(torch.int64)
    offs = torch.arange(block_size, dtype=torch.int64, device=blocks.device)
    rows = (blocks.unsqueeze(1) * block_size + offs.unsqueeze(0)).reshape(-1)[:k_len]
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    return read_rows(flat, rows, latent_dim)


def selected_mask(topk_pos, k_len: int):
    """Bool [q, k_len]: key j is among the row's selected positions (-1 entries select nothing)."""
    q = topk_pos.shape[0]
    col = torch.where(topk_pos >= 0, topk_pos, torch.full_like(topk_pos, k_len))
    hit = torch.zeros(q, k_len + 1, dtype=torch.float32, device=topk_pos.device)
    hit.scatter_(1, col, torch.ones(col.shape, dtype=torch.float32, device=topk_pos.device))
    return hit[:, :k_len] > 0


def absorbed_attention(q_nope, q_pe, kv, w_kc, w_vc, num_cached: int, kv_lora_rank: int, scale: float,
                       selected=None):
    """One request: q_nope [q, H, nope], q_pe [q, H, R], kv [k, C + R] -> [q, H, v], all in float32.
    ``selected`` (bool [q, k], DSA) further restricts each query to the keys its indexer picked.

    score(i, j) = (q_nope_i W_kc) . c_j + q_pe_i . k_pe_j   (= q_i . k_j of the explicit form)
    out_i = (sum_j p_ij c_j) W_vc                            (= sum_j p_ij v_j)
    """
    q_len, k_len = q_nope.shape[0], kv.shape[0]
    c = kv[:, :kv_lora_rank].to(torch.float32)                                  # [k, C]
    k_pe = kv[:, kv_lora_rank:].to(torch.float32)                               # [k, R]
    q_lat = torch.matmul(q_nope.to(torch.float32).transpose(0, 1), w_kc.to(torch.float32))   # [H, q, C]
    scores = torch.matmul(q_lat, c.transpose(0, 1))
    scores = scores + torch.matmul(q_pe.to(torch.float32).transpose(0, 1), k_pe.transpose(0, 1))
    scores = scores * scale                                                      # [H, q, k]
    q_pos = torch.arange(q_len, dtype=torch.int64, device=kv.device) + num_cached
    k_pos = torch.arange(k_len, dtype=torch.int64, device=kv.device)
    visible = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)                           # [q, k]
    if selected is not None:
        visible = visible & selected
    scores = torch.where(visible.unsqueeze(0), scores, torch.full_like(scores, float("-inf")))
    p = torch.softmax(scores, dim=-1)
    o_lat = torch.matmul(p, c)                                                   # [H, q, C]
    out = torch.matmul(o_lat, w_vc.to(torch.float32))                            # [H, q, v]
    return out.transpose(0, 1)


@register_backend("native")
class NativeMLABackend(MLABackend):
    def index_topk(self, q, k, w, index_cache, meta, topk: int):
        """DSA indexer (deepseek_v32): see ``paddle_mla.attention.dsa.reference``."""
        from paddle_mla.attention.dsa.reference import native_index_topk

        return native_index_topk(q, k, w, index_cache, meta, topk)

    def write_cache(self, latent, kv_cache, slot_mapping) -> None:
        keep = slot_mapping >= 0      # padded rows have no slot (a host read: CPU oracle only)
        write_latent(kv_cache, latent[keep], slot_mapping[keep])

    def forward(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta, topk_pos=None):
        """``topk_pos`` (int64 [T, topk], -1 padded; deepseek_v32) restricts each token to those keys."""
        d = self.dims
        T, H = q_nope.shape[0], q_nope.shape[1]
        if T == 0:
            return torch.zeros(0, H, d.v_head_dim, dtype=q_nope.dtype, device=q_nope.device)
        if not meta.latents_written:
            write_latent(kv_cache, latent, meta.slot_mapping)
        starts = np.concatenate([[0], np.cumsum(meta.seq_lens_q)]).astype(np.int64)
        outs = []
        for b in range(meta.num_reqs):
            q_len, cached = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
            if q_len == 0:
                continue
            s, e = int(starts[b]), int(starts[b] + q_len)
            kv = gather_latent(kv_cache, meta.block_tables[b], cached + q_len, meta.block_size, d.latent_dim)
            sel = None if topk_pos is None else selected_mask(topk_pos[s:e], cached + q_len)
            outs.append(absorbed_attention(q_nope[s:e], q_pe[s:e], kv, w_kc, w_vc, cached,
                                           d.kv_lora_rank, d.softmax_scale, sel))
        return torch.cat(outs, 0).to(q_nope.dtype)
