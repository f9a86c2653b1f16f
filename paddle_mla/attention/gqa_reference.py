"""Plain-tensor reference of the ``append_attention`` op (GQA over a head-major paged K/V cache).

The one definition of the op's semantics (docs/append_attention.md); the
``native`` GQA backend runs it, and the C++/CUDA op is tested against it. Readable before fast:

1. RoPE on q and k at ``positions`` from the model's ``cos_sin`` table (neox halves or interleaved
   pairs; dims >= ``rot_dim`` pass through);
2. the roped k and v of every new token go into ``k_cache`` / ``v_cache``
   [num_kv_heads, num_blocks, block_size, head_dim] at (block of its position, position % block_size),
   the block read from a uniform table [B, max_blocks] or a head-wise one [B, num_kv_heads, max_blocks];
   a ``-1`` block is never written nor read;
3. every new token of request b at position p, query head h, KV head g = h // group, attends over key
   positions j <= p of request b, read back from the cache; an SWA head (the last ``num_swa_heads``
   KV heads) sees j only if j < ``sink`` or j > p - ``window``. Scores and softmax in float32.

``cu_seqlens_q`` and ``seq_lens_k`` are host arrays (numpy or lists): the native backend passes the
scheduler's, so the reference never reads the device back.
"""

from __future__ import annotations

import numpy as np
import torch


# queries per scores block: a long prefill's [Hkv, G, q, k] fp32 scores at once would take gigabytes
_Q_CHUNK = 512


def _host_ints(x) -> np.ndarray:
    """Lengths on the host. A tensor is refused: reading it back would sync inside the step."""
    if not isinstance(x, (np.ndarray, list, tuple)):
        raise TypeError(f"append_attention_reference takes host lengths (numpy or lists), got {type(x).__name__}")
    return np.asarray(x, dtype=np.int64)


def apply_rope(x, cos, sin, neox: bool, rot_dim: int):
    """x [T, H, D]; cos, sin [T, rot_dim/2] (float32) -> x roped in float32, same layout as x.

    neox: pairs (x[i], x[i + rot/2]); interleaved (GPT-J, ERNIE-4.5): pairs (x[2i], x[2i+1]).
    """
    xf = x.to(torch.float32)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    rot, rest = xf[..., :rot_dim], xf[..., rot_dim:]
    if neox:
        x1, x2 = rot[..., :rot_dim // 2], rot[..., rot_dim // 2:]
        roped = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        roped = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).reshape(rot.shape)
    return torch.cat([roped, rest], -1) if rot_dim < x.shape[-1] else roped


def _slot_rows(block_tables, rows_b, blk_idx, num_kv_heads: int):
    """Block ids [N, Hkv] for (request rows_b[n], block index blk_idx[n]) of every KV head (int64)."""
    n_heads_dim = block_tables.dim() == 3
    max_blocks = block_tables.shape[-1]
    flat = block_tables.reshape(-1).to(torch.int64)
    if not n_heads_dim:                          # uniform: the same block for every KV head
        ids = flat.index_select(0, rows_b * max_blocks + blk_idx)
        return ids.unsqueeze(1).expand(ids.shape[0], num_kv_heads)
    heads = torch.arange(num_kv_heads, dtype=torch.int64, device=flat.device)
    idx = (rows_b.unsqueeze(1) * num_kv_heads + heads.unsqueeze(0)) * max_blocks + blk_idx.unsqueeze(1)
    return flat.index_select(0, idx.reshape(-1)).reshape(idx.shape)


