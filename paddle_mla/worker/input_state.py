"""The runner's persistent input batch: per-request host state keyed by request id, kept across
steps and changed only by the scheduler's plain-data messages (sched/output.py).

Each request the runner holds owns a row ("slot") of a persistent host block table. A step writes
only the block ids the scheduler reports as appended since the request's last step (a new request,
also one re-admitted after a preemption, starts on a cleared row), so the host work of a step is
O(batch + new tokens + new blocks), not O(context). The slot also indexes the device buffer of each
request's last sampled token, which overlapped scheduling reads on the device.

A pending token (overlapped scheduling: sampled by the step still running on the GPU) comes as
``PENDING`` (-1); the runner fills it on the device. This module imports no tensor library.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paddle_mla.sched.output import NewRequest, StepInput
from paddle_mla.sched.request import PENDING, SamplingParams


@dataclass(eq=False)     # compared by identity (the sampling builder reuses a step's rows)
class RequestState:
    """The runner's copy of one request: what sampling reads (params, seed, the tokens computed so
    far) and what its table row holds."""

    slot: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    seed: int
    written: int = 0          # block ids in the table row (head-wise: logical blocks, the longest row)
    # head-wise tables only (head_tables.HeadRows): ids written of the full heads' row and of the
    # SWA rows, and the recycling mark written
    full_written: int = 0
    swa_written: int = 0
    dead: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


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
    requests: list[RequestState] = field(default_factory=list)   # per row

    @property
    def prompt_lens(self) -> np.ndarray:
        """int32 [B]: where each row's outputs begin (read only where prompts are kept apart)."""
        return np.fromiter((r.prompt_len for r in self.requests), np.int32, len(self.requests))


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
        self.requests: dict[int, RequestState] = {}
        self.blocks_written = 0      # tests: block ids copied into the table (deltas only)

    def _drop(self, req_id: int) -> None:
        r = self.requests.pop(req_id, None)
        if r is not None:
            self.tables[r.slot, ..., :r.written] = -1    # the next owner's row is -1 padded past its blocks
            self.free.append(r.slot)

    def _add(self, new: NewRequest) -> None:
        self._drop(new.req_id)
        if not self.free:
            raise RuntimeError(f"more than {len(self.tables)} requests in flight")
        self.requests[new.req_id] = RequestState(self.free.pop(), new.prompt_token_ids, list(new.output_token_ids),
                                                 new.params, new.seed)

    def apply(self, msg: StepInput) -> HostStep:
        """Apply the scheduler's changes (dropped requests, new ones, each row's appended block ids
        and tokens) and gather the step's host arrays. The per-row values go into Python lists and
        become arrays once (a numpy item write per row costs more); a steady decode row costs one
        dict lookup and one token append."""
        for req_id in msg.gone:
            self._drop(req_id)
        for new in msg.new:
            self._add(new)
        rows = msg.scheduled
        reqs = [self.requests[row.req_id] for row in rows]
        slots, tokens = [], []
        add_slot = slots.append
        tables, heads = self.tables, self.heads
        width = 1
        for row, r in zip(rows, reqs):
            toks = row.token_ids
            # the request's tokens so far (sampling counts them): this step's go at [c, c + n)
            end = row.num_cached + len(toks) - r.prompt_len     # their end in the output list
            if end > 0:
                out = r.output_token_ids
                lo = max(end - len(toks), 0)
                if lo == len(out) and len(toks) == 1:
                    out.append(toks[0])
                else:
                    out[lo:end] = toks[len(toks) - (end - lo):]
            tokens.extend(toks)
            if heads is not None:
                heads.apply(r, row)
            elif row.new_block_ids:
                ids, w = row.new_block_ids, r.written
                tables[r.slot, w:w + len(ids)] = ids
                self.blocks_written += len(ids)
                r.written = w + len(ids)
            add_slot(r.slot)
            if r.written > width:
                width = r.written
        slots = np.array(slots, dtype=np.int64)
        token_ids = np.array(tokens, dtype=np.int64)
        num_new = np.array([row.num_new for row in rows], dtype=np.int32)
        # a PENDING token is only ever the last token of a row (sampled by the step still running):
        # found in the array, its row by the rows' token ends
        pending_pos = np.flatnonzero(token_ids == PENDING)
        pending_rows = np.searchsorted(np.cumsum(num_new), pending_pos, side="right")
        return HostStep(
            token_ids=token_ids, num_new=num_new,
            num_cached=np.array([row.num_cached for row in rows], dtype=np.int32),
            block_tables=tables[slots, ..., :width],
            is_prefill=np.array([row.is_prefill for row in rows], dtype=bool),
            sample_mask=np.array([row.samples for row in rows], dtype=bool), slots=slots,
            pending_pos=pending_pos.astype(np.int64, copy=False), pending_slot=slots[pending_rows], requests=reqs)
