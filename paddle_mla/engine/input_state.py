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

from paddle_mla.engine.request import Sequence, Status

PENDING = -1


def token_slice(seq: Sequence, start: int, end: int) -> list[int]:
    """Tokens [start, end) of prompt + output, without building the whole list."""
    prompt, out = seq.request.prompt_token_ids, seq.output_token_ids
    p = len(prompt)
    if end <= p:
        return prompt[start:end]
    if start >= p:
        return out[start - p:end - p]
    return prompt[start:] + out[:end - p]


def has_pending(seq: Sequence) -> bool:
    out = seq.output_token_ids
    return bool(out) and out[-1] == PENDING


@dataclass
class _Row:
    slot: int
    blocks: list          # the block-id list object written last (a new object means rewrite)
    written: int          # how many of its ids are in the table row


class InputState:
    def __init__(self, max_slots: int, max_blocks: int):
        self.tables = np.full((max_slots, max_blocks), -1, dtype=np.int32)
        self.free = list(range(max_slots - 1, -1, -1))
        self.rows: dict[Sequence, _Row] = {}
        self.blocks_written = 0      # tests: block ids copied into the table (deltas only)

    def _sweep(self, keep: set) -> None:
        """Free the slots of sequences no longer running (finished, failed or preempted)."""
        for seq in [s for s, r in self.rows.items() if s.status is not Status.RUNNING and s not in keep]:
            self.free.append(self.rows.pop(seq).slot)

    def row(self, seq: Sequence, keep: set) -> _Row:
        r = self.rows.get(seq)
        if r is None:
            if not self.free:
                self._sweep(keep)
            if not self.free:
                raise RuntimeError(f"more than {len(self.tables)} sequences in flight")
            r = _Row(self.free.pop(), [], 0)
            self.rows[seq] = r
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
    block_tables: np.ndarray  # int32 [B, width]
    is_prefill: np.ndarray    # bool [B]
    sample_mask: np.ndarray   # bool [B]
    slots: np.ndarray         # int64 [B]
    pending_pos: np.ndarray   # int64 [P]: token indices whose id is the slot's last sampled token
    pending_slot: np.ndarray  # int64 [P]


def gather_step(state: InputState, scheduled) -> HostStep:
    """``scheduled``: the SchedulerOutput rows. Updates the block-table rows by deltas."""
    b = len(scheduled)
    keep = {s.seq for s in scheduled}
    num_new = np.empty(b, np.int32)
    num_cached = np.empty(b, np.int32)
    is_prefill = np.empty(b, bool)
    sample_mask = np.empty(b, bool)
    slots = np.empty(b, np.int64)
    tokens: list[int] = []
    pending_pos, pending_slot = [], []
    width = 1
    for i, s in enumerate(scheduled):
        seq = s.seq
        r = state.row(seq, keep)
        slots[i] = r.slot
        num_new[i], num_cached[i] = s.num_new, s.num_cached
        is_prefill[i], sample_mask[i] = s.is_prefill, s.samples
        width = max(width, r.written)
        if s.num_new == 1:       # decode: one token, by index
            prompt, c = seq.request.prompt_token_ids, s.num_cached
            ids = [prompt[c] if c < len(prompt) else seq.output_token_ids[c - len(prompt)]]
        else:
            ids = token_slice(seq, s.num_cached, s.num_cached + s.num_new)
        if ids[-1] == PENDING:       # only ever the last token of a sequence, sampled by the running step
            pending_pos.append(len(tokens) + len(ids) - 1)
            pending_slot.append(r.slot)
        tokens.extend(ids)
    return HostStep(
        token_ids=np.array(tokens, dtype=np.int64), num_new=num_new, num_cached=num_cached,
        block_tables=state.tables[slots, :width], is_prefill=is_prefill, sample_mask=sample_mask, slots=slots,
        pending_pos=np.array(pending_pos, dtype=np.int64), pending_slot=np.array(pending_slot, dtype=np.int64))
