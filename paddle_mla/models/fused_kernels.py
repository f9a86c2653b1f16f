"""The Triton kernels behind ``models.fused_ops`` (imported on the GPU path only)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import next_pow2


@triton.jit
def _rms_normed(xf, w_ptr, cols, mask, n, eps, out_ptr):
    """fp32 row ``xf`` (``n`` valid of its columns) -> RMSNorm times the weight in ``out_ptr``'s dtype,
    rounded where transformers rounds: the normalised row to the model dtype, then the product."""
    ty = out_ptr.dtype.element_ty
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    normed = (xf * rstd).to(ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(ty)


@triton.jit
def _rope_rotated(row, i, mask, c, s, HALF: tl.constexpr, INTERLEAVE: tl.constexpr):
    """RoPE of the rope dims at ``row`` (indices ``i`` of HALF pairs: (x0, x1), (x2, x3)... when
    INTERLEAVE, else (x_i, x_{i+HALF})) by fp32 cos ``c`` / sin ``s`` -> (rotated firsts, rotated
    seconds) in fp32: the half-split layout ``Rope.apply`` gives."""
    if INTERLEAVE:
        x1 = tl.load(row + 2 * i, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + 2 * i + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        x1 = tl.load(row + i, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + HALF + i, mask=mask, other=0.0).to(tl.float32)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _rms_norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        # the sum in fp32, rounded to the model dtype: what ``residual + delta`` gives
        x = (x.to(tl.float32) + tl.load(d_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * N + cols, x, mask=mask)
    tl.store(y_ptr + row * N + cols, _rms_normed(x.to(tl.float32), w_ptr, cols, mask, N, eps, y_ptr), mask=mask)


def rms_norm_kernel_call(x, delta, weight, eps: float):
    """(x + delta or None, rms_norm of it) over the last dim of contiguous ``x``."""
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    y = torch.empty_like(x)
    h = torch.empty_like(x) if delta is not None else None
    if rows:
        block = next_pow2(n)
        warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
        _rms_norm_kernel[(rows,)](x, delta if delta is not None else x, weight, h if h is not None else y, y, n,
                                  float(eps), HAS_DELTA=delta is not None, BLOCK=block, num_warps=warps)
    return (h if h is not None else x), y


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, nope_ptr, H, stride_xt, stride_xh, stride_ct, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, INTERLEAVE: tl.constexpr, NOPE: tl.constexpr, BLOCK_NOPE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, HALF)
    hm = (h < H)[:, None]
    row = x_ptr + t * stride_xt + h[:, None] * stride_xh
    c = tl.load(cos_ptr + t * stride_ct + i)[None, :]
    s = tl.load(sin_ptr + t * stride_ct + i)[None, :]
    y1, y2 = _rope_rotated(row, i[None, :], hm, c, s, HALF, INTERLEAVE)
    o = out_ptr + (t * H + h[:, None]) * (2 * HALF)
    tl.store(o + i[None, :], y1.to(out_ptr.dtype.element_ty), mask=hm)
    tl.store(o + HALF + i[None, :], y2.to(out_ptr.dtype.element_ty), mask=hm)
    if NOPE > 0:   # the NOPE dims before each head's rope dims, copied out contiguous
        n = tl.arange(0, BLOCK_NOPE)[None, :]
        nm = hm & (n < NOPE)
        tl.store(nope_ptr + (t * H + h[:, None]) * NOPE + n, tl.load(row - NOPE + n, mask=nm), mask=nm)


def rope_kernel_call(x, cos, sin, interleave: bool, nope: int = 0):
    """x [T, H, D] or [T, D] (last dim contiguous, any row/head strides), cos/sin fp32 [T, D/2]
    -> a new contiguous tensor laid out as (rotated firsts || rotated seconds), as Rope.apply.
    ``nope`` > 0: ``x`` is the last D dims of heads of ``nope + D`` (q_pe of q), and the result is
    (the first ``nope`` dims of each head as a new contiguous tensor, the rotated part): one pass
    where a copy of q_nope and the rope were two."""
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(1) if squeeze else x
    T, H, D = x3.shape
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    nope_out = torch.empty((T, H, nope), dtype=x.dtype, device=x.device) if nope else out
    if T:
        block_h = min(16, next_pow2(H))
        _rope_kernel[(T, triton.cdiv(H, block_h))](x3, cos, sin, out, nope_out, H, x3.stride(0), x3.stride(1),
                                                     cos.stride(0), HALF=D // 2, BLOCK_H=block_h, INTERLEAVE=interleave,
                                                     NOPE=nope, BLOCK_NOPE=next_pow2(nope) if nope else 1)
    rot = out.squeeze(1) if squeeze else out
    return (nope_out.squeeze(1) if squeeze else nope_out, rot) if nope else rot


@triton.jit
def _mla_latent_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_ct, eps, RANK: tl.constexpr,
                       BLOCK_R: tl.constexpr, HALF: tl.constexpr, INTERLEAVE: tl.constexpr):
    """Row t of kv_a's output (compressed kv of RANK dims || k_pe of 2*HALF) -> the latent cache row:
    RMSNorm of the first part and RoPE of the second, by the helpers the norm and rope kernels use."""
    t = tl.program_id(0).to(tl.int64)
    ty = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_R)
    m = cols < RANK
    xf = tl.load(x_ptr + t * stride_xt + cols, mask=m, other=0.0).to(tl.float32)
    out = out_ptr + t * (RANK + 2 * HALF)
    tl.store(out + cols, _rms_normed(xf, w_ptr, cols, m, RANK, eps, out_ptr), mask=m)
    i = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t * stride_ct + i)
    s = tl.load(sin_ptr + t * stride_ct + i)
    y1, y2 = _rope_rotated(x_ptr + t * stride_xt + RANK, i, i < HALF, c, s, HALF, INTERLEAVE)
    tl.store(out + RANK + i, y1.to(ty))
    tl.store(out + RANK + HALF + i, y2.to(ty))


def mla_latent_call(x, weight, eps: float, cos, sin, interleave: bool):
    """x [T, rank + rope] (last dim contiguous), weight [rank], cos/sin fp32 [T, rope/2] -> a new
    contiguous [T, rank + rope]: rms_norm(x[:, :rank]) || rope(x[:, rank:])."""
    T, width = x.shape
    rank = weight.shape[0]
    out = torch.empty((T, width), dtype=x.dtype, device=x.device)
    if T:
        block = next_pow2(rank)
        _mla_latent_kernel[(T,)](x, weight, cos, sin, out, x.stride(0), cos.stride(0), float(eps), RANK=rank,
                                 BLOCK_R=block, HALF=(width - rank) // 2, INTERLEAVE=interleave,
                                 num_warps=4 if block <= 2048 else 8)
    return out


@triton.jit
def _indexer_qk_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, nw_ptr, nb_ptr, kout_ptr, H, stride_ct, eps,
                       D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (t, hb): half-split RoPE in place on the first 2*HALF dims of q's heads of block hb;
    program (t, 0) also writes LayerNorm(k[t]) (rounded to the model dtype) with the same RoPE."""
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    i = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t * stride_ct + i)
    s = tl.load(sin_ptr + t * stride_ct + i)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = (h < H)[:, None]
    row = q_ptr + (t * H + h[:, None]) * D
    x1 = tl.load(row + i[None, :], mask=hm, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + i[None, :], mask=hm, other=0.0).to(tl.float32)
    tl.store(row + i[None, :], (x1 * c[None, :] - x2 * s[None, :]).to(q_ptr.dtype.element_ty), mask=hm)
    tl.store(row + HALF + i[None, :], (x2 * c[None, :] + x1 * s[None, :]).to(q_ptr.dtype.element_ty), mask=hm)
    if hb == 0:
        kd = tl.arange(0, D)
        kx = tl.load(k_ptr + t * D + kd).to(tl.float32)
        mean = tl.sum(kx, axis=0) / D
        var = tl.sum((kx - mean) * (kx - mean), axis=0) / D
        rstd = 1.0 / tl.sqrt(var + eps)
        ty = kout_ptr.dtype.element_ty
        # LayerNorm of the three pieces (rope firsts, rope seconds, the rest), each rounded as
        # F.layer_norm's output is, then the rope on the first two from the rounded values
        y1 = ((tl.load(k_ptr + t * D + i).to(tl.float32) - mean) * rstd * tl.load(nw_ptr + i).to(tl.float32)
              + tl.load(nb_ptr + i).to(tl.float32)).to(ty).to(tl.float32)
        y2 = ((tl.load(k_ptr + t * D + HALF + i).to(tl.float32) - mean) * rstd
              * tl.load(nw_ptr + HALF + i).to(tl.float32)
              + tl.load(nb_ptr + HALF + i).to(tl.float32)).to(ty).to(tl.float32)
        tl.store(kout_ptr + t * D + i, (y1 * c - y2 * s).to(ty))
        tl.store(kout_ptr + t * D + HALF + i, (y2 * c + y1 * s).to(ty))
        if REST > 0:
            r = 2 * HALF + tl.arange(0, REST)
            rm = r < D
            y3 = ((tl.load(k_ptr + t * D + r, mask=rm, other=0.0).to(tl.float32) - mean) * rstd
                  * tl.load(nw_ptr + r, mask=rm, other=0.0).to(tl.float32)
                  + tl.load(nb_ptr + r, mask=rm, other=0.0).to(tl.float32))
            tl.store(kout_ptr + t * D + r, y3.to(ty), mask=rm)


def indexer_qk_call(q, k, cos, sin, rope_dim: int, norm_w, norm_b, eps: float):
    """q [T, H, D] contiguous (roped in place), k [T, D] contiguous -> (q, LayerNorm(k) roped)."""
    T, H, D = q.shape
    kout = torch.empty_like(k)
    if T:
        block_h = min(16, next_pow2(H))
        rest = D - rope_dim
        _indexer_qk_kernel[(T, triton.cdiv(H, block_h))](
            q, k, cos, sin, norm_w, norm_b, kout, H, cos.stride(0), float(eps), D=D, HALF=rope_dim // 2,
            REST=next_pow2(rest) if rest else 0, BLOCK_H=block_h)
    return q, kout
