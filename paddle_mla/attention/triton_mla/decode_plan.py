"""Per-step decode plan, computed on the GPU into preallocated buffers (no host sync).

The decode kernel reads the block table directly (page-granular), so no token-level
``kv_indices`` / ``kv_indptr`` are built. What it needs is the split-KV work list:

  num_kv_splits[b]  splits of request b (>= 1; a zero-length row gets 1 and yields zeros)
  work_req[w], work_split[w], num_work[0]   the flattened (request, split) work items

Splits: tiles of BLOCK_N tokens; ``tiles_per_split = max(cdiv(sum tiles, target_items),
MIN_TILES)`` so the whole batch makes about ``target_items`` work items (enough to fill the
SMs), then each request's splits are evened out so that none is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import next_pow2


@dataclass
class DecodeWorkspace:
    """Buffers sized once at start-up; every decode call slices them (CUDA-graph safe)."""

    max_bs: int
    num_heads: int
    v_dim: int
    max_kv_splits: int
    num_kv_splits: Any   # int32 [max_bs]
    work_req: Any        # int32 [max_bs * max_kv_splits]
    work_split: Any      # int32 [max_bs * max_kv_splits]
    num_work: Any        # int32 [1]
    partial_out: Any     # fp32 [max_bs, H, max_kv_splits, v_dim]
    partial_lse: Any     # fp32 [max_bs, H, max_kv_splits] (log2 domain)


def alloc_decode_workspace(max_bs: int, num_heads: int, v_dim: int, max_kv_splits: int,
                           device: str) -> DecodeWorkspace:
    n = max_bs * max_kv_splits
    i32, f32 = torch.int32, torch.float32
    return DecodeWorkspace(
        max_bs=max_bs, num_heads=num_heads, v_dim=v_dim, max_kv_splits=max_kv_splits,
        num_kv_splits=torch.ones(max_bs, dtype=i32, device=device),
        work_req=torch.zeros(n, dtype=i32, device=device),
        work_split=torch.zeros(n, dtype=i32, device=device),
        num_work=torch.zeros(1, dtype=i32, device=device),
        partial_out=torch.empty((max_bs, num_heads, max_kv_splits, v_dim), dtype=f32, device=device),
        partial_lse=torch.empty((max_bs, num_heads, max_kv_splits), dtype=f32, device=device),
    )


@triton.jit
def _plan_kernel(
    seq_lens, num_splits_out, work_req, work_split, num_work_out,
    bs, target_items,
    MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr, BLOCK_B: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_B)
    valid = offs < bs
    lens = tl.load(seq_lens + offs, mask=valid, other=0)
    tiles = (lens + BLOCK_N - 1) // BLOCK_N
    total = tl.sum(tiles, axis=0)
    tps = tl.maximum((total + target_items - 1) // target_items, MIN_TILES)
    splits = tl.minimum(tl.maximum((tiles + tps - 1) // tps, 1), MAX_SPLITS)
    # even out: no split of a request is left empty
    per = tl.maximum((tiles + splits - 1) // splits, 1)
    splits = tl.maximum((tiles + per - 1) // per, 1)
    splits = tl.where(valid, splits, 0)
    tl.store(num_splits_out + offs, splits, mask=valid)
    start = tl.cumsum(splits, axis=0) - splits
    for s in range(MAX_SPLITS):
        m = valid & (s < splits)
        tl.store(work_req + start + s, offs, mask=m)
        tl.store(work_split + start + s, tl.zeros_like(offs) + s, mask=m)
    tl.store(num_work_out, tl.sum(splits, axis=0))


def build_decode_plan(seq_lens_k, bs: int, ws: DecodeWorkspace, block_n: int, target_items: int,
                      min_tiles: int = 1) -> None:
    """Fill ws.num_kv_splits[:bs] and the work list from seq_lens_k int32 [>= bs] (device).

    ``block_n`` and ``target_items`` come from ``decode.decode_config`` (host-known); once per step.
    """
    assert 0 <= bs <= ws.max_bs
    _plan_kernel[(1,)](
        seq_lens_k, ws.num_kv_splits, ws.work_req, ws.work_split, ws.num_work,
        bs, max(int(target_items), 1),
        MAX_SPLITS=ws.max_kv_splits, BLOCK_N=block_n, MIN_TILES=min_tiles,
        BLOCK_B=next_pow2(max(ws.max_bs, 16)),
    )
