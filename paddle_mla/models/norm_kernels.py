"""The Triton kernel behind ``models.norm`` (imported on the GPU path only)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import next_pow2


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
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = (xf * rstd).to(y_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * normed.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * N + cols, y, mask=mask)


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
