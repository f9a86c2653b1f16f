"""The runner's persistent input batch (``worker.input_state``), changed only by the scheduler's
plain-data messages (``sched.output``): block-table rows by deltas, slots recycled when a request
is dropped, the request's tokens kept for sampling, pending tokens located; and the messages hold
no live ``Sequence``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from test_scheduler import FakeRunner, drive, workload

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.output import NewRequest, ScheduledRow, StepInput
from paddle_mla.sched.request import PENDING, GenerationRequest, RequestMetrics, SamplingParams, Sequence, token_slice
from paddle_mla.sched.scheduler import Scheduler
from paddle_mla.worker.input_state import InputState


def test_token_slice_matches_the_whole_list():
    s = Sequence(GenerationRequest(0, list(range(10, 17)), SamplingParams()), 0, 0, RequestMetrics(0.0))
    s.output_token_ids = [1, 2, 3]
    whole = s.token_ids()
    for a in range(len(whole) + 1):
        for b in range(a, len(whole) + 1):
            assert token_slice(s, a, b) == whole[a:b]


def new(req_id, prompt, out=()):
    return NewRequest(req_id, list(prompt), list(out), SamplingParams(), seed=0)


def test_block_rows_by_deltas_and_rewrite():
    st = InputState(max_slots=2, max_blocks=6)
    st.apply(StepInput(new=[new(0, range(8))], scheduled=[ScheduledRow(0, 8, 0, True, True, list(range(8)), [4, 5])]))
    assert st.blocks_written == 2
    step = st.apply(StepInput(scheduled=[ScheduledRow(0, 1, 8, False, True, [11], [9])]))   # one new id
    assert step.token_ids.tolist() == [11]
    assert st.blocks_written == 3 and step.block_tables.tolist() == [[4, 5, 9]]
    assert step.requests[0].output_token_ids == [11] and step.requests[0].token_ids() == list(range(8)) + [11]
    # preempted and re-admitted: dropped, then new again with its output so far; the row starts over
    step = st.apply(StepInput(new=[new(0, range(8), [11])], gone=[0],
                              scheduled=[ScheduledRow(0, 3, 0, True, False, [0, 1, 2], [7])]))
    slot = step.slots[0]
    assert step.block_tables.tolist() == [[7]] and st.tables[slot].tolist() == [7, -1, -1, -1, -1, -1]
    assert step.requests[0].output_token_ids == [11]


def test_slots_recycled_and_pending_tokens_located():
    st = InputState(max_slots=2, max_blocks=4)
    st.apply(StepInput(new=[new(0, [3, 4], [5]), new(1, [6], [7])],
                       scheduled=[ScheduledRow(0, 3, 0, True, False, [3, 4, 5], [0]),
                                  ScheduledRow(1, 2, 0, True, True, [6, 7], [1])]))
    step = st.apply(StepInput(scheduled=[ScheduledRow(1, 1, 2, False, True, [PENDING], [])]))
    assert step.token_ids.tolist() == [PENDING]
    assert step.pending_pos.tolist() == [0] and step.pending_slot.tolist() == [st.requests[1].slot]
    step = st.apply(StepInput(new=[new(2, [8, 9])], scheduled=[ScheduledRow(2, 2, 0, True, True, [8, 9], [2, 3])],
                              gone=[0]))    # 2 takes 0's slot
    assert 0 not in st.requests and {st.requests[1].slot, st.requests[2].slot} == {0, 1}
    assert step.block_tables.tolist() == [[2, 3]] and step.slots.dtype == np.int64
    with pytest.raises(RuntimeError, match="in flight"):
        st.apply(StepInput(new=[new(3, [1])], scheduled=[ScheduledRow(3, 1, 0, True, True, [1], [4])]))


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("num_blocks", [200, 14])
def test_incremental_rows_equal_a_full_rebuild_through_the_scheduler(prefix, chunked, num_blocks):
    """Every step of the real scheduler (prefix hits, chunked prefill, preemption and re-admission,
    finished sequences giving up their slots): the rows, tokens and per-row columns the runner
    builds from the plain messages equal what a rebuild from the live sequences gives, and each
    sampling row's request holds the sequence's tokens."""
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
        msg = sched.step_input(out)
        assert b"Sequence" not in pickle.dumps(msg)     # plain data: what a tensor-parallel worker receives
        step = st.apply(msg)
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
        for s, r in zip(rows, step.requests):
            if s.samples:
                assert r.token_ids() == s.seq.token_ids() and r.params is s.seq.params and r.seed == s.seq.seed
        assert len(st.requests) <= 5
        stats["steps"] += 1
        stats["decode_rows"] += sum(not s.is_prefill for s in rows)
        return runner.execute(out)

    drive(sched, execute, max_tokens=9)
    assert stats["decode_rows"] > 20
    if num_blocks == 14:
        assert sched.num_preemptions > 0, "the small pool must preempt"


def seq_waiting(prompt, i) -> Sequence:
    return Sequence(GenerationRequest(i, list(prompt), SamplingParams(max_tokens=9)), i, 0, RequestMetrics(0.0))
