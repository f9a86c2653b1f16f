"""The fused MoE driver: workspace sized at start-up, token chunks, align + two grouped GEMMs + top-k sum.

Per chunk of at most ``workspace.chunk`` tokens (so the workspace is bounded whatever M is):
  align (align.py) -> gate+up GEMM with silu*mul -> down GEMM with the routing weights -> sum over top-k.
No host sync and no allocation but the output tensor: the whole layer can be captured in a CUDA graph.
FP8 (w8a8): weights float8_e4m3fn with fp32 scales [E, N/128, K/128]; ``act_quant(x)`` -> (a_q
[M, K] e4m3, a_scale [M, K/128] fp32) quantizes the layer input per token in groups of 128; the
gate+up GEMM quantizes its own output for the down GEMM, in groups of the config's QUANT_GROUP
(64 or 128 columns; 64 doubles the gate+up grid where few rows leave SMs idle).
"""

from __future__ import annotations

import functools

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton

from paddle_mla.ops import batch_invariant
from paddle_mla.models.fused_moe.align import AlignBuffers, max_padded_pairs, moe_align
from paddle_mla.models.fused_moe.gemm import grouped_gemm_kernel, sum_topk_kernel
from paddle_mla.models.fused_moe.launch_config import get_config

FP8_GROUP = 128
MIN_QUANT_GROUP = 64       # the narrowest per-token group of the intermediate's quantization
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def device_name(t) -> str:
    if t.device.type != "cuda":
        return "cpu"
    return _cuda_device_name(t.device.index or 0)


@functools.cache
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


class MoEWorkspace:
    """Buffers of one MoE layer call, shared by every MoE layer of a model (they run one at a time).

    ``max_tokens``: the most tokens one call gets (scheduler.max_num_batched_tokens); the buffers
    hold ``chunk = min(max_tokens, chunk_tokens)`` tokens, larger calls are processed in chunks."""

    def __init__(self, max_tokens: int, top_k: int, num_experts: int, inter: int, hidden: int, dtype, device,
                 fp8: bool = False, chunk_tokens: int = 8192):
        self.chunk = max(1, min(max_tokens, chunk_tokens))
        self.top_k, self.num_experts, self.inter, self.hidden = top_k, num_experts, inter, hidden
        self.dtype, self.fp8 = dtype, fp8
        pairs = self.chunk * top_k
        self.align = AlignBuffers(pairs, num_experts, device)
        # One token (decode at batch 1): its top_k experts are distinct, so align would give each
        # pair a block of its own anyway. That plan is constant (pair j alone in block j, the rest
        # padding; right for any ids, rows are independent), built here once per BLOCK_M, and the
        # token's expert ids are the blocks' experts: align's five launches, which cost more than
        # their work at M=1 (BENCHMARKS.md, "Fused MoE"), are skipped.
        self.single = {}
        for bm in (16, 32, 64, 128):
            ids = torch.full((top_k * bm,), top_k, dtype=torch.int32, device=device)
            ids[::bm] = torch.arange(top_k, dtype=torch.int32, device=device)
            self.single[bm] = (ids, torch.full((1,), top_k * bm, dtype=torch.int32, device=device))
        if fp8:
            self.inter_q = torch.empty(pairs, inter, dtype=torch.float8_e4m3fn, device=device)
            self.inter_scale = torch.empty(pairs, triton.cdiv(inter, MIN_QUANT_GROUP), dtype=torch.float32,
                                           device=device)
        else:
            self.inter_q = torch.empty(pairs, inter, dtype=dtype, device=device)
            self.inter_scale = None
        self.down_out = torch.empty(pairs, hidden, dtype=dtype, device=device)

    def fits(self, top_k: int, num_experts: int, inter: int, hidden: int, dtype, fp8: bool) -> bool:
        """Fewer pairs a token than reserved fit too (a MoE layer's calls without its shared pieces)."""
        return 0 < top_k <= self.top_k and (num_experts, inter, hidden, dtype, fp8) == (
            self.num_experts, self.inter, self.hidden, self.dtype, self.fp8)


