"""Persistent per-request host state of the runner (``engine.input_state``): token slices without
the whole list, block-table rows updated by deltas, slots recycled, pending tokens located."""

from __future__ import annotations

import numpy as np

from paddle_mla.engine.input_state import PENDING, InputState, gather_step, token_slice
from paddle_mla.engine.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence, Status
from paddle_mla.engine.scheduler import ScheduledSeq


def seq(prompt, out=(), blocks=(), i=0) -> Sequence:
    s = Sequence(GenerationRequest(i, list(prompt), SamplingParams()), i, 0, RequestMetrics(0.0))
    s.output_token_ids, s.block_ids, s.status = list(out), list(blocks), Status.RUNNING
    return s


def test_token_slice_matches_the_whole_list():
    s = seq(range(10, 17), out=[1, 2, 3])
    whole = s.token_ids()
    for a in range(len(whole) + 1):
        for b in range(a, len(whole) + 1):
            assert token_slice(s, a, b) == whole[a:b]


def test_block_rows_by_deltas_and_rewrite():
    st = InputState(max_slots=2, max_blocks=6)
    a = seq(range(8), blocks=[4, 5])
    gather_step(st, [ScheduledSeq(a, 8, 0, True, True)])
    assert st.blocks_written == 2
    a.output_token_ids.append(11)
    a.block_ids.append(9)                     # grown in place: only the new id is written
    step = gather_step(st, [ScheduledSeq(a, 1, 8, False, True)])
    assert step.token_ids.tolist() == [11]
    assert st.blocks_written == 3 and step.block_tables.tolist() == [[4, 5, 9]]
    a.block_ids = [7]                         # preempted and re-admitted: a new list, row rewritten
    step = gather_step(st, [ScheduledSeq(a, 3, 0, True, False)])
    assert step.block_tables.tolist() == [[7]] and st.tables[st.rows[a].slot].tolist() == [7, -1, -1, -1, -1, -1]


def test_slots_recycled_and_pending_tokens_located():
    st = InputState(max_slots=2, max_blocks=4)
    a, b = seq([3, 4], out=[5], blocks=[0], i=0), seq([6], out=[7, PENDING], blocks=[1], i=1)
    step = gather_step(st, [ScheduledSeq(a, 1, 2, False, True), ScheduledSeq(b, 1, 2, False, True)])
    assert step.token_ids.tolist() == [5, PENDING]
    assert step.pending_pos.tolist() == [1] and step.pending_slot.tolist() == [st.rows[b].slot]
    a.status = Status.FINISHED
    c = seq([8, 9], blocks=[2, 3], i=2)
    step = gather_step(st, [ScheduledSeq(c, 2, 0, True, True)])    # takes a's slot
    assert a not in st.rows and {st.rows[b].slot, st.rows[c].slot} == {0, 1}
    assert step.block_tables.tolist() == [[2, 3]] and step.slots.dtype == np.int64
