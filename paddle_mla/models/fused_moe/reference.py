"""Plain-tensor routed MoE: only the selected (token, expert) pairs are computed.

Pairs are sorted by expert on the host and each expert's rows are gathered, run through its
gate/up/down projections and scattered back (by an inverse permutation), weighted and summed over
top-k in fp32, as transformers' DeepSeek MoE does with ``index_add_``. It syncs with the host
(``.cpu()`` of the routing ids), so it is the CPU / ``native`` path and the oracle of the Triton
kernels, not the GPU hot path. Portable: runs under Paddle's torch proxy (index_select, matmul,
cat, no sort with two results).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

FP8_MAX = 448.0


def dequant_block_fp8(w_q, w_scale, block: int = 128):
    """[E, N, K] float8 with scales [E, ceil(N/block), ceil(K/block)] -> float32 [E, N, K]."""
    E, N, K = w_q.shape
    s = w_scale.to(torch.float32)
    s = s.unsqueeze(2).unsqueeze(4).expand(E, s.shape[1], block, s.shape[2], block)
    s = s.reshape(E, s.shape[1] * block, s.shape[3] * block)[:, :N, :K]
    return w_q.to(torch.float32) * s


def routed_moe_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights, act_qdq=None):
    """x [T, K]; w_gate/w_up [E, N, K]; w_down [E, K, N]; topk_ids [T, top_k] int; topk_weights [T, top_k].

    Matmuls run in x's dtype (the weights are cast to it: fp8 callers pass dequantized weights);
    ``act_qdq`` (optional) quantizes-dequantizes the activations entering each GEMM, to mirror a
    w8a8 kernel. Returns [T, K] in x's dtype."""
    T, top_k = topk_ids.shape
    hidden = x.shape[-1]
    if T == 0:
        return x
    flat = topk_ids.reshape(-1).cpu().numpy().astype(np.int64)
    order = np.argsort(flat, kind="stable")                      # pairs grouped by expert
    counts = np.bincount(flat, minlength=w_gate.shape[0])
    inverse = np.argsort(order, kind="stable")                   # sorted position of each pair
    dev = x.device
    rows_of_pairs = torch.from_numpy(order // top_k).to(dev)    # token of each sorted pair
    xin = act_qdq(x) if act_qdq is not None else x
    outs, start = [], 0
    for e in np.flatnonzero(counts):
        end = start + int(counts[e])
        xe = xin.index_select(0, rows_of_pairs[start:end])
        wg, wu, wd = (w[int(e)].to(x.dtype) for w in (w_gate, w_up, w_down))
        h = F.silu(torch.matmul(xe, wg.transpose(0, 1))) * torch.matmul(xe, wu.transpose(0, 1))
        if act_qdq is not None:
            h = act_qdq(h)
        outs.append(torch.matmul(h, wd.transpose(0, 1)))
        start = end
    y = torch.cat(outs, 0).index_select(0, torch.from_numpy(inverse).to(dev))   # [T*top_k, K], pair order
    y = y.to(torch.float32).view(T, top_k, hidden) * topk_weights.to(torch.float32).unsqueeze(-1)
    return y.sum(1).to(x.dtype)
