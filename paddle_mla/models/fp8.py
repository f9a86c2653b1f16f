"""FP8 (e4m3) block-scaled weights kept as FP8: the weight holder, the ``linear`` dispatch, and the
plain-tensor references the Triton kernels (``fp8_kernels``) are checked against.

Checkpoint convention (DeepSeek-V3): ``W`` float8_e4m3fn [N, K] with ``weight_scale_inv``
[ceil(N/bn), ceil(K/bk)] (bn = bk = 128), dequantized ``W = W_q * scale_inv`` per block, edge blocks
partial. Activations are quantized on the device per token in groups of bk (w8a8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.platform import runtime
from paddle_mla.ops import batch_invariant
from paddle_mla.platform.triton_host import compute_capability, device_index, next_pow2, num_sms
from paddle_mla.models.fp8_kernels import (
    BATCH_INVARIANT_TILE,
    FP8_MAX,
    INV_FP8_MAX,
    SCALE_MIN,
    GemmPlan,
    gemm_plan,
    group_quant,
    w8a8_block_matmul,
)

__all__ = ["FP8_MAX", "SCALE_MIN", "Fp8Weight", "dequant_blocks", "fp8_kernels_available", "linear",
           "per_token_group_quant", "per_token_group_quant_ref", "w8a8_block_matmul_ref", "w8a8_gemm",
           "w8a8_plan"]


def fp8_kernels_available(device_kind: str) -> tuple[bool, str]:
    """Whether the FP8 Triton kernels run here, and why not when they do not."""
    if device_kind != "gpu":
        return False, "FP8 kernels need a GPU (no FP8 dot on CPU or in the Triton interpreter)"
    if not runtime.gpu_available():
        return False, f"the {runtime.name()} runtime sees no GPU"
    cc = compute_capability()
    if cc is None:   # the runtime sees a GPU that Triton cannot name: let the kernel launch decide
        return True, "compute capability unknown (no CUDA device visible to Triton)"
    if cc < (8, 9):
        return False, f"FP8 (e4m3) math needs compute capability >= 8.9 (this GPU is {cc[0]}.{cc[1]})"
    return True, ""


@dataclass
class Fp8Weight:
    """A block-scaled FP8 weight: ``weight`` e4m3 [..., N, K], ``scale_inv`` fp32 [..., ceil(N/bn), ceil(K/bk)].

    ``kernel`` says whether ``linear`` runs the Triton w8a8 GEMM (GPU) or the dequantizing reference.
    Leading dims (experts [E, N, K]) are carried as-is for the MoE kernels.
    """

    weight: Any
    scale_inv: Any
    block: tuple[int, int] = (128, 128)
    kernel: bool = False

    @property
    def shape(self):
        return tuple(self.weight.shape)

    def dequantize(self, dtype=None):
        return dequant_blocks(self.weight, self.scale_inv, self.block, dtype or torch.float32)


def dequant_blocks(w_q, scale_inv, block: tuple[int, int], dtype=None):
    """``w_q`` (any float dtype, e4m3 included) [..., R, C] times its [..., ceil(R/br), ceil(C/bc)] block scales."""
    br, bc = block
    rows, cols = w_q.shape[-2], w_q.shape[-1]
    s = scale_inv.to(torch.float32)
    s = torch.repeat_interleave(torch.repeat_interleave(s, br, dim=-2), bc, dim=-1)
    s = s[..., :rows, :cols]
    return (w_q.to(torch.float32) * s).to(dtype or torch.float32)


def per_token_group_quant_ref(x, group: int = 128):
    """x [M, K] -> (x_q e4m3 [M, K], scale fp32 [M, K/group]); scale = max(amax/448, 1e-10) per group
    (amax * fp32(1/448): within one ulp of the division), x_q = clamp(x / scale, +-448) rounded to nearest."""
    M, K = x.shape
    if K % group:
        raise ValueError(f"per-token group quant needs K ({K}) to be a multiple of the group ({group})")
    xg = x.to(torch.float32).reshape(M, K // group, group)
    scale = torch.clamp(torch.amax(xg.abs(), -1) * INV_FP8_MAX, min=SCALE_MIN)
    q = torch.clamp(xg / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX)
    return q.reshape(M, K).to(torch.float8_e4m3fn), scale


def per_token_group_quant(x, group: int = 128, kernel: bool | None = None):
    """The activation quant of the w8a8 GEMMs (also consumed by the fused-MoE FP8 path).

    x [M, K] (bf16/fp16/fp32, K % group == 0) -> (x_q float8_e4m3fn [M, K], scale fp32 [M, K/group]).
    ``kernel``: the Triton kernel (True) or the plain-tensor reference (False); None: the kernel
    for tensors on a GPU.
    """
    if kernel is None:
        kernel = bool(x.is_cuda)
    if not kernel:
        return per_token_group_quant_ref(x, group)
    M, K = x.shape
    if K % group:
        raise ValueError(f"per-token group quant needs K ({K}) to be a multiple of the group ({group})")
    x = x.contiguous()
    x_q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    x_s = torch.empty((M, K // group), dtype=torch.float32, device=x.device)
    group_quant(x, x_q, x_s, group)
    return x_q, x_s


def w8a8_block_matmul_ref(x_q, x_s, w_q, w_s, block: tuple[int, int], out_dtype=None):
    """Dequantize both operands (fp32) and matmul: the oracle of the Triton w8a8 GEMM."""
    group = block[1]
    M, K = x_q.shape
    x = (x_q.to(torch.float32).reshape(M, K // group, group) * x_s.unsqueeze(-1)).reshape(M, K)
    w = dequant_blocks(w_q, w_s, block)
    y = batch_invariant.linear_for_mode(x, w)
    return y.to(out_dtype or torch.float32)


# split-K partials, one fp32 buffer per (device, split, M bucket, N): allocated on first use
# (warm-up, before any graph capture) and reused, so steady-state calls allocate nothing
_SPLIT_WORKSPACE: dict[tuple, Any] = {}


def _split_workspace(device, split: int, M: int, N: int):
    key = (str(device), split, next_pow2(M), N)
    ws = _SPLIT_WORKSPACE.get(key)
    if ws is None:
        ws = torch.empty((split * next_pow2(M) * N,), dtype=torch.float32, device=device)
        _SPLIT_WORKSPACE[key] = ws
    return ws


def w8a8_plan(M: int, N: int, K: int, block: tuple[int, int], device=None) -> GemmPlan:
    """The GEMM's launch plan (tile, split-K) on ``device``'s SM count (tensor or None: GPU 0)."""
    if batch_invariant.enabled():
        return GemmPlan(BATCH_INVARIANT_TILE, 1)
    return gemm_plan(M, N, K, block[1], num_sms(device_index(device) if device is not None else 0))


def w8a8_gemm(x_q, x_s, w_q, w_s, out, block: tuple[int, int], split: int | None = None) -> GemmPlan:
    """The Triton w8a8 GEMM into ``out`` with its plan; ``split`` forces the split-K factor (tests).
    Returns the plan it ran."""
    M, K = x_q.shape
    N = w_q.shape[0]
    plan = w8a8_plan(M, N, K, block, x_q)
    if split is not None:
        plan = GemmPlan(plan.tile, max(1, min(split, -(-K // block[1]))))
    ws = _split_workspace(x_q.device, plan.split, M, N) if plan.split > 1 and M > 0 else None
    w8a8_block_matmul(x_q, x_s, w_q, w_s, out, block, plan, ws)
    return plan


def fp8_linear(x, w: Fp8Weight, bias=None):
    """y = x @ W^T for an FP8 block-scaled W; x [..., K] in the model dtype, y in x's dtype."""
    lead = x.shape[:-1]
    K = x.shape[-1]
    N = w.weight.shape[0]
    x2 = x.reshape(-1, K)
    x_q, x_s = per_token_group_quant(x2, w.block[1], kernel=w.kernel)
    if w.kernel:
        y = torch.empty((x2.shape[0], N), dtype=x.dtype, device=x.device)
        w8a8_gemm(x_q, x_s, w.weight, w.scale_inv, y, w.block)
    else:
        y = w8a8_block_matmul_ref(x_q, x_s, w.weight, w.scale_inv, w.block, x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, N)


def linear(x, w, b=None):
    """The model's one linear: a dense weight goes to F.linear, an ``Fp8Weight`` to the w8a8 path."""
    if isinstance(w, Fp8Weight):
        return fp8_linear(x, w, b)
    return batch_invariant.linear_for_mode(x, w, b)


def dense(w, dtype):
    """A weight as a dense tensor in ``dtype`` (for weights that are reshaped, e.g. MLA's kv_b)."""
    return w.dequantize(dtype) if isinstance(w, Fp8Weight) else w
