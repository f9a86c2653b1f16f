"""Plain-tensor MoE, the oracle of the fused kernels and what CPU runs: every expert over every token,
kept where the token chose it, weighted and summed in fp32 (transformers' DeepSeek MoE sums the same
terms with ``index_add_``). No host read of the routing and no shape that depends on it, so it never
syncs, on any device; the price is E / top_k times the routed FLOPs, which is why a GPU step runs the
fused kernels (``select_moe_impl``). Portable: runs under Paddle's torch proxy.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

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
    T = topk_ids.shape[0]
    if T == 0:
        return x
    xin = act_qdq(x) if act_qdq is not None else x
    qdq_inter = act_qdq_inter or act_qdq
    y = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device)
    for e in range(w_gate.shape[0]):
        chosen = topk_ids == e                                          # [T, top_k]
        weight = (topk_weights.to(torch.float32) * chosen.to(torch.float32)).sum(1, keepdim=True)
        wg, wu, wd = (w[e].to(x.dtype) for w in (w_gate, w_up, w_down))
        h = F.silu(torch.matmul(xin, wg.transpose(0, 1))) * torch.matmul(xin, wu.transpose(0, 1))
        if qdq_inter is not None:
            h = qdq_inter(h)      # per row: the routed rows see what the kernel's rows see
        out = torch.matmul(h, wd.transpose(0, 1)).to(torch.float32)
        # where, not a product: a token that did not choose e may overflow there (0 x inf is NaN)
        y = y + torch.where(chosen.any(1, keepdim=True), out * weight, torch.zeros_like(out))
    return y.to(x.dtype)
