"""Plain-tensor references of the DSA (DeepSeek-V3.2 sparse attention) pieces.

They are the oracle of the Triton kernels and what the ``native`` backend composes. Conventions:
- positions are in the coordinates of one request's gathered keys: key j is the request's j-th
  token (cached prefix first, then the new tokens);
- a top-k row holds key positions, ``-1`` where the query has fewer than ``topk`` keys;
- ties at the k-th score go to the earlier position (``topk_ref``; docs/dsa.md);
- indexer weights ``w`` [q, H] already carry ``softmax_scale * n_heads ** -0.5``.
"""

from __future__ import annotations

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.attention.native import gather_latent, write_latent


def key_window_ref(cu_seqlens_k: np.ndarray, num_cached: np.ndarray, seq_lens_q: np.ndarray):
    """``[ks, ke)`` of every token of the step in the step's concatenated gathered keys (host loop).

    Request b's keys are ``cu_seqlens_k[b] .. cu_seqlens_k[b+1]``; its i-th new token sees
    ``ks = cu_seqlens_k[b]`` .. ``ke = ks + num_cached[b] + i + 1``. The per-token Python loop the
    Triton kernel replaces (seed 000), kept as the reference.
    """
    ks, ke = [], []
    for b in range(len(seq_lens_q)):
        start = int(cu_seqlens_k[b])
        for i in range(int(seq_lens_q[b])):
            ks.append(start)
            ke.append(start + int(num_cached[b]) + i + 1)
    return np.array(ks, dtype=np.int32), np.array(ke, dtype=np.int32)


def index_scores_ref(q, w, keys):
    """score[t, j] = sum_h w[t, h] * relu(q[t, h] . keys[j]), float32. q [q, H, D], w [q, H], keys [k, D]."""
    dots = torch.matmul(q.to(torch.float32), keys.to(torch.float32).transpose(0, 1).unsqueeze(0))   # [q, H, k]
    return torch.matmul(w.to(torch.float32).unsqueeze(1), torch.relu(dots)).squeeze(1)              # [q, k]


def masked_scores_ref(scores, ks, ke):
    """Scores outside ``[ks, ke)`` (per row, in the columns of ``scores``) to -inf."""
    cols = torch.arange(scores.shape[1], dtype=torch.int64, device=scores.device).unsqueeze(0)
    inside = (cols >= ks.to(torch.int64).unsqueeze(1)) & (cols < ke.to(torch.int64).unsqueeze(1))
    return torch.where(inside, scores, torch.full_like(scores, float("-inf")))


def topk_ref(scores, topk: int):
    """Columns of the ``topk`` largest finite scores per row, int64 [rows, topk], ascending, -1 padded.

    The tie rule (every path follows it): where keys tie at the k-th largest score, the EARLIER
    columns are taken. ``-0.0`` ties with ``0.0``. ``torch.topk`` alone does not fix which of the
    tied keys it returns, so it gives only the k-th value here; the columns follow from it.
    """
    rows, n = scores.shape
    out = torch.full((rows, topk), -1, dtype=torch.int64, device=scores.device)
    k = min(topk, n)
    if k == 0 or rows == 0:
        return out
    kth = torch.topk(scores, k, dim=-1)[0][:, k - 1:k]                          # [rows, 1]
    finite = scores > float("-inf")
    above = (scores > kth) & finite
    equal = (scores == kth) & finite
    need = k - torch.sum(above.to(torch.int64), -1, keepdim=True)
    take = above | (equal & (torch.cumsum(equal.to(torch.int64), -1) <= need))
    cols = torch.arange(n, dtype=torch.int64, device=scores.device).unsqueeze(0)
    # taken columns first, in column order (the others sort after them, shifted by n)
    order = torch.argsort(torch.where(take, cols, cols + n), dim=-1)[:, :k]
    taken = torch.gather(take.to(torch.int64), 1, order) > 0
    idx = torch.where(taken, order.to(torch.int64), torch.full_like(order, -1).to(torch.int64))
    if k == topk:
        return idx
    return torch.cat([idx, out[:, k:]], 1)


def positions_to_slots_ref(topk_pos, block_table_row, block_size: int):
    """Key positions of one request -> physical cache slots through its block table; -1 stays -1."""
    pos = topk_pos.to(torch.int64)
    valid = pos >= 0
    p = pos.clamp(min=0)
    block = block_table_row.to(torch.int64)[p // block_size]
    return torch.where(valid, block * block_size + p % block_size, torch.full_like(pos, -1))


def native_index_topk(q, k, w, index_cache, meta, topk: int):
    """Write the new indexer keys, then each request's top-k key positions, int64 [T, topk].

    One request at a time over its gathered keys (cached prefix + new tokens), causal: the i-th
    new token scores keys ``0 .. num_cached + i``. Host loop over the scheduler's numpy lengths.
    """
    T = q.shape[0]
    write_latent(index_cache, k, meta.slot_mapping)
    out = torch.full((T, topk), -1, dtype=torch.int64, device=q.device)
    rows = []
    start = 0
    for b in range(meta.num_reqs):
        q_len, cached = int(meta.seq_lens_q[b]), int(meta.num_cached[b])
        if q_len == 0:
            continue
        k_len = cached + q_len
        keys = gather_latent(index_cache, meta.block_tables[b], k_len, meta.block_size)
        scores = index_scores_ref(q[start:start + q_len], w[start:start + q_len], keys)
        ks = torch.zeros(q_len, dtype=torch.int64, device=q.device)
        ke = torch.arange(q_len, dtype=torch.int64, device=q.device) + cached + 1
        rows.append(topk_ref(masked_scores_ref(scores, ks, ke), topk))
        start += q_len
    return torch.cat(rows, 0) if rows else out
