"""Plain-tensor routed MoE: only the selected (token, expert) pairs are computed.

Pairs are sorted by expert on the host and each expert's rows are gathered, run through its
gate/up/down projections and scattered back (by an inverse permutation), weighted and summed over
top-k in fp32, as transformers' DeepSeek MoE does with ``index_add_``. The engine runs it on CPU
tensors only, where the routing ids are already on the host; ``select_moe_impl`` never picks it on a
GPU (``PADDLE_MLA_MOE=reference`` does, for tests: there it is the Triton kernels' oracle and syncs). Portable: runs under Paddle's torch proxy (index_select, matmul,
cat, no sort with two results).
"""

from __future__ import annotations

import numpy as np

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

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


def quant_block_fp8_reference(w, block: int = 128):
    """float [E, N, K] -> (float8_e4m3fn [E, N, K], fp32 scales [E, ceil(N/block), ceil(K/block)]),
    one scale per block x block tile: amax / 448 (floored at 1e-10). Builds FP8 test weights."""
    E, N, K = w.shape
    nb, kb = -(-N // block), -(-K // block)
    wp = torch.zeros(E, nb * block, kb * block, dtype=torch.float32, device=w.device)
    wp[:, :N, :K] = w.to(torch.float32)
    tiles = wp.view(E, nb, block, kb, block)
    scale = torch.clamp(torch.amax(torch.amax(tiles.abs(), 4), 2) / FP8_MAX, min=1e-10)        # [E, nb, kb]
    q = tiles / scale.unsqueeze(2).unsqueeze(4)
    q = torch.clamp(q, -FP8_MAX, FP8_MAX).view(E, nb * block, kb * block)[:, :N, :K]
    return q.contiguous().to(torch.float8_e4m3fn), scale


def act_quant_reference(x, group: int = 128):
    """Per-token-group e4m3 quantization: x [M, K] (K % group == 0) -> (q [M, K] e4m3, scale [M, K/group] fp32),
    scale = max(amax(|group|) / 448, 1e-10), q = clamp(x / scale, -448, 448) (what the fused MoE expects
    of its ``act_quant``)."""
    M, K = x.shape
    g = x.to(torch.float32).view(M, K // group, group)
    scale = torch.clamp(torch.amax(g.abs(), -1) / FP8_MAX, min=1e-10)
    q = torch.clamp(g / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX).view(M, K)
    return q.to(torch.float8_e4m3fn), scale


def act_qdq_reference(x, group: int = 128):
    """Quantize-dequantize per token group (what a w8a8 kernel sees), in x's dtype; K padded to the group."""
    M, K = x.shape
    kp = -(-K // group) * group
    xp = torch.zeros(M, kp, dtype=torch.float32, device=x.device)
    xp[:, :K] = x.to(torch.float32)
    q, scale = act_quant_reference(xp, group)
    deq = q.to(torch.float32).view(M, kp // group, group) * scale.unsqueeze(-1)
    return deq.view(M, kp)[:, :K].to(x.dtype)


def routed_moe_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights, act_qdq=None, act_qdq_inter=None):
    """x [T, K]; w_gate/w_up [E, N, K]; w_down [E, K, N]; topk_ids [T, top_k] int; topk_weights [T, top_k].

    Matmuls run in x's dtype (the weights are cast to it: fp8 callers pass dequantized weights);
    ``act_qdq`` (optional) quantizes-dequantizes the activations entering each GEMM, to mirror a
    w8a8 kernel; ``act_qdq_inter`` replaces it for the intermediate (the down GEMM's input), which a
    kernel may group differently (the fused kernel's QUANT_GROUP 64). Returns [T, K] in x's dtype."""
    T, top_k = topk_ids.shape
    hidden = x.shape[-1]
    if T == 0:
        return x
    # a host read of the routing: this reference runs on CPU (where it is no sync) and on a GPU only
    # when PADDLE_MLA_MOE=reference forces it for tests; select_moe_impl never picks it for a GPU step
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
        if (act_qdq_inter or act_qdq) is not None:
            h = (act_qdq_inter or act_qdq)(h)
        outs.append(torch.matmul(h, wd.transpose(0, 1)))
        start = end
    y = torch.cat(outs, 0).index_select(0, torch.from_numpy(inverse).to(dev))   # [T*top_k, K], pair order
    y = y.to(torch.float32).view(T, top_k, hidden) * topk_weights.to(torch.float32).unsqueeze(-1)
    return y.sum(1).to(x.dtype)