def _launch_gemm(a, b, b2, c, a_scale, b_scale, b2_scale, c_scale, topk_weights, sorted_ids, expert_ids, total,
                 num_pairs, a_row_div, gated, mul_routed, cfg, a_group=FP8_GROUP):
    E, N, K = b.shape
    if gated and (b2.stride() != b.stride() or (b_scale is not None and b2_scale.stride() != b_scale.stride())):
        raise ValueError(f"fused_moe: gate and up weights (and scales) must share strides: "
                         f"{b.stride()} vs {b2.stride()}")
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(sorted_ids.numel(), bm) * triton.cdiv(N, bn),)
    scaled = b_scale is not None
    quant_out = scaled and gated
    dummy = c            # stands for absent pointers (never read: their constexpr flags are off)
    grouped_gemm_kernel[grid](
        a, b, b2 if gated else b, c, a_scale if scaled else dummy, b_scale if scaled else dummy,
        b2_scale if (scaled and gated) else dummy, c_scale if quant_out else dummy,
        topk_weights if mul_routed else dummy, sorted_ids, expert_ids, total,
        N, K, num_pairs,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
        a_scale.stride(0) if scaled else 0, a_scale.stride(1) if scaled else 0,
        b_scale.stride(0) if scaled else 0, b_scale.stride(1) if scaled else 0, b_scale.stride(2) if scaled else 0,
        c_scale.stride(0) if quant_out else 0, c_scale.stride(1) if quant_out else 0,
        A_ROW_DIV=a_row_div, GATED=gated, MUL_ROUTED=mul_routed, BLOCK_SCALED=scaled, QUANT_OUT=quant_out,
        IEEE=a.dtype == torch.float32, GROUP=FP8_GROUP, A_GROUP=a_group,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


SMEM_BUDGET = 200 * 1024    # bytes of pipelined tiles a config may use (H100/H200 allow 227 KiB per block)


def quant_group(cfg: dict) -> int:
    """Width of the intermediate's FP8 groups (the gate+up BLOCK_N): the config's QUANT_GROUP, 64 or 128."""
    g = cfg.get("QUANT_GROUP", FP8_GROUP)
    if g not in (MIN_QUANT_GROUP, FP8_GROUP):
        raise ValueError(f"fused_moe: QUANT_GROUP must be {MIN_QUANT_GROUP} or {FP8_GROUP}, got {g}")
    return g


def _fit_config(cfg: dict, fp8: bool, gated: bool, elt: int) -> dict:
    """Constraints of the kernel: FP8 K tiles divide the scale groups of both operands (128 for the
    weights and the layer input, QUANT_GROUP for the intermediate the down GEMM reads); the gate+up
    GEMM quantizes its output per BLOCK_N columns, so its BLOCK_N is QUANT_GROUP. Then fewer pipeline
    stages (and at last a narrower K tile) until the A and B tiles fit in shared memory (fp32 tiles,
    two B tiles when gated): a heuristic config must not fail with OutOfResources."""
    cfg = dict(cfg)
    if fp8:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], FP8_GROUP if gated else quant_group(cfg))
        if gated:
            cfg["BLOCK_N"] = quant_group(cfg)

    def smem(c):
        return c["num_stages"] * (c["BLOCK_M"] * c["BLOCK_K"] + (2 if gated else 1) * c["BLOCK_K"] * c["BLOCK_N"]) * elt

    while smem(cfg) > SMEM_BUDGET and cfg["num_stages"] > 2:
        cfg["num_stages"] -= 1
    while smem(cfg) > SMEM_BUDGET and cfg["BLOCK_K"] > 32:
        cfg["BLOCK_K"] //= 2
    return cfg


