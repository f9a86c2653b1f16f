"""Per-request host state of the model runner, kept across steps and updated by deltas.

Each running sequence owns a row ("slot") of a persistent host block table. A step writes only
the block ids appended since the sequence's last step (a preemption or re-admission gives the
sequence a new block list, and its row is rewritten once). The new tokens of a step are sliced
from the prompt or the output list directly, never from the concatenated ``token_ids()``, so the
host work of a step is O(batch + new tokens), not O(context). The slot also indexes the device
buffer of each sequence's last sampled token, which overlapped scheduling reads on the device.

A pending token (overlapped scheduling: sampled by the step still running on the GPU) is held on
the host as ``PENDING`` (-1) until its step's read; the runner fills it on the device.
This module imports no tensor library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.sched.request import PENDING, Sequence, Status, has_pending, token_slice  # noqa: F401

@dataclass
class _Row:
    slot: int
    blocks: list          # the block-id list object written last (a new object means rewrite)
    written: int          # how many of its ids are in the table row (head-wise: logical blocks)
    # head-wise tables only (head_tables.HeadRows): ids written of the full heads' row and of the
    # SWA rows, the SWA rows' list object and the recycling mark written
    full_written: int = 0
    swa: list | None = None
    swa_written: int = 0
    dead: int = 0


class InputState:
    def __init__(self, max_slots: int, max_blocks: int, head_wise_pool=None):
        """``head_wise_pool``: a HeadWisePool: the table is then [max_slots, num_kv_heads,
        max_blocks], each KV head's rows kept by deltas (head_tables.HeadRows)."""
        self.heads = None
        if head_wise_pool is None:
            self.tables = np.full((max_slots, max_blocks), -1, dtype=np.int32)
        else:
            from paddle_mla.worker.head_tables import HeadRows

            self.tables = np.full((max_slots, head_wise_pool.spec.num_kv_heads, max_blocks), -1, dtype=np.int32)
            self.heads = HeadRows(self.tables, head_wise_pool)
        self.free = list(range(max_slots - 1, -1, -1))
        self.rows: dict[Sequence, _Row] = {}
        self.blocks_written = 0      # tests: block ids copied into the table (deltas only)

    def _sweep(self, scheduled) -> None:
        """Free the slots of sequences no longer running (finished, failed or preempted) and not
        in this step (``scheduled``: its rows)."""
        keep = {s.seq for s in scheduled}
        for seq in [s for s, r in self.rows.items() if s.status is not Status.RUNNING and s not in keep]:
            r = self.rows.pop(seq)
            self.tables[r.slot, ..., :r.written] = -1    # the next owner's row is -1 padded past its blocks
            self.free.append(r.slot)

    def row(self, seq: Sequence, scheduled) -> _Row:
        r = self.rows.get(seq)
        if r is None:
            if not self.free:
                self._sweep(scheduled)
            if not self.free:
                raise RuntimeError(f"more than {len(self.tables)} sequences in flight")
            r = _Row(self.free.pop(), [], 0)
            self.rows[seq] = r
        if self.heads is not None:
            self.heads.update(r, seq)
            return r
        blocks = seq.block_ids
        if r.blocks is not blocks or len(blocks) < r.written:
            self.tables[r.slot, :r.written] = -1
            r.blocks, r.written = blocks, 0
        n = len(blocks)
        if n > r.written:
            self.tables[r.slot, r.written:n] = blocks[r.written:n]
            self.blocks_written += n - r.written
            r.written = n
        return r


@dataclass
class HostStep:
    """The host arrays of one step, gathered from the persistent state (scheduler row order)."""

    token_ids: np.ndarray     # int64 [T], PENDING where the token comes from the device
    num_new: np.ndarray       # int32 [B]
    num_cached: np.ndarray    # int32 [B]
    block_tables: np.ndarray  # int32 [B, width], or [B, num_kv_heads, width] (head-wise)
    is_prefill: np.ndarray    # bool [B]
    sample_mask: np.ndarray   # bool [B]
    slots: np.ndarray         # int64 [B]
    pending_pos: np.ndarray   # int64 [P]: token indices whose id is the slot's last sampled token
    pending_slot: np.ndarray  # int64 [P]


def gather_step(state: InputState, scheduled) -> HostStep:
    """``scheduled``: the SchedulerOutput rows. Updates the block-table rows by deltas. The per-row
    values go into Python lists and become arrays once (a numpy item write per row costs more); the
    row loop touches only what differs per row kind (a steady decode row: one dict lookup, three
    identity/length checks and one token read), the plain columns are list comprehensions."""
    slots, tokens = [], []
    add_slot, add_token = slots.append, tokens.append
    width = 1
    rows_get, row, heads = state.rows.get, state.row, state.heads
    for s in scheduled:
        seq = s.seq
        r = rows_get(seq)
        if heads is None:
            blocks = seq.block_ids
            if r is None or r.blocks is not blocks or r.written != len(blocks):   # else: the row is current
                r = row(seq, scheduled)
        elif r is None or not heads.current(r, seq):
            r = row(seq, scheduled)
        add_slot(r.slot)
        if r.written > width:
            width = r.written
        c = s.num_cached
        if s.num_new == 1:       # decode: one token, by index
            prompt = seq.request.prompt_token_ids
            add_token(prompt[c] if c < len(prompt) else seq.output_token_ids[c - len(prompt)])
        else:
            tokens.extend(token_slice(seq, c, c + s.num_new))
    slots = np.array(slots, dtype=np.int64)
    token_ids = np.array(tokens, dtype=np.int64)
    num_new = np.array([s.num_new for s in scheduled], dtype=np.int32)
    # a PENDING token is only ever the last token of a row (sampled by the step still running):
    # found in the array, its row by the rows' token ends
    pending_pos = np.flatnonzero(token_ids == PENDING)
    pending_rows = np.searchsorted(np.cumsum(num_new), pending_pos, side="right")
    return HostStep(
        token_ids=token_ids, num_new=num_new,
        num_cached=np.array([s.num_cached for s in scheduled], dtype=np.int32),
        block_tables=state.tables[slots, ..., :width],
        is_prefill=np.array([s.is_prefill for s in scheduled], dtype=bool),
        sample_mask=np.array([s.samples for s in scheduled], dtype=bool), slots=slots,
        pending_pos=pending_pos.astype(np.int64, copy=False), pending_slot=slots[pending_rows])
