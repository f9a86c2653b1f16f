"""The ``mla_decode`` custom op: absorbed-MLA decode over the paged latent cache (bf16, or FP8 rows in
``cache.fp8_latent``'s format, read by the warpgroup kernel: custom_ops/mla_decode_fp8.cuh), CUDA kernels
for SM90 (contract: custom_ops/mla_decode_cuda.h; the defaults, warpgroup MMA + TMA kernels:
custom_ops/mla_decode_wgmma.cuh, and custom_ops/mla_decode_narrow.cuh up to 16 heads; the mma.sync kernel:
custom_ops/mla_decode_kernel.cuh).

It runs on the split plan that ``attention.triton_mla.decode_plan.build_decode_plan`` writes on the
GPU (built with this config's ``block_n``, ``programs`` and ``min_tiles``) and into that plan's
preallocated partial workspace, so a call allocates nothing and reads nothing back (CUDA-graph safe).
The plain-tensor reference is ``attention.triton_mla.reference.mla_decode_ref``. Without a CUDA
build the call raises; ``available()`` says whether it can run.

``mla_sparse`` is the same kernel family over DSA's selected cache slots (custom_ops/mla_sparse_cuda.h;
reference ``attention.dsa.sparse_mla.sparse_mla_ref``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

from paddle_mla.ops import build
from paddle_mla.platform.triton_host import env_overrides

LATENT_DIM = 512   # kv_lora_rank: the value width
KEY_DIM = 576      # kv_lora_rank + qk_rope_head_dim
# (row_blocks, col_splits, block_n, stages) instantiated in custom_ops/mla_decode_kernels.cu. WARPGROUP
# is the sm_90a kernel (custom_ops/mla_decode_wgmma.cuh): 64 heads, two warpgroups splitting the value
# columns, 64-token tiles, two stages; the only one that reads FP8 rows. NARROW is its sm_90a twin for
# up to 16 heads over bf16 rows (custom_ops/mla_decode_narrow.cuh): one warpgroup, the keys as the
# MMAs' M, so 16 heads cost 16 heads' tensor work. The others are the mma.sync kernel
# (mla_decode_kernel.cuh, bf16 rows).
WARPGROUP = (4, 2, 64, 2)
NARROW = (1, 1, 64, 2)
NARROW_MAX_HEADS = 16
SUPPORTED = frozenset({(1, 4, 32, 4), (1, 4, 32, 2), (2, 4, 32, 3), (4, 2, 32, 3), (4, 2, 32, 2), WARPGROUP, NARROW})


@dataclass(frozen=True)
class MlaDecodeLaunch:
    """Launch config: 16 * ``row_blocks`` heads a program; (``row_blocks``, ``col_splits``, ``block_n``,
    ``stages``) name the kernel (WARPGROUP, NARROW, or an mma.sync config, where ``col_splits`` warps per
    16-head row block share its QK^T depth and split the 512 value columns); ``block_n``-token key tiles,
    ``stages`` deep; ``programs`` programs per head block (the plan's persistent grid); ``min_tiles``: fewest
    tiles per split (bounds the partial-output traffic: one split of 16 heads writes 32 KB of fp32 partials,
    about one 32-token tile of the latent)."""

    row_blocks: int
    col_splits: int
    block_n: int
    stages: int
    programs: int
    min_tiles: int

    @property
    def heads_per_program(self) -> int:
        return 16 * self.row_blocks

    def head_groups(self, num_heads: int) -> int:
        return -(-num_heads // self.heads_per_program)


def launch_config(num_heads: int, num_sms: int, fp8: bool = False, **override) -> MlaDecodeLaunch:
    """The config for ``num_heads`` (1..128) on a GPU of ``num_sms`` SMs, over bf16 rows or (``fp8``)
    FP8 rows; ``override`` (or env PADDLE_MLA_CUDA_DECODE_CFG="min_tiles=4") sets fields for tuning.

    Up to 16 heads over bf16 rows run the narrow warpgroup kernel (NARROW: their own tensor work,
    where the 64-head program pads them to 64 rows; its shorter tiles take 5-6% off b=1 on an H200, and
    from b=64 both kernels wait on the tile loads and run level); more heads, and FP8 rows at every
    head count, run the warpgroup kernel (WARPGROUP: 64-head programs, partial groups padded). Up to
    16 heads both plan alike (64-token tiles, one head group, the same programs). The other configs
    stay selectable by override, for comparison and for measuring. Shared memory admits one program
    per SM, so the grid is one program per SM over the head groups.
    """
    if num_heads < 1:
        raise ValueError("num_heads must be >= 1")
    rb, cs, bn, st = NARROW if num_heads <= NARROW_MAX_HEADS and not fp8 else WARPGROUP
    cfg = {"row_blocks": rb, "col_splits": cs, "block_n": bn, "stages": st, "min_tiles": 2}
    cfg.update(env_overrides("PADDLE_MLA_CUDA_DECODE_CFG"))
    cfg.update(override)
    groups = -(-num_heads // (16 * cfg["row_blocks"]))
    cfg.setdefault("programs", max(int(num_sms) // groups, 1))
    launch = MlaDecodeLaunch(**cfg)
    if (launch.row_blocks, launch.col_splits, launch.block_n, launch.stages) not in SUPPORTED:
        raise ValueError(f"mla_decode has no kernel for {launch}; supported (row_blocks, col_splits, block_n, "
                         f"stages): {sorted(SUPPORTED)}")
    return launch


def available() -> str:
    """'' when the compiled op can run GPU tensors, else why not."""
    ops = build.load_ops()
    if ops is None:
        return build.unavailable_reason() or "custom ops not built"
    return "" if ops.with_cuda else "the custom ops were built without CUDA (nvcc or GPU not found)"


def mla_decode(q, kv_cache, block_tables, seq_lens, out, num_splits, cu_tiles, split_start, tiles_per_prog,
               partial_out, partial_lse, batch: int, softmax_scale: float, launch: MlaDecodeLaunch):
    """q bf16 [>= batch, H, 576] -> out bf16 [>= batch, H, 512] (rows [0, batch) written in place);
    kv_cache bf16 [num_blocks, page, 1, 576] or float8 e4m3 FP8 rows [num_blocks, page, 1, 592] (the
    WARPGROUP config only: ``launch_config(..., fp8=True)``); block_tables / seq_lens int32; the plan
    tensors and the fp32 partials as ``decode_plan.DecodeWorkspace`` holds them. Returns ``out``."""
    why = available()
    if why:
        raise RuntimeError(f"the mla_decode op cannot run: {why}; use the Triton decode")
    build.load_ops().mla_decode(q, kv_cache, block_tables, seq_lens, num_splits, cu_tiles, split_start,
                                tiles_per_prog, out, partial_out, partial_lse, int(batch), float(softmax_scale),
                                int(launch.programs), int(launch.block_n), int(launch.row_blocks),
                                int(launch.col_splits), int(launch.stages))
    return out


def mla_sparse(q_lat, q_pe, kv_cache, slots, out, part_o, part_lse, rows: int, num_splits: int, split_len: int,
               softmax_scale: float):
    """DSA's sparse MLA through the SM90 warpgroup kernel (custom_ops/mla_sparse_cuda.h): q_lat bf16
    [>= rows, H, 512], q_pe bf16 [>= rows, H, 64], kv_cache bf16 [num_blocks, page, 1, 576], slots int64
    [>= rows, topk] (block * page + token; < 0 skipped) -> out bf16 [>= rows, H, 512] when
    ``num_splits`` is 1, else the fp32 partials ``part_o`` [rows, H, splits, 512] and ``part_lse``
    [rows, H, splits] (log2 units; flat, packed) for the caller's merge. Returns ``out``."""
    why = available()
    if why:
        raise RuntimeError(f"the mla_sparse op cannot run: {why}; use the Triton sparse MLA")
    build.load_ops().mla_sparse(q_lat, q_pe, kv_cache, slots, out, part_o, part_lse, int(rows), int(num_splits),
                                int(split_len), float(softmax_scale))
    return out
