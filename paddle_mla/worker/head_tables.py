"""Head-wise block-table rows of the runner's persistent host state (head-wise SWA), by deltas.

With head-wise SWA (docs/head_wise_swa.md) the runner's table is int32
``[max_slots, num_kv_heads, max_blocks]``: row (slot, h) is KV head h's row of the slot's sequence,
with the ids the op reads (global ids of one flat cache: ``HeadWisePool.bases`` added) and -1 for
no block. It always equals what ``HeadWisePool.block_tables`` rebuilds from the pools (the tests
compare them at every step of the real scheduler). What changes a request's rows, as the
scheduler reports it each step (sched/output.py ``ScheduledRow``), and what a step then writes:

- ``hold`` appends blocks to the full heads' row and to every SWA row: the new ids only;
- recycling sets SWA entries ``[max(sink_blocks, old dead_below), swa_dead_below)`` to -1 in
  place (the pool keeps every SWA row -1 exactly on ``[sink_blocks, swa_dead_below)``): that range;
- release and preemption drop the request (its rows are cleared); re-admitted, it starts anew.

So a step writes O(new + recycled blocks), not the O(batch x heads x blocks) of a rebuild.
This module imports no tensor library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from paddle_mla.cache.head_pool import HeadWisePool
    from paddle_mla.sched.output import ScheduledRow
    from paddle_mla.worker.input_state import RequestState


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

    def apply(self, r: RequestState, row: ScheduledRow) -> None:
        """``row``: the ids appended to the request's rows since its last step and
        its recycling mark, into ``r``'s (its RequestState's) table rows."""
        t, slot, fs = self.tables, r.slot, self.fs
        ids = row.new_block_ids
        if ids:
            n = r.full_written + len(ids)
            if fs:
                t[slot, :fs, r.full_written:n] = np.asarray(ids, dtype=np.int32)[None] + self.full_bases
                self.written += len(ids) * fs
            r.full_written = n
        swa = row.new_swa_block_ids
        if swa and swa[0]:
            w = r.swa_written
            m = w + len(swa[0])
            new = np.array(swa, dtype=np.int32)
            t[slot, fs:, w:m] = np.where(new >= 0, new + self.swa_bases, -1)
            self.written += new.size
            r.swa_written = m
        dead = row.swa_dead_below
        if dead > r.dead:                                                 # recycled since: -1 in place
            lo, hi = max(self.sink_blocks, r.dead), min(dead, r.swa_written)
            if hi > lo:
                t[slot, fs:, lo:hi] = -1
                self.written += (hi - lo) * (t.shape[1] - fs)
            r.dead = dead
        r.written = max(r.full_written, r.swa_written)