def write_kv(k_cache, v_cache, k, v, block_tables, batch_id_per_token, positions):
    """Step (2): k, v [T, Hkv, D] into the caches at each token's slot; -1 blocks are skipped.
    A flat [num_blocks, bs, D] cache (per-head ranges) takes global ids from head-wise tables."""
    NB, bs, D = k_cache.shape[-3:]
    stride = NB if k_cache.dim() == 4 else 0          # flat: the ids already name the head's range
    Hkv, T = k.shape[1], k.shape[0]
    if T == 0:
        return
    bid = batch_id_per_token[:T].to(torch.int64)
    pos = positions[:T].to(torch.int64)
    blocks = _slot_rows(block_tables, bid, pos // bs, Hkv)                          # [T, Hkv]
    heads = torch.arange(Hkv, dtype=torch.int64, device=blocks.device).unsqueeze(0)
    flat_idx = (heads * stride + blocks) * bs + (pos % bs).unsqueeze(1)              # [T, Hkv]
    keep = (blocks >= 0).reshape(-1)
    flat_idx = flat_idx.reshape(-1)[keep]
    k_cache.view(-1, D)[flat_idx] = k.reshape(-1, D)[keep].to(k_cache.dtype)
    v_cache.view(-1, D)[flat_idx] = v.reshape(-1, D)[keep].to(v_cache.dtype)


def _gather_request(cache, table_row, k_len: int):
    """Keys (or values) 0..k_len-1 of one request per KV head: ([Hkv, k_len, D] float32, present [Hkv, k_len]).

    ``table_row`` is [max_blocks] (uniform) or [Hkv, max_blocks]; positions whose block is -1 come
    back as zeros with present=False (their block is never read). A flat cache [num_blocks, bs, D]
    takes head-wise rows of global ids."""
    NB, bs, D = cache.shape[-3:]
    Hkv = cache.shape[0] if cache.dim() == 4 else table_row.shape[0]
    stride = NB if cache.dim() == 4 else 0
    n_blocks = -(-k_len // bs)
    row = table_row[..., :n_blocks].to(torch.int64)
    if row.dim() == 1:
        row = row.unsqueeze(0).expand(Hkv, n_blocks)
    j = torch.arange(k_len, dtype=torch.int64, device=row.device)
    blocks = row.index_select(1, j // bs)                                            # [Hkv, k_len]
    present = blocks >= 0
    heads = torch.arange(Hkv, dtype=torch.int64, device=row.device).unsqueeze(1)
    flat_idx = (heads * stride + torch.clamp(blocks, min=0)) * bs + (j % bs).unsqueeze(0)
    vals = cache.view(-1, D).index_select(0, flat_idx.reshape(-1)).reshape(Hkv, k_len, D).to(torch.float32)
    vals = torch.where(present.unsqueeze(-1), vals, torch.zeros_like(vals))
    return vals, present


def visible_mask(q_pos, k_len: int, num_kv_heads: int, num_swa_heads: int, window: int, sink: int):
    """Bool [Hkv, q, k_len]: key j visible to a query at q_pos[i] on KV head g (the contract's rule)."""
    j = torch.arange(k_len, dtype=torch.int64, device=q_pos.device).unsqueeze(0)      # [1, k]
    p = q_pos.to(torch.int64).unsqueeze(1)                                            # [q, 1]
    causal = j <= p
    full = causal.unsqueeze(0).expand(num_kv_heads - num_swa_heads, causal.shape[0], k_len)
    if num_swa_heads == 0:
        return full
    in_window = (j < sink) | (j > p - window)
    swa = (causal & in_window).unsqueeze(0).expand(num_swa_heads, causal.shape[0], k_len)
    return torch.cat([full, swa], 0)


def append_attention_reference(q, k, v, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_k,
                               batch_id_per_token, positions, cos_sin, out, *, softmax_scale: float, neox: bool,
                               rot_dim: int, num_swa_heads: int = 0, window: int = 0, sink: int = 0):
    """The contract's ``append_attention`` in plain tensors; writes [T, Hq, D] into ``out`` and returns it."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not group evenly over {Hkv} KV heads")
    if not 0 <= num_swa_heads <= Hkv:
        raise ValueError(f"num_swa_heads {num_swa_heads} not in [0, {Hkv}]")
    if num_swa_heads and window < 1:
        raise ValueError(f"SWA heads need a window >= 1 (got {window}): a query must see itself")
    if k_cache.dim() == 3 and block_tables.dim() != 3:
        raise ValueError("a flat [num_blocks, block_size, D] cache needs head-wise [B, Hkv, M] tables")
    if rot_dim % 2 or not 0 < rot_dim <= D:
        raise ValueError(f"rot_dim {rot_dim} must be even and in (0, {D}]")
    group = Hq // Hkv
    cu = _host_ints(cu_seqlens_q)
    k_lens = _host_ints(seq_lens_k)
    n = int(cu[-1]) if len(cu) else 0              # tokens past cu[-1] (graph padding) are not the step's
    out.zero_()
    if n == 0:
        return out
    cs = cos_sin.index_select(0, positions[:n].to(torch.int64)).to(torch.float32)
    cos, sin = cs[:, :rot_dim // 2], cs[:, rot_dim // 2:rot_dim]
    q_r = apply_rope(q[:n], cos, sin, neox, rot_dim)
    k_r = apply_rope(k[:n], cos, sin, neox, rot_dim)
    write_kv(k_cache, v_cache, k_r, v[:n], block_tables, batch_id_per_token, positions[:n])
    head_wise = block_tables.dim() == 3
    for b in range(len(cu) - 1):
        s, e, k_len = int(cu[b]), int(cu[b + 1]), int(k_lens[b])
        if e == s:
            continue
        keys, present = _gather_request(k_cache, block_tables[b], k_len)
        vals, _ = _gather_request(v_cache, block_tables[b], k_len)
        for qs in range(s, e, _Q_CHUNK):     # query chunks: the fp32 scores stay [Hkv, G, chunk, k]
            qe = min(e, qs + _Q_CHUNK)
            vis = visible_mask(positions[qs:qe], k_len, Hkv, num_swa_heads, window, sink)   # [Hkv, q, k]
            if head_wise and bool((vis & ~present.unsqueeze(1)).any()):
                raise ValueError(f"request {b}: a visible key position has no block (-1) in its head-wise table")
            qb = q_r[qs:qe].reshape(qe - qs, Hkv, group, D).permute(1, 2, 0, 3)            # [Hkv, G, q, D]
            scores = torch.matmul(qb, keys.unsqueeze(1).transpose(-1, -2)) * softmax_scale  # [Hkv, G, q, k]
            scores = torch.where(vis.unsqueeze(1), scores, torch.full_like(scores, float("-inf")))
            o = torch.matmul(torch.softmax(scores, dim=-1), vals.unsqueeze(1))              # [Hkv, G, q, D]
            out[qs:qe] = o.permute(2, 0, 1, 3).reshape(qe - qs, Hq, D).to(out.dtype)
    return out
