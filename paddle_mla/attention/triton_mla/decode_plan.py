"""Per-step decode plan, computed on the GPU into preallocated buffers (no host sync).

The decode kernel reads the block table directly (page-granular), so no token-level
``kv_indices`` / ``kv_indptr`` are built. Work is balanced by KV tiles (BLOCK_N tokens), not by
requests: with T tiles in the batch and P stage-1 programs, program p takes the global tiles
[p*Q, (p+1)*Q) with Q = max(cdiv(T, P), min_tiles, cdiv(max tiles of a request, max_splits - 1)),
crossing request boundaries. A request's splits are the programs that touch it, so every split is
non-empty and there are at most max_kv_splits of them. The batch-invariant plan
(``deterministic: true``, ``fixed_tiles``) instead fixes Q and pads each request's span to whole
windows, so its splits follow its own length alone. Written per step:

  num_kv_splits[b]   programs touching request b (1 for a zero-length row, which yields zeros)
  cu_tiles[b]        exclusive prefix sum of the requests' tile counts; cu_tiles[bs] = T
  split_start[b]     exclusive prefix sum of num_kv_splits: request b's splits own the partial rows
                     [split_start[b], split_start[b] + num_kv_splits[b]) of the compact workspace
  tiles_per_prog[0]  Q

A split costs more than its tiles: it writes fp32 partials that the merge reads back (at 64 heads a
split row is 128 KB against a 72 KB key tile of the CUDA op). With ``split_cost`` > 0 the plan
weighs that: it tries Q' = Q + k * max(Q // 128, 1), k < PLAN_SEARCH, and keeps the first of least
Q' * P * 64 + split_cost * (partial rows of Q') (integers: the reference picks the same), where
split_cost is a partial row's write and read in 1/64 key tiles. Sizes whose extra tiles alone cost
more than all of Q's partial rows are not tried (they cannot win; at b=1 that is every one). Uniform
rows then land on whole windows: 64 rows of 64 tiles over 66 programs take Q = 64 (no partials)
instead of 63 (every row split in two, 32 MB of partials at 128 heads).

Compact partials: the programs that touch request b form a contiguous range [first_b, last_b],
and consecutive requests' ranges share at most one program, so sum_b (last_b - first_b) <= P - 1
and the total split count is at most bs + P - 1 (zero-length rows count one each). The partial
workspace therefore has min(max_bs + P, max_bs * max_kv_splits) rows, not max_bs * max_kv_splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import next_pow2


@dataclass
class DecodeWorkspace:
    """Buffers sized once at start-up; every decode call slices them (CUDA-graph safe)."""

    max_bs: int
    num_heads: int
    v_dim: int
    max_kv_splits: int
    programs: int        # most stage-1 programs per head group a plan may use (0: unbounded)
    num_kv_splits: Any   # int32 [max_bs]
    cu_tiles: Any        # int32 [max_bs + 1]
    split_start: Any     # int32 [max_bs + 1]
    tiles_per_prog: Any  # int32 [1]
    partial_out: Any     # fp32 [rows, H, v_dim]; rows = partial_rows(...)
    partial_lse: Any     # fp32 [rows, H, MAX_DV_SPLIT] (log2 domain; one LSE per value-column slice)

    @property
    def block_b(self) -> int:
        return next_pow2(max(self.max_bs + 1, 16))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.num_kv_splits, self.cu_tiles, self.split_start,
                                                           self.tiles_per_prog, self.partial_out, self.partial_lse))


MAX_DV_SPLIT = 4  # value-column slices per (request, head block, split); see decode.DecodeConfig.dv_split
PLAN_SEARCH = 16  # window sizes the split-aware plan tries (module doc)


# most full split windows per request: with Q >= cdiv(tiles, max_splits - 1) a request has at most
# this many splits of Q tiles plus one straddling split. At b=1 more splits only add partials to
# write and merge (h=16: 32 KB of fp32 partials per split against 36 KB of KV per 32-key tile);
# H100, graph replay, b=1, h=16 (BENCHMARKS.md, "MLA decode"): s=4k 25.0 -> 20.9 µs and s=16k
# 44.1 -> 34.7 µs against no cap; 64 is also the small-batch config's one-step merge
MAX_SPLIT_WINDOWS = 64


def split_cap(programs: int) -> int:
    """The per-request split cap: ``min(programs, MAX_SPLIT_WINDOWS) + 1``.

    ``programs + 1`` never binds (Q >= cdiv(T, P) already bounds a request's splits by the P
    programs); 64 windows bind only where one request would spread over more than 64 programs,
    i.e. b=1 (or a few rows) at h=16 with s >= 4k. The compact workspace has max_bs + P rows
    whatever the cap, so the cap is a speed choice: the old cap of 32 made b=1 programs walk 5
    tiles each at s=4k (26 splits, 25.7 µs), no cap gives 128 one-tile splits there (25.0 µs) and
    256 at s=16k, 64 windows give 64 two-tile splits (20.9 µs).
    """
    return min(max(int(programs), 1), MAX_SPLIT_WINDOWS) + 1


def partial_rows(max_bs: int, max_kv_splits: int, programs: int = 0) -> int:
    """Rows of the compact partial workspace: total splits <= bs + P - 1 (module doc), and <= bs * max_splits."""
    bound = max_bs * max_kv_splits
    return min(bound, max_bs + programs) if programs > 0 else bound


def alloc_decode_workspace(max_bs: int, num_heads: int, v_dim: int, max_kv_splits: int,
                           device: str, programs: int = 0) -> DecodeWorkspace:
    """``programs``: the decode config's ``programs`` (stage-1 programs per head group); plans built
    into this workspace must use at most that many. 0 sizes for any program count."""
    if max_kv_splits < 2:
        raise ValueError("max_kv_splits must be >= 2 (a request may straddle two programs)")
    i32, f32 = torch.int32, torch.float32
    rows = partial_rows(max_bs, max_kv_splits, programs)
    return DecodeWorkspace(
        max_bs=max_bs, num_heads=num_heads, v_dim=v_dim, max_kv_splits=max_kv_splits, programs=programs,
        num_kv_splits=torch.ones(max_bs, dtype=i32, device=device),
        cu_tiles=torch.zeros(max_bs + 1, dtype=i32, device=device),
        split_start=torch.zeros(max_bs + 1, dtype=i32, device=device),
        tiles_per_prog=torch.ones(1, dtype=i32, device=device),
        partial_out=torch.empty((rows, num_heads, v_dim), dtype=f32, device=device),
        partial_lse=torch.empty((rows, num_heads, MAX_DV_SPLIT), dtype=f32, device=device),
    )


@triton.jit(do_not_specialize=["bs"])   # per-step value: one compile for all
def _plan_kernel(
    seq_lens, num_splits_out, cu_tiles_out, split_start_out, tiles_per_prog_out,
    bs, programs, split_cost,
    MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_TILES: tl.constexpr, BLOCK_B: tl.constexpr,
    FIXED_TILES: tl.constexpr, SEARCH: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_B)
    valid = offs < bs
    lens = tl.load(seq_lens + offs, mask=valid, other=0)
    tiles = (lens + BLOCK_N - 1) // BLOCK_N
    if FIXED_TILES > 0:
        # batch-invariant: windows of FIXED_TILES tiles from each request's own start (its span
        # padded to whole windows), so where its splits break depends on its length alone
        q = tl.full((), FIXED_TILES, tl.int32)
        span = (tiles + q - 1) // q * q
        start = tl.cumsum(span, axis=0) - span
        total = tl.sum(span, axis=0)
        splits = tl.maximum(span // q, 1)
    else:
        total = tl.sum(tiles, axis=0)
        longest = tl.max(tiles, axis=0)
        q = tl.maximum((total + programs - 1) // programs, MIN_TILES)
        q = tl.maximum(q, (longest + MAX_SPLITS - 2) // (MAX_SPLITS - 1))
        q = tl.maximum(q, 1)
        start = tl.cumsum(tiles, axis=0) - tiles
        if SEARCH > 0:   # the split-aware window size (module doc)
            step = tl.maximum(q // 128, 1)
            n = tl.where(tiles > 0, (start + tiles - 1) // q - start // q + 1, 1)
            rows = tl.sum(tl.where(valid & (n > 1), n, 0), axis=0).to(tl.int64)
            best = q.to(tl.int64) * programs * 64 + rows * split_cost
            # a size costing more tiles than every partial row of Q cannot win: at b=1 none is tried
            k_end = tl.minimum(rows * split_cost // (step * programs * 64) + 1, SEARCH).to(tl.int32)
            best_q = q
            for k in range(1, k_end):
                qk = q + k * step
                n = tl.where(tiles > 0, (start + tiles - 1) // qk - start // qk + 1, 1)
                rows = tl.sum(tl.where(valid & (n > 1), n, 0), axis=0).to(tl.int64)
                cost = qk.to(tl.int64) * programs * 64 + rows * split_cost
                better = cost < best
                best_q = tl.where(better, qk, best_q)
                best = tl.where(better, cost, best)
            q = best_q
        first = start // q
        last = (start + tiles - 1) // q
        splits = tl.where(tiles > 0, last - first + 1, 1)
    tl.store(num_splits_out + offs, splits, mask=valid)
    tl.store(cu_tiles_out + offs, start, mask=valid)
    tl.store(cu_tiles_out + bs, total)
    splits = tl.where(valid, splits, 0)
    tl.store(split_start_out + offs, tl.cumsum(splits, axis=0) - splits, mask=valid)
    tl.store(split_start_out + bs, tl.sum(splits, axis=0))
    tl.store(tiles_per_prog_out, q)


def build_decode_plan(seq_lens_k, bs: int, ws: DecodeWorkspace, block_n: int, target_items: int,
                      min_tiles: int = 1, fixed_tiles: int = 0, split_cost: int = 0) -> None:
    """Fill the plan in ``ws`` from seq_lens_k int32 [>= bs] (device), once per step.

    ``block_n`` and ``target_items`` (= stage-1 programs per head group) come from
    ``decode.decode_config``; the decode call must use the same config.
    ``fixed_tiles`` > 0: the batch-invariant plan (``deterministic: true``): every split is
    ``fixed_tiles`` tiles of its own request (the last one shorter), whatever the batch; the
    workspace must hold ``max_bs * max_kv_splits`` partial rows (``fixed_split_workspace``).
    ``split_cost`` > 0 (the balanced plan only): a partial row's cost in 1/64 key tiles, for the
    split-aware window size (module doc; ``split_cost_of``).
    """
    assert 0 <= bs <= ws.max_bs
    assert ws.programs == 0 or target_items <= ws.programs, "the workspace was sized for fewer programs"
    assert fixed_tiles == 0 or ws.partial_out.shape[0] >= ws.max_bs * ws.max_kv_splits, \
        "the fixed split plan needs max_bs * max_kv_splits partial rows"
    _plan_kernel[(1,)](
        seq_lens_k, ws.num_kv_splits, ws.cu_tiles, ws.split_start, ws.tiles_per_prog,
        bs, max(int(target_items), 1), int(split_cost),
        MAX_SPLITS=ws.max_kv_splits, BLOCK_N=block_n, MIN_TILES=min_tiles, BLOCK_B=ws.block_b,
        FIXED_TILES=int(fixed_tiles), SEARCH=PLAN_SEARCH if split_cost > 0 and not fixed_tiles else 0,
    )


def split_cost_of(heads_per_program: int, v_dim: int, block_n: int, key_dim: int, key_bytes: int = 2) -> int:
    """A partial row's write and read-back (fp32, ``heads_per_program`` x ``v_dim``) in 1/64 of a key
    tile (``block_n`` x ``key_dim`` elements of ``key_bytes``): the plan's ``split_cost``."""
    return max(round(64 * 2 * heads_per_program * v_dim * 4 / (block_n * key_dim * key_bytes)), 1)


