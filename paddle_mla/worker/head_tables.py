"""Head-wise block-table rows of the runner's persistent host state (head-wise SWA), by deltas.

With head-wise SWA (docs/head_wise_swa.md) the runner's table is int32
``[max_slots, num_kv_heads, max_blocks]``: row (slot, h) is KV head h's row of the slot's sequence,
with the ids the op reads (global ids of one flat cache: ``HeadWisePool.bases`` added) and -1 for
no block. It always equals what ``HeadWisePool.block_tables`` rebuilds from the pools (the tests
compare them at every step of the real scheduler). What changes a sequence's rows, and what a step
then writes:

- ``hold`` appends blocks to the full heads' row (``seq.block_ids``) and to every SWA row
  (``seq.swa_block_ids``): the new ids only;
- recycling sets SWA entries ``[max(sink_blocks, old dead_below), seq.swa_dead_below)`` to -1 in
  place (the pool keeps every SWA row -1 exactly on ``[sink_blocks, swa_dead_below)``): that range;
- release, preemption and a prefix hit replace the lists (new objects): the rows are rewritten once.

So a step writes O(new + recycled blocks), not the O(batch x heads x blocks) of a rebuild.
This module imports no tensor library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from paddle_mla.cache.head_pool import HeadWisePool
    from paddle_mla.sched.request import Sequence


class HeadRows:
    def __init__(self, tables: np.ndarray, pool: HeadWisePool):
        spec = pool.spec
        self.tables = tables
        self.fs = spec.first_swa_head
        self.sink_blocks = spec.sink_blocks(pool.block_size)
        bases = pool.bases if pool.bases is not None else np.zeros(spec.num_kv_heads, dtype=np.int32)
        self.full_bases = bases[:self.fs, None].astype(np.int32)
        self.swa_bases = bases[self.fs:, None].astype(np.int32)
        self.written = 0     # tests: entries written (deltas only)

    @staticmethod
    def current(r, seq: Sequence) -> bool:
        """Whether ``r`` (the sequence's _Row) already holds its rows."""
        swa = seq.swa_block_ids
        return (r.blocks is seq.block_ids and r.full_written == len(seq.block_ids) and r.swa is swa
                and r.swa_written == (len(swa[0]) if swa else 0) and r.dead == seq.swa_dead_below)

    def update(self, r, seq: Sequence) -> None:
        t, slot, fs = self.tables, r.slot, self.fs
        blocks = seq.block_ids
        if r.blocks is not blocks or len(blocks) < r.full_written:     # a new list: rewrite
            t[slot, :fs, :r.full_written] = -1
            r.blocks, r.full_written = blocks, 0
        n = len(blocks)
        if n > r.full_written and fs:
            ids = np.asarray(blocks[r.full_written:n], dtype=np.int32)
            t[slot, :fs, r.full_written:n] = ids[None] + self.full_bases
            self.written += (n - r.full_written) * fs
        r.full_written = n
        rows = seq.swa_block_ids
        if r.swa is not rows:                                             # a new list: rewrite
            t[slot, fs:, :r.swa_written] = -1
            r.swa, r.swa_written, r.dead = rows, 0, 0
        m = len(rows[0]) if rows else 0
        if m > r.swa_written:
            w = r.swa_written
            ids = np.array([row[w:m] for row in rows], dtype=np.int32)
            t[slot, fs:, w:m] = np.where(ids >= 0, ids + self.swa_bases, -1)
            self.written += ids.size
            r.swa_written = m
        dead = seq.swa_dead_below
        if dead > r.dead:                                                 # recycled since: -1 in place
            lo, hi = max(self.sink_blocks, r.dead), min(dead, r.swa_written)
            if hi > lo:
                t[slot, fs:, lo:hi] = -1
                self.written += (hi - lo) * (t.shape[1] - fs)
            r.dead = dead
        r.written = max(n, m)
