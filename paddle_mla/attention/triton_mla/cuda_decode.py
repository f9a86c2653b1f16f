"""The SM90 fast path of the ``triton_mla`` decode: the ``mla_decode`` CUDA op (``ops.mla_decode``)
on the same GPU-built split plan as the Triton kernel (``decode_plan``), with its own launch config
(key tiles, programs, fewest tiles a split) and a workspace sized for it at start-up.

Used when the backend is asked to (``attention.cuda_decode``) and ``unavailable_reason`` is empty:
a GPU of compute capability 9.x (the kernel's shared memory is sized for an SM90 block), bf16
compute over a bf16 cache or FP8 rows (``cache.fp8_latent``), kv_lora_rank 512 + rope 64, and a
CUDA build of the custom ops. Everywhere else the Triton decode runs.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.platform.triton_host import compute_capability, interpreting, num_sms
from paddle_mla.attention.triton_mla.decode_plan import (alloc_decode_workspace, build_decode_plan, fixed_split_tiles,
                                                        fixed_split_workspace, split_cap, split_cost_of)
from paddle_mla.cache.fp8_latent import is_fp8
from paddle_mla.ops import mla_decode as op


def unavailable_reason(kv_lora_rank: int, latent_dim: int, dtype, device: str, block_size: int = 64) -> str:
    """'' when the CUDA decode can serve these dims and cache pages on this device, else why not.
    ``dtype``: the compute dtype (the cache's, or what an FP8 cache's rows become)."""
    if device == "cpu" or interpreting():
        return "not on a GPU"
    if (kv_lora_rank, latent_dim) != (op.LATENT_DIM, op.KEY_DIM):
        return f"dims kv_lora_rank {kv_lora_rank} + rope {latent_dim - kv_lora_rank} (the kernel takes 512 + 64)"
    if dtype != torch.bfloat16:
        return f"dtype {dtype} (the kernel computes in bf16)"
    if block_size % 8:
        # its TMA boxes are gcd(page, 64) rows; fewer than 8 would start inside a swizzle atom (untested)
        return f"cache block_size {block_size} (the kernel takes a multiple of 8)"
    cc = compute_capability()
    if cc is None:
        return "no CUDA device visible to Triton"
    if cc[0] != 9:
        return f"compute capability {cc[0]}.{cc[1]} (the kernel is sized for SM90)"
    return op.available()


def _plan_fields(launch: op.MlaDecodeLaunch, num_heads: int) -> tuple:
    """What the split plan reads of a launch config (tiles, grid, fewest tiles, a split's heads)."""
    return launch.block_n, launch.programs, launch.min_tiles, min(num_heads, launch.heads_per_program)


class CudaDecode:
    """Plan + launch of the CUDA decode for up to ``max_bs`` rows of ``num_heads`` heads.

    ``split_tokens`` > 0: the batch-invariant plan (``deterministic: true``): every split is
    ``split_tokens`` keys (whole 64-key tiles) from its row's start, over rows of at most ``max_len``
    keys, so a row's bits follow its query and its context alone. The kernel's arithmetic per
    (row, head) does not depend on the other rows or heads of its program (an MMA row's sums run
    over K alone), its splits are its own windows, and the combine folds them in split order.
    """

    def __init__(self, num_heads: int, max_bs: int, device: str, split_tokens: int = 0, max_len: int = 0,
                 **override):
        # the fixed plan's workspace holds every split of a max_len row: without max_len it is too small
        assert not split_tokens or max_len > 0, "the batch-invariant plan needs max_len"
        self.launch = op.launch_config(num_heads, num_sms(), **override)
        # FP8 rows take the 64-head kernel (up to 16 heads bf16 rows take the narrow one); one plan
        # serves both
        self.fp8_launch = op.launch_config(num_heads, num_sms(), fp8=True, **override)
        assert _plan_fields(self.fp8_launch, num_heads) == _plan_fields(self.launch, num_heads), self.fp8_launch
        p, bn = self.launch.programs, self.launch.block_n
        # a split's partial rows (this program's heads, fp32) against a key tile: the plan weighs them
        self.split_cost = split_cost_of(min(num_heads, self.launch.heads_per_program), op.LATENT_DIM, bn, op.KEY_DIM)
        if split_tokens:
            self.fixed_tiles = fixed_split_tiles(split_tokens, bn)
            self.ws = fixed_split_workspace(max_bs, num_heads, op.LATENT_DIM, max_len, split_tokens, bn, device)
        else:
            self.fixed_tiles = 0
            self.ws = alloc_decode_workspace(max_bs, num_heads, op.LATENT_DIM, split_cap(p), device, programs=p)

    def plan(self, seq_lens_k, bs: int, ws=None) -> None:
        """The split plan of rows [0, bs) on the GPU (once per step, before ``run``), into ``ws``
        (default: this decoder's workspace; the pseudo rows pass theirs)."""
        build_decode_plan(seq_lens_k, bs, self.ws if ws is None else ws, self.launch.block_n, self.launch.programs,
                          self.launch.min_tiles, self.fixed_tiles, self.split_cost)

    def run(self, q, kv_cache, block_tables, seq_lens_k, out, bs: int, sm_scale: float, ws=None):
        """q [>= bs, H, 576] -> out [>= bs, H, 512] over the plan from ``plan`` (same rows, same ``ws``)."""
        ws = self.ws if ws is None else ws
        launch = self.fp8_launch if is_fp8(kv_cache) else self.launch
        return op.mla_decode(q, kv_cache, block_tables, seq_lens_k, out, ws.num_kv_splits, ws.cu_tiles,
                             ws.split_start, ws.tiles_per_prog, ws.partial_out, ws.partial_lse, bs, sm_scale,
                             launch)
