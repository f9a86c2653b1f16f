"""Align (token, expert) pairs by expert, each expert's run padded to BLOCK_M, on the device.

No host sync and fixed-size outputs, so it runs inside a CUDA graph. The steps:
  1. count:   a histogram of the expert ids;
  2. offsets: padded counts, their exclusive cumsum (each expert's first slot), the padded total,
              and the expert of every BLOCK_M block;
  3. scatter: each pair takes the next slot of its expert with an atomic increment.
Decode-sized calls run all three, the padding fill included, in one program: there the five launches
of the wide form cost more than their work. Larger calls spread each step over programs (three
kernels after a fill and a zeroing). The bound is the one program's histogram work, pairs x bins
(next power of two of E): measured on an H200 inside CUDA graphs (``benchmarks.kernels.moe_align``),
one program takes 0.32-0.75x the wide form's time up to 1024 pairs at 66 experts (V2-Lite's
routed + shared) and up to 288 at 257 (V3's), and loses past 1536 and 576 pairs; 2^17 takes it to
1024 and 256 pairs there.
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

ONE_PROGRAM_MAX_WORK = 1 << 17     # pairs x histogram bins (module docstring)


def picks_one_program(num_pairs: int, num_experts: int) -> bool:
    """Whether ``moe_align`` runs a call of this size as one program (the module docstring)."""
    return num_pairs * triton.next_power_of_2(num_experts) <= ONE_PROGRAM_MAX_WORK


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: at most min(E, pairs) non-empty experts, each padded by < BLOCK_M."""
    return num_pairs + min(num_experts, num_pairs) * (block_m - 1)


@triton.jit
def _pair_experts(ids_ptr, offs, num_pairs, num_experts):
    """The expert ids of pairs ``offs`` (int32) and which of them this rank aligns."""
    e = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
    return e, (offs < num_pairs) & (e >= 0) & (e < num_experts)


@triton.jit
def _padded_runs(counts, BLOCK_M: tl.constexpr):
    """Per expert: its padded run's end (inclusive cumsum) and length, and the padded total."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    return tl.cumsum(padded, 0), padded, tl.sum(padded, 0)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, num_experts, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    e, ok = _pair_experts(ids_ptr, offs, num_pairs, num_experts)
    tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=ok)


@triton.jit
def _offsets_kernel(counts_ptr, cursor_ptr, expert_ids_ptr, total_ptr, num_experts, max_blocks,
                    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, BLOCK_B: tl.constexpr):
    # every program recomputes the (cheap) padded cumsum and labels its BLOCK_B blocks; program 0
    # also writes each expert's first slot (the scatter cursor) and the padded total
    e = tl.arange(0, E_P2)
    emask = e < num_experts
    end, padded, total = _padded_runs(tl.load(counts_ptr + e, mask=emask, other=0), BLOCK_M)
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
    e, ok = _pair_experts(ids_ptr, offs, num_pairs, num_experts)
    slot = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=ok)
    tl.store(sorted_ptr + slot.to(tl.int64), offs.to(tl.int32), mask=ok)


@triton.jit
def _align_one_program_kernel(ids_ptr, cursor_ptr, sorted_ptr, expert_ids_ptr, total_ptr, num_pairs, num_experts,
                              cap, max_blocks, BLOCK_M: tl.constexpr, E_P2: tl.constexpr, BLOCK: tl.constexpr,
                              BLOCKS_P2: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    counts = tl.zeros([E_P2], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        e, ok = _pair_experts(ids_ptr, start + offs, num_pairs, num_experts)
        counts += tl.histogram(e, E_P2, mask=ok)
    ex = tl.arange(0, E_P2)
    emask = ex < num_experts
    end, padded, total = _padded_runs(counts, BLOCK_M)
    tl.store(cursor_ptr + ex, end - padded, mask=emask)
    tl.store(total_ptr, total)
    for start in range(0, cap, BLOCK):
        s = start + offs
        tl.store(sorted_ptr + s, tl.full([BLOCK], 0, tl.int32) + num_pairs, mask=s < cap)
    # the expert of block b is the number of experts whose padded run ends at or before b * BLOCK_M
    # (as in _offsets_kernel): runs end on block edges, so it is a histogram of the ends' blocks summed
    # up to b, one pass where the wide form compares every block with every expert
    end_block = end // BLOCK_M
    b = tl.arange(0, BLOCKS_P2)
    owner = tl.cumsum(tl.histogram(end_block, BLOCKS_P2, mask=emask & (end_block < BLOCKS_P2)), 0)
    tl.store(expert_ids_ptr + b, tl.where(b * BLOCK_M < total, owner, -1), mask=b < max_blocks)
    # the scatter reads the cursors and overwrites the fill that other threads of this program wrote
    tl.debug_barrier()
    for start in range(0, num_pairs, BLOCK):
        p = start + offs
        e, ok = _pair_experts(ids_ptr, p, num_pairs, num_experts)
        slot = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=ok)
        tl.store(sorted_ptr + slot, p, mask=ok)


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


def moe_align(topk_ids, buf: AlignBuffers, block_m: int, one_program: bool | None = None):
    """topk_ids [M, top_k] int32 (contiguous) -> (sorted_ids, expert_ids, total_padded) views of ``buf``.

    sorted_ids [padded cap] int32: pair ids (token * top_k + k) grouped by expert, padding = M*top_k;
    expert_ids [cap / BLOCK_M] int32: the expert of each block (-1 past the padded total);
    total_padded [1] int32 on the device: the GEMMs skip blocks at or past it.
    ``one_program``: the form (None: ``picks_one_program``'s)."""
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
    ids = topk_ids.reshape(-1)
    E_P2 = triton.next_power_of_2(E)
    if one_program if one_program is not None else picks_one_program(num_pairs, E):
        _align_one_program_kernel[(1,)](ids, buf.cursor, sorted_ids, expert_ids, buf.total, num_pairs, E, cap, blocks,
                                        BLOCK_M=bm, E_P2=E_P2, BLOCK=512, BLOCKS_P2=triton.next_power_of_2(blocks),
                                        num_warps=4)
        return sorted_ids, expert_ids, buf.total
    sorted_ids.fill_(num_pairs)
    buf.counts.zero_()
    BLOCK = 256
    grid = (triton.cdiv(num_pairs, BLOCK),)
    _count_kernel[grid](ids, buf.counts, num_pairs, E, BLOCK=BLOCK)
    bb = 64 if E <= 128 else 16
    _offsets_kernel[(triton.cdiv(blocks, bb),)](buf.counts, buf.cursor, expert_ids, buf.total, E, blocks, BLOCK_M=bm,
                                               E_P2=E_P2, BLOCK_B=bb)
    _scatter_kernel[grid](ids, buf.cursor, sorted_ids, num_pairs, E, BLOCK=BLOCK)
    return sorted_ids, expert_ids, buf.total