def fixed_split_tiles(split_tokens: int, block_n: int) -> int:
    """Tiles per split of the batch-invariant plan: ``split_tokens`` rounded up to whole tiles."""
    return max(-(-int(split_tokens) // block_n), 1)


def fixed_splits(max_len: int, split_tokens: int, block_n: int) -> int:
    """Most splits a request of ``max_len`` keys takes under the batch-invariant plan."""
    return max(-(-max_len // (block_n * fixed_split_tiles(split_tokens, block_n))), 2)


def partial_row_bytes(num_heads: int, v_dim: int) -> int:
    """Bytes of one partial row of a workspace: fp32 outputs and LSEs (``alloc_decode_workspace``)."""
    return num_heads * (v_dim + MAX_DV_SPLIT) * 4


def fixed_split_group_bytes(num_heads: int, v_dim: int, max_len: int, split_tokens: int, block_n: int) -> int:
    """Partial-output bytes one plan row needs under the batch-invariant plan (``fixed_split_workspace``)."""
    return fixed_splits(max_len, split_tokens, block_n) * partial_row_bytes(num_heads, v_dim)


def fixed_split_workspace(max_bs: int, num_heads: int, v_dim: int, max_len: int, split_tokens: int,
                          block_n: int, device: str) -> DecodeWorkspace:
    """The workspace of the batch-invariant plan: every request may take its
    cdiv(max_len, split) splits at once, so partials are max_bs x that (no compact bound)."""
    return alloc_decode_workspace(max_bs, num_heads, v_dim, fixed_splits(max_len, split_tokens, block_n), device,
                                  programs=0)