def fused_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, workspace: MoEWorkspace,
              w_gate_scale=None, w_up_scale=None, w_down_scale=None, act_quant=None, config: dict | None = None,
              n_routed: int | None = None):
    """x [M, K]; w_gate/w_up [E, N, K]; w_down [E, K, N]; topk_ids [M, top_k] int; topk_weights [M, top_k] fp32.
    Returns [M, K] in x's dtype. Pairs whose id is outside [0, E) (expert parallel: experts another rank
    holds) add nothing. FP8 when ``w_gate_scale`` is given (then ``act_quant`` is required).
    ``config`` overrides the launch config (tests, tuning); ``n_routed`` is the model's expert count
    when this rank holds fewer (expert parallel), else None."""
    M, K = x.shape
    E, N, _ = w_gate.shape
    n_routed = E if n_routed is None else n_routed
    top_k = topk_ids.shape[1]
    fp8 = w_gate_scale is not None
    if fp8 and act_quant is None:
        raise ValueError("fused_moe: FP8 weights need act_quant (per-token-group quantization of x)")
    if not workspace.fits(top_k, E, N, K, x.dtype, fp8):
        raise ValueError(f"fused_moe: workspace (top_k {workspace.top_k}, E {workspace.num_experts}, N "
                         f"{workspace.inter}, K {workspace.hidden}, {workspace.dtype}, fp8 {workspace.fp8}) "
                         f"does not fit this call (top_k {top_k}, E {E}, N {N}, K {K}, {x.dtype}, fp8 {fp8})")
    out = torch.empty_like(x)
    dtype_name = "fp8_w8a8" if fp8 else _DTYPE_NAMES[x.dtype]
    elt = 1 if fp8 else x.element_size()
    ids_all = topk_ids.to(torch.int32).contiguous()
    w_all = topk_weights.to(torch.float32).contiguous()
    for start in range(0, M, workspace.chunk):
        m = min(workspace.chunk, M - start)
        cfg = config or get_config(m, E, N, K, top_k, dtype_name, device_name(x), batch_invariant.enabled())
        ids, weights = ids_all[start:start + m], w_all[start:start + m]
        num_pairs = m * top_k
        if m == 1 and cfg["BLOCK_M"] in workspace.single and top_k == workspace.top_k:
            # a foreign id becomes -1, a block the GEMMs skip (ids are in [0, E) unless expert parallel)
            (sorted_ids, total) = workspace.single[cfg["BLOCK_M"]]
            expert_ids = ids.reshape(-1) if E == n_routed else \
                torch.where((ids >= 0) & (ids < E), ids, torch.full_like(ids, -1)).reshape(-1)
        else:
            sorted_ids, expert_ids, total = moe_align(ids, workspace.align, cfg["BLOCK_M"])
        xc = x[start:start + m]
        inter = workspace.inter_q[:num_pairs]
        inter_scale = workspace.inter_scale[:num_pairs] if fp8 else None
        a_scale = None
        if fp8:
            xc, a_scale = act_quant(xc)
        _launch_gemm(xc, w_gate, w_up, inter, a_scale, w_gate_scale, w_up_scale, inter_scale, None, sorted_ids,
                     expert_ids, total, num_pairs, top_k, gated=True, mul_routed=False,
                     cfg=_fit_config(cfg, fp8, True, elt))
        down = workspace.down_out[:num_pairs]
        _launch_gemm(inter, w_down, None, down, inter_scale, w_down_scale, None, None, weights, sorted_ids,
                     expert_ids, total, num_pairs, 1, gated=False, mul_routed=True,
                     cfg=_fit_config(cfg, fp8, False, elt), a_group=quant_group(cfg) if fp8 else FP8_GROUP)
        bk = min(1024, triton.next_power_of_2(K))
        sum_topk_kernel[(m, triton.cdiv(K, bk))](down, out[start:start + m], ids, K, E, TOP_K=top_k, BLOCK_K=bk)
    return out


__all__ = ["MoEWorkspace", "fused_moe", "max_padded_pairs"]
