"""Align (token, expert) pairs by expert, each expert's run padded to BLOCK_M, on the device.

Three small Triton kernels, no host sync, fixed-size outputs (so it runs inside a CUDA graph):
  1. count:   atomic histogram of the expert ids;
  2. offsets: padded counts, their exclusive cumsum (each expert's first slot), the padded total,
              and the expert of every BLOCK_M block (programs over the blocks);
  3. scatter: each pair takes the next slot of its expert with an atomic increment.
Slots inside an expert are in arbitrary order; that changes which rows share a GEMM tile, not any
row's result (rows of a tile are independent, the top-k sum runs later in a fixed order).
Padding slots hold ``num_pairs`` (an invalid pair id the GEMMs mask out). Pairs whose expert id is
outside ``[0, E)`` (expert parallel: experts other ranks hold) are left out: they take no slot.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: at most min(E, pairs) non-empty experts, each padded by < BLOCK_M."""
    return num_pairs + min(num_experts, num_pairs) * (block_m - 1)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, num_experts, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=0)
    mask = (offs < num_pairs) & (e >= 0) & (e < num_experts)
    tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)


@triton.jit
def _offsets_kernel(counts_ptr, cursor_ptr, expert_ids_ptr, total_ptr, num_experts, max_blocks,
                    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, BLOCK_B: tl.constexpr):
    # every program recomputes the (cheap) padded cumsum and labels its BLOCK_B blocks; program 0
    # also writes each expert's first slot (the scatter cursor) and the padded total
    e = tl.arange(0, E_P2)
    emask = e < num_experts
    cnt = tl.load(counts_ptr + e, mask=emask, other=0)
    padded = (cnt + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    total = tl.sum(padded, 0)
    pid = tl.program_id(0)
    if pid == 0:
        tl.store(cursor_ptr + e, end - padded, mask=emask)
        tl.store(total_ptr, total)
    # the expert of block b is the number of experts whose padded run ends at or before b * BLOCK_M
    end_valid = tl.where(emask, end, 2147483647)
    b = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row = b * BLOCK_M
    owner = tl.sum((end_valid[None, :] <= row[:, None]).to(tl.int32), 1)
    owner = tl.where(row < total, owner, -1)
    tl.store(expert_ids_ptr + b, owner, mask=b < max_blocks)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, num_pairs, num_experts, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=0)
    mask = (offs < num_pairs) & (e >= 0) & (e < num_experts)
    slot = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + slot.to(tl.int64), offs.to(tl.int32), mask=mask)


MAX_BLOCK_M = 128
MIN_BLOCK_M = 16


class AlignBuffers:
    """Preallocated align outputs for up to ``max_pairs`` pairs and any BLOCK_M in [16, 128]
    (sized once at start-up, reused every call)."""

    def __init__(self, max_pairs: int, num_experts: int, device):
        self.num_experts = num_experts
        cap = max_padded_pairs(max_pairs, num_experts, MAX_BLOCK_M)
        self.sorted_ids = torch.empty(cap, dtype=torch.int32, device=device)
        self.expert_ids = torch.empty(triton.cdiv(cap, MIN_BLOCK_M), dtype=torch.int32, device=device)
        self.counts = torch.empty(num_experts, dtype=torch.int32, device=device)
        self.cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
        self.total = torch.empty(1, dtype=torch.int32, device=device)


def moe_align(topk_ids, buf: AlignBuffers, block_m: int):
    """topk_ids [M, top_k] int32 (contiguous) -> (sorted_ids, expert_ids, total_padded) views of ``buf``.

    sorted_ids [padded cap] int32: pair ids (token * top_k + k) grouped by expert, padding = M*top_k;
    expert_ids [cap / BLOCK_M] int32: the expert of each block (-1 past the padded total);
    total_padded [1] int32 on the device: the GEMMs skip blocks at or past it."""
    num_pairs = topk_ids.numel()
    E, bm = buf.num_experts, block_m
    if not MIN_BLOCK_M <= bm <= MAX_BLOCK_M:
        raise ValueError(f"moe_align: BLOCK_M {bm} outside [{MIN_BLOCK_M}, {MAX_BLOCK_M}]")
    cap = max_padded_pairs(num_pairs, E, bm)
    if cap > buf.sorted_ids.numel():
        raise ValueError(f"moe_align: {num_pairs} pairs need {cap} slots, the workspace has {buf.sorted_ids.numel()}")
    sorted_ids = buf.sorted_ids[:cap]
    blocks = triton.cdiv(cap, bm)
    expert_ids = buf.expert_ids[:blocks]
    sorted_ids.fill_(num_pairs)
    buf.counts.zero_()
    ids = topk_ids.reshape(-1)
    BLOCK = 256
    grid = (triton.cdiv(num_pairs, BLOCK),)
    _count_kernel[grid](ids, buf.counts, num_pairs, E, BLOCK=BLOCK)
    bb = 64 if E <= 128 else 16
    _offsets_kernel[(triton.cdiv(blocks, bb),)](buf.counts, buf.cursor, expert_ids, buf.total, E, blocks, BLOCK_M=bm,
                                               E_P2=triton.next_power_of_2(E), BLOCK_B=bb)
    _scatter_kernel[grid](ids, buf.cursor, sorted_ids, num_pairs, E, BLOCK=BLOCK)
    return sorted_ids, expert_ids, buf.total
