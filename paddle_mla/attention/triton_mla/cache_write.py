"""Write the step's new latent rows ([compressed kv || roped k_pe]) into the paged latent cache."""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: F401  (runtime-selected tensor library; tensors come from the caller)
import triton
import triton.language as tl

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


def write_latent_cache(latent, kv_cache, slot_mapping) -> None:
    """latent [T, D] -> kv_cache [num_blocks, block_size, 1, D] at slot_mapping int64 [T] (slot < 0 skipped).

    No allocation, no host sync: safe inside a CUDA graph.
    """
    T, D = latent.shape
    if T == 0:
        return
    assert kv_cache.shape[-1] == D and kv_cache.shape[2] == 1, "kv_cache must be [NB, bs, 1, D]"
    assert latent.stride(1) == 1 and kv_cache.stride(3) == 1
    grid = (T, triton.cdiv(D, _BLOCK_D))
    _write_latent_cache_kernel[grid](
        latent, kv_cache, slot_mapping,
        latent.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        D, PAGE=kv_cache.shape[1], BLOCK_D=_BLOCK_D,
    )
