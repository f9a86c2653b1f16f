"""Persistent per-request host state of the runner (``engine.input_state``): token slices without
the whole list, block-table rows updated by deltas, slots recycled, pending tokens located."""

from __future__ import annotations

import numpy as np
import pytest
from test_scheduler import FakeRunner, drive, workload

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.worker.input_state import PENDING, InputState, gather_step, token_slice
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence, Status
from paddle_mla.sched.scheduler import ScheduledSeq, Scheduler


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


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("num_blocks", [200, 14])
def test_incremental_rows_equal_a_full_rebuild_through_the_scheduler(prefix, chunked, num_blocks):
    """Every step of the real scheduler (prefix hits, chunked prefill, preemption and re-admission,
    finished sequences giving up their slots): the delta-updated rows, tokens and per-row columns
    equal what a rebuild from the sequences gives."""
    pool = BlockPool(num_blocks, 4, prefix)
    sched = Scheduler(SchedulerConfig(max_num_seqs=5, max_num_batched_tokens=16 if chunked else 64,
                                      enable_chunked_prefill=chunked),
                      pool, max_model_len=10_000)
    runner = FakeRunner(num_blocks, 4)
    st = InputState(max_slots=5, max_blocks=64)
    for i, p in enumerate(workload(3, n=12)):
        sched.add(seq_waiting(p, i))
    stats = {"steps": 0, "decode_rows": 0}

    def execute(out):
        rows = out.scheduled
        step = gather_step(st, rows)
        width = max([len(s.seq.block_ids) for s in rows] + [1])
        want = np.full((len(rows), width), -1, dtype=np.int32)
        for i, s in enumerate(rows):
            want[i, :len(s.seq.block_ids)] = s.seq.block_ids
        assert step.block_tables.tolist() == want.tolist()
        assert step.token_ids.tolist() == [t for s in rows
                                           for t in s.seq.token_ids()[s.num_cached:s.num_cached + s.num_new]]
        assert step.num_new.tolist() == [s.num_new for s in rows]
        assert step.num_cached.tolist() == [s.num_cached for s in rows]
        assert step.is_prefill.tolist() == [s.is_prefill for s in rows]
        assert step.sample_mask.tolist() == [s.samples for s in rows]
        assert len(set(step.slots.tolist())) == len(rows) and len(step.pending_pos) == 0
        stats["steps"] += 1
        stats["decode_rows"] += sum(not s.is_prefill for s in rows)
        return runner.execute(out)

    drive(sched, execute, max_tokens=9)
    assert stats["decode_rows"] > 20
    if num_blocks == 14:
        assert sched.num_preemptions > 0, "the small pool must preempt"


def seq_waiting(prompt, i) -> Sequence:
    return Sequence(GenerationRequest(i, list(prompt), SamplingParams(max_tokens=9)), i, 0, RequestMetrics(0.0))
