"""Write the step's new latent rows ([compressed kv || roped k_pe]) into the paged latent cache, as they
are or, into an FP8 cache, quantized (``paddle_mla.cache.fp8_latent`` holds the format and its reference)."""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: F401  (runtime-selected tensor library; tensors come from the caller)
import triton
import triton.language as tl

from paddle_mla.cache.fp8_latent import (MANTISSA_DROP, MANTISSA_DROP_HALF, MIN_EXPONENT, SCALE_SHIFT, SMALLEST_NORMAL,
                                         cache_width, is_fp8, scale_offset)
from paddle_mla.platform.triton_host import next_pow2

_BLOCK_D = 128


@triton.jit
def _write_latent_cache_kernel(
    latent, cache, slot_mapping,
    stride_lt, stride_cb, stride_cs,
    D, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    slot = tl.load(slot_mapping + t)
    # Explicit guard: integer division truncates toward zero, so slot -1 would land in block 0.
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        row = tl.load(latent + t.to(tl.int64) * stride_lt + d, mask=d < D)
        tl.store(cache + blk * stride_cb + off * stride_cs + d, row, mask=d < D)


@triton.jit
def _write_fp8_latent_kernel(
    latent, cache, slot_mapping,
    stride_lt, stride_cb, stride_cs,
    D, PAGE: tl.constexpr, BLOCK_D: tl.constexpr, SHIFT: tl.constexpr, MIN_E: tl.constexpr,
    TINY: tl.constexpr, DROP: tl.constexpr, HALF: tl.constexpr, SOFF: tl.constexpr,
):
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_mapping + t)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        row = tl.load(latent + t.to(tl.int64) * stride_lt + d, mask=d < D, other=0.0).to(tl.float32)
        # power-of-two scale from the largest magnitude's exponent bits (the codec's rule, exact)
        e = tl.maximum(tl.max(tl.abs(row), 0).to(tl.int32, bitcast=True) >> 23, MIN_E)
        scale = ((e - SHIFT) << 23).to(tl.float32, bitcast=True)
        inv = ((254 + SHIFT - e) << 23).to(tl.float32, bitcast=True)
        dst = cache + blk * stride_cb + off * stride_cs
        # the codec's rounding (fp8_latent.round_to_e4m3): to 3 mantissa bits in float32 bits, so
        # the cast below is exact
        y = row * inv
        bits = y.to(tl.int32, bitcast=True)
        bits = bits + HALF + ((bits >> DROP) & 1)
        y = tl.where(tl.abs(y) < TINY, 0.0, ((bits >> DROP) << DROP).to(tl.float32, bitcast=True))
        # through SOFF: the zeros of the pad before the scale too (d >= D loaded as 0)
        tl.store(dst + d, y.to(cache.dtype.element_ty), mask=d < SOFF)
        tl.store((dst + SOFF).to(tl.pointer_type(tl.float32), bitcast=True), scale)


def write_latent_cache(latent, kv_cache, slot_mapping) -> None:
    """latent [T, D] -> kv_cache [num_blocks, block_size, 1, D] at slot_mapping int64 [T] (slot < 0 skipped).

    No allocation, no host sync: safe inside a CUDA graph.
    """
    T, D = latent.shape
    if T == 0:
        return
    assert kv_cache.shape[3] == cache_width(kv_cache, D) and kv_cache.shape[2] == 1, \
        "kv_cache must be [NB, bs, 1, D] (FP8: [NB, bs, 1, fp8_latent.row_width(D)])"
    assert latent.stride(1) == 1 and kv_cache.stride(3) == 1
    if is_fp8(kv_cache):
        _write_fp8_latent_kernel[(T,)](
            latent, kv_cache, slot_mapping, latent.stride(0), kv_cache.stride(0), kv_cache.stride(1),
            D, PAGE=kv_cache.shape[1], BLOCK_D=next_pow2(scale_offset(D)), SHIFT=SCALE_SHIFT, MIN_E=MIN_EXPONENT,
            TINY=SMALLEST_NORMAL, DROP=MANTISSA_DROP, HALF=MANTISSA_DROP_HALF, SOFF=scale_offset(D),
        )
        return
    grid = (T, triton.cdiv(D, _BLOCK_D))
    _write_latent_cache_kernel[grid](
        latent, kv_cache, slot_mapping,
        latent.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        D, PAGE=kv_cache.shape[1], BLOCK_D=_BLOCK_D,
    )
