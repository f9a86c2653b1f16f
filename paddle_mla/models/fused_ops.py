"""Fused elementwise steps of the models: RMSNorm, the residual add fused with it (as transformers
computes them: fp32 statistics, the normalised row cast to the model dtype, then times the weight
in the model dtype), RoPE's rotation (``rope_rotate``, used by ``Rope.apply``; with MLA's q split
off in the same pass), MLA's latent rows (``mla_latent``: the norm and the rope of kv_a's output in
one pass) and DeepSeek's routing after the router GEMM (``route_topk``).

On a GPU each runs as one Triton kernel per call (one read of each input, one write of each
output). The plain-tensor form is ~7 passes over the activations: in the V2-Lite-dims 64 x 512
prefill profile (H100, docs/benchmarks_history.md, "Where the step time goes") PyTorch's elementwise
and copy kernels took 31% of the step, the norms' ``pow``/``mean``/casts a large share of it. The
plain form stays the CPU path and the kernel's oracle; the kernel rounds exactly where the plain form does.
"""

from __future__ import annotations

import functools
import os

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.models.arch import SCORING_FUNCS, TOPK_METHODS
from paddle_mla.ops import batch_invariant


def _rms_norm_plain(x, weight, eps: float):
    if batch_invariant.enabled():   # the framework's mean splits rows by the row count (paddle's CPU one does)
        return batch_invariant.rowwise(lambda r: _rms_norm_stats(r, weight, eps), x)
    return _rms_norm_stats(x, weight, eps)


def _rms_norm_stats(x, weight, eps: float):
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@functools.cache
def _triton_ok() -> bool:
    """PADDLE_MLA_FUSED=0 keeps the plain forms on a GPU too (A/B benchmarks, bisecting)."""
    if os.environ.get("PADDLE_MLA_FUSED", "1") == "0":
        return False
    return not _runtime.is_paddle() and _runtime.supports_triton_on("gpu")[0]


def _use_kernel(x, *others) -> bool:
    return (x.is_cuda and x.dtype != torch.float64 and x.is_contiguous() and x.shape[-1] <= 16384
            and all(o.is_contiguous() and o.dtype == x.dtype for o in others) and _triton_ok())


def _row_order_fixed(x):
    """Under ``deterministic: true`` a strided GPU view (MLA's latent, split from the rope part)
    goes to the kernel as a contiguous copy: the kernel reduces each row in one program, the plain
    form's framework reduction splits rows differently as the row count changes."""
    return x.contiguous() if batch_invariant.enabled() and x.is_cuda and not x.is_contiguous() else x


def rms_norm(x, weight, eps: float):
    x = _row_order_fixed(x)
    if not _use_kernel(x, weight):
        return _rms_norm_plain(x, weight, eps)
    from paddle_mla.models.fused_kernels import rms_norm_kernel_call

    return rms_norm_kernel_call(x, None, weight, eps)[1]


def add_rms_norm(residual, delta, weight, eps: float):
    """(residual + delta, rms_norm(residual + delta)): the sum rounded to the model dtype first."""
    residual, delta = _row_order_fixed(residual), _row_order_fixed(delta)
    if not _use_kernel(residual, delta, weight):
        h = residual + delta
        return h, _rms_norm_plain(h, weight, eps)
    from paddle_mla.models.fused_kernels import rms_norm_kernel_call

    return rms_norm_kernel_call(residual, delta, weight, eps)


def rope_rotate(x, cos, sin, interleave: bool, nope: int = 0):
    """``Rope.apply``'s rotation by the kernel, or None where the plain form must run. Needs an
    even power-of-two rope dim, a contiguous last dim and fp32 cos/sin [T, D/2] rows.
    ``nope`` > 0: ``x`` is [T, H, nope + D] (MLA's q) -> (its first ``nope`` dims of each head,
    contiguous; the rest rotated), in one pass (``Rope.split_apply``)."""
    d = x.shape[-1] - nope
    if not (x.is_cuda and x.stride(-1) == 1 and d >= 2 and d & (d - 1) == 0 and cos.stride(-1) == 1
            and cos.dtype == torch.float32 and cos.stride() == sin.stride() and _triton_ok()):
        return None
    from paddle_mla.models.fused_kernels import rope_kernel_call

    return rope_kernel_call(x[..., nope:] if nope else x, cos, sin, interleave, nope)


