"""``Scheduler.step_input``: what the runner receives is plain data and only the change since the
request's last step: a new request once (again, with its tokens so far, after a preemption), then
per row the block ids appended and this step's tokens; dropped requests by id."""

from __future__ import annotations

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence
from paddle_mla.sched.scheduler import Scheduler


def make(num_blocks=64, prompts=([1, 2, 3],), max_tokens=8):
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), BlockPool(num_blocks, 2, False),
                      max_model_len=1000)
    seqs = [Sequence(GenerationRequest(i, list(p), SamplingParams(max_tokens=max_tokens)), i, 7, RequestMetrics(0.0))
            for i, p in enumerate(prompts)]
    sched.add(*seqs)
    return sched, seqs


def step(sched, tokens):
    out = sched.schedule()
    msg = sched.step_input(out)
    sched.update_from_output(out, tokens[:len(out.scheduled)])
    return msg


def test_new_request_once_then_deltas():
    sched, (a,) = make()
    msg = step(sched, [5])
    assert [(n.req_id, n.prompt_token_ids, n.output_token_ids, n.seed) for n in msg.new] == \
        [(a.seq_id, [1, 2, 3], [], 7)]
    row = msg.scheduled[0]
    assert (row.req_id, row.num_new, row.num_cached, row.token_ids, row.new_block_ids) == (a.seq_id, 3, 0, [1, 2, 3],
                                                                                        a.block_ids)
    msg = step(sched, [6])           # position 3 still fits the 2nd block of 2: no block ids
    assert msg.new == [] and msg.gone == []
    assert [(r.num_new, r.num_cached, r.token_ids, r.new_block_ids) for r in msg.scheduled] == [(1, 3, [5], [])]
    msg = step(sched, [7])           # position 4 starts a 3rd block: only its id
    assert msg.scheduled[0].new_block_ids == a.block_ids[2:] and len(a.block_ids) == 3
    sched.finish(a)
    assert sched.step_input(sched.schedule()).gone == [a.seq_id]


def test_preempted_request_comes_back_new_with_its_tokens():
    sched, (a, b) = make(num_blocks=4, prompts=([1, 2, 3], [4, 5, 6]))
    step(sched, [10, 20])
    step(sched, [11, 21])
    msg = step(sched, [12])           # a needs a 3rd block: b is preempted, the runner drops it now
    assert sched.num_preemptions == 1 and [r.req_id for r in msg.scheduled] == [a.seq_id]
    assert msg.gone == [b.seq_id] and msg.new == []
    sched.finish(a)
    msg = step(sched, [22])
    assert msg.gone == [a.seq_id]
    assert [(n.req_id, n.output_token_ids) for n in msg.new] == [(b.seq_id, [20, 21])]
    row = msg.scheduled[0]
    assert row.token_ids == [4, 5, 6, 20, 21] and row.num_cached == 0 and row.new_block_ids == b.block_ids
