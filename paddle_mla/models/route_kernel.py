"""DeepSeek's routing after the router GEMM as one Triton kernel (imported on the GPU path only).

``moe.route`` in plain tensors is a softmax or sigmoid, the group limit (a top-k over group scores,
a one-hot mask, a fill), a top-k over the experts, a gather and a normalisation: 7-10 kernels a MoE
layer, about 20 µs at a decode batch where the experts' GEMMs take 70. Here one program takes one
token's row of logits through all of it. Experts are laid out as a [groups, group size] tile, so
group sizes that are not powers of two (DeepSeek-V2: 160 experts in 8 groups) need no padding.

Ties pick the lower index (torch.topk leaves their order open); the outputs are in descending
order of the choice score, as torch.topk's. Only the fp32 summation order differs from the plain
form, so scores and weights agree to a few units in the last place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import next_pow2

@triton.jit
def _route_kernel(logits_ptr, bias_ptr, ids_ptr, w_ptr, stride_l, scaling, norm_min, GROUPS: tl.constexpr,
                  GS: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr, SIGMOID: tl.constexpr,
                  METHOD: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SCALE: tl.constexpr,
                  EXTRA: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    gi = tl.arange(0, BLOCK_G)
    g = gi[:, None]
    j = tl.arange(0, BLOCK_S)[None, :]
    valid = (g < GROUPS) & (j < GS)
    flat = g * GS + j
    neg = float("-inf")
    x = tl.load(logits_ptr + t * stride_l + flat, mask=valid, other=neg)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        e = tl.exp(x - tl.max(tl.max(x, 1), 0))
        s = e / tl.sum(tl.sum(e, 1), 0)
    s = tl.where(valid, s, 0.0)
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + flat, mask=valid, other=0.0)
    # a NaN score (a NaN or inf logit upstream) is never the best: every pick below then stays an
    # expert of this row, as torch.topk's do, where a NaN would match no maximum
    choice = tl.where(choice != choice, neg, choice)
    weigh = s   # what a pick weighs (``moe.route_plain``): group_limited_greedy's outside its groups is 0
    if METHOD != 0:
        cv = tl.where(valid, choice, neg)
        best = tl.max(cv, 1)
        if METHOD == 2:   # a group's score: the sum of its two best
            first = tl.min(tl.where(cv == best[:, None], j, BLOCK_S), 1)
            best += tl.max(tl.where(j == first[:, None], neg, cv), 1)
        open_g = gi < GROUPS
        gs = tl.where(open_g, best, neg)
        keep = gi < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(gs, 0)
            pick = tl.min(tl.where(open_g & (gs == top), gi, BLOCK_G), 0)
            keep = keep | (gi == pick)
            open_g = open_g & (gi != pick)
            gs = tl.where(gi == pick, neg, gs)
        if METHOD == 2:
            choice = tl.where(keep[:, None], choice, neg)
        else:
            choice = tl.where(keep[:, None], choice, 0.0)
            weigh = tl.where(keep[:, None], s, 0.0)
    ki = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    ws = tl.zeros([BLOCK_K], dtype=tl.float32)
    avail = valid
    for k in tl.static_range(TOP_K):
        cv = tl.where(avail, choice, neg)
        top = tl.max(tl.max(cv, 1), 0)
        pick = tl.min(tl.min(tl.where(avail & (cv == top), flat, GROUPS * GS), 1), 0)
        ids = tl.where(ki == k, pick.to(tl.int64), ids)
        ws = tl.where(ki == k, tl.sum(tl.sum(tl.where(flat == pick, weigh, 0.0), 1), 0), ws)
        avail = avail & (flat != pick)
    if NORM:
        ws = ws / tl.maximum(tl.sum(ws, 0) + 1e-20, norm_min)
    if SCALE:
        ws = ws * scaling
    # the shared experts' pieces (``moe.fold_shared_experts``): ids E, E + 1, ..., weight 1
    ids = tl.where(ki >= TOP_K, (GROUPS * GS + ki - TOP_K).to(tl.int64), ids)
    ws = tl.where(ki >= TOP_K, 1.0, ws)
    tl.store(ids_ptr + t * (TOP_K + EXTRA) + ki, ids, mask=ki < TOP_K + EXTRA)
    tl.store(w_ptr + t * (TOP_K + EXTRA) + ki, ws, mask=ki < TOP_K + EXTRA)


def route_call(logits, bias, groups: int, topk_group: int, top_k: int, sigmoid: bool, method: int,
               norm: bool, scale: bool, scaling: float, norm_min: float = 0.0, extra: int = 0):
    """fp32 logits [T, E] (last dim contiguous) -> (ids int64 [T, top_k + extra], weights fp32 [T, top_k + extra]).
    ``method``: 0 greedy, 1 group-limited greedy (a group's score: its best), 2 noaux_tc (the sum of
    its two best, over scores plus ``bias``); ``fused_ops.route_kernel_args`` maps a MoE spec to these.
    ``norm``: divide by max(sum + 1e-20, ``norm_min``) (``MoESpec.weight_rule``).
    ``extra`` columns follow the routed ones: ids E .. E + extra - 1 with weight 1 (shared experts)."""
    T, E = logits.shape
    ids = torch.empty((T, top_k + extra), dtype=torch.int64, device=logits.device)
    weights = torch.empty((T, top_k + extra), dtype=torch.float32, device=logits.device)
    if T:
        gs = E // groups
        _route_kernel[(T,)](logits, bias if bias is not None else logits, ids, weights, logits.stride(0),
                            float(scaling), float(norm_min), GROUPS=groups, GS=gs, TOPK_GROUP=topk_group,
                            TOP_K=top_k, SIGMOID=sigmoid, METHOD=method, HAS_BIAS=bias is not None, NORM=norm,
                            SCALE=scale, EXTRA=extra, BLOCK_G=next_pow2(groups), BLOCK_S=next_pow2(gs),
                            BLOCK_K=next_pow2(top_k + extra),
                            num_warps=4 if E <= 256 else 8)
    return ids, weights