def mla_latent(x, weight, eps: float, cos, sin, interleave: bool):
    """MLA's latent cache rows from kv_a's output x [T, rank + rope]: rms_norm(x[:, :rank]) ||
    rope(x[:, rank:]), by one kernel (one read of x, one write) where three kernels and a
    concatenation ran; None where the plain form must run."""
    rank, d = weight.shape[0], x.shape[-1] - weight.shape[0]
    if not (x.dim() == 2 and x.stride(-1) == 1 and rank <= 16384 and d >= 2 and d & (d - 1) == 0
            and x.dtype != torch.float64 and weight.dtype == x.dtype and weight.is_contiguous()
            and x.is_cuda and cos.dtype == torch.float32 and cos.stride(-1) == 1 and cos.stride() == sin.stride()
            and _triton_ok()):
        return None
    from paddle_mla.models.fused_kernels import mla_latent_call

    return mla_latent_call(x, weight, eps, cos, sin, interleave)


def indexer_rope_norm(q, k, cos, sin, rope_dim: int, norm_w, norm_b, eps: float):
    """The DSA indexer's RoPE on q [T, H, D] (in place) and LayerNorm + RoPE on k [T, D] (half-split,
    on the first ``rope_dim`` dims) as one kernel, or None where the plain form must run. In plain
    tensors that is ~19 kernels a layer, which at one decode row cost more than their bytes."""
    d = q.shape[-1]
    if not (q.is_cuda and q.dim() == 3 and q.is_contiguous() and k.is_contiguous() and k.shape[-1] == d
            and d & (d - 1) == 0 and rope_dim % 2 == 0 and (rope_dim // 2) & (rope_dim // 2 - 1) == 0
            and 0 < rope_dim <= d and cos.dtype == torch.float32 and cos.stride(-1) == 1
            and cos.stride() == sin.stride() and norm_w.is_contiguous() and norm_b.is_contiguous() and _triton_ok()):
        return None
    from paddle_mla.models.fused_kernels import indexer_qk_call

    return indexer_qk_call(q, k, cos, sin, rope_dim, norm_w, norm_b, eps)


def route_topk(spec, logits, bias, extra: int = 0):
    """DeepSeek routing from the router's fp32 logits [T, E] by one kernel (``route_kernel``), or
    None where the plain form must run; ``moe.route`` is the plain form and this one's oracle.
    ``extra``: columns of the shared experts' pieces after the routed ones (``route_call``)."""
    if not (logits.is_cuda and logits.dtype == torch.float32 and logits.stride(-1) == 1 and _triton_ok()):
        return None
    args = route_kernel_args(spec)
    if args is None:
        return None
    from paddle_mla.models.route_kernel import route_call

    return route_call(logits, bias if spec.topk_method == "noaux_tc" else None, extra=extra, **args)


@functools.lru_cache(maxsize=None)
def route_kernel_args(spec) -> dict | None:
    """``route_kernel.route_call``'s arguments for a MoE spec, or None where the kernel does not apply
    (once per spec: the result is read-only)."""
    E, k = spec.n_routed_experts, spec.num_experts_per_tok
    # config-parsed specs passed arch.check_routing; the kernel's own limits (E, k) and specs built
    # directly are why the conditions are checked here too
    method = TOPK_METHODS.index(spec.topk_method) if spec.topk_method in TOPK_METHODS else None
    groups = 1 if method == 0 else spec.n_group
    # noaux_tc scores a group by its two best experts: groups of one have no such score (the plain
    # form's top-2 raises there)
    if not (method is not None and spec.scoring_func in SCORING_FUNCS and groups >= 1 and E % groups == 0
            and E <= 1024 and 0 < k <= min(32, E) and (groups == 1 or 0 < spec.topk_group <= groups)
            and (method != 2 or E // groups >= 2)):
        return None
    norm, scale = spec.weight_rule()
    return dict(groups=groups, topk_group=spec.topk_group if groups > 1 else 1, top_k=k,
                sigmoid=spec.scoring_func == "sigmoid", method=method, norm=norm, scale=scale,
                scaling=spec.routed_scaling_factor, norm_min=spec.norm_min)
