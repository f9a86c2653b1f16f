"""``Scheduler.update_from_output``: the step's sampled tokens appended (or a PENDING one resolved),
rows finished by stop id (from min_tokens on) or by length, blocks freed, stop-string rows handed
on; and ``on_launch``, the overlapped half that counts a step's tokens before they are read."""

from __future__ import annotations

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.request import PENDING, GenerationRequest, RequestMetrics, SamplingParams, Sequence, Status
from paddle_mla.sched.scheduler import Scheduler


def setup(*params: SamplingParams, prompt_len: int = 5):
    pool = BlockPool(64, 4, False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), pool, max_model_len=1000)
    seqs = [Sequence(request=GenerationRequest(id=i, prompt_token_ids=list(range(1, prompt_len + 1)), params=p),
                     index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0)) for i, p in enumerate(params)]
    sched.add(*seqs)
    return sched, pool, seqs


def test_stop_ids_from_min_tokens_and_length():
    sched, pool, (eos, early, length, plain) = setup(
        SamplingParams(max_tokens=9, stop_token_ids=[7]),
        SamplingParams(max_tokens=9, stop_token_ids=[7], min_tokens=2),
        SamplingParams(max_tokens=1), SamplingParams(max_tokens=9))
    out = sched.schedule()
    assert [s.samples for s in out.scheduled] == [True] * 4
    update = sched.update_from_output(out, [7, 7, 3, 7])
    assert update.sampled_rows == [0, 1, 2, 3]
    assert update.finished == [eos, length] and update.stop_string_rows == []
    assert (eos.finish_reason, length.finish_reason) == ("stop", "length")
    assert eos.status is length.status is Status.FINISHED and not eos.block_ids
    assert early.status is plain.status is Status.RUNNING and early.output_token_ids == [7]
    assert early.num_computed_tokens == 5
    out = sched.schedule()
    update = sched.update_from_output(out, [7, 7])      # early reached min_tokens: 7 now stops it
    assert update.finished == [early] and early.finish_reason == "stop" and early.output_token_ids == [7, 7]
    assert plain.status is Status.RUNNING and plain.output_token_ids == [7, 7]
    sched.finish(plain)
    assert pool.num_free == pool.num_blocks


def test_stop_string_rows_are_handed_on():
    sched, _, (running, at_length, stopped) = setup(
        SamplingParams(max_tokens=9, stop=["x"]), SamplingParams(max_tokens=1, stop=["x"]),
        SamplingParams(max_tokens=9, stop=["x"], stop_token_ids=[4]))
    out = sched.schedule()
    update = sched.update_from_output(out, [3, 3, 4])
    # a stop id wins over the strings; a row at its length is finished and still checked (a string wins)
    assert update.stop_string_rows == [(running, 3), (at_length, 3)]
    assert update.finished == [at_length, stopped]
    assert running.status is Status.RUNNING and at_length.finish_reason == "length"


def test_on_launch_counts_tokens_and_holds_pending():
    sched, _, (a, b) = setup(SamplingParams(max_tokens=2), SamplingParams(max_tokens=5))
    first = sched.schedule()
    sched.on_launch(first)
    assert a.output_token_ids == b.output_token_ids == [PENDING] and a.num_computed_tokens == 5
    second = sched.schedule()          # decodes of the PENDING tokens, scheduled before the first read
    assert [s.num_new for s in second.scheduled] == [1, 1]
    update = sched.update_from_output(first, [11, 12])
    assert a.output_token_ids == [11] and b.output_token_ids == [12] and update.finished == []
    sched.on_launch(second)
    third = sched.schedule()
    update = sched.update_from_output(second, [13, 14])
    assert update.finished == [a] and a.output_token_ids == [11, 13] and a.finish_reason == "length"
    sched.on_launch(third)             # a finished meanwhile: its row of the third step is discarded
    assert a.output_token_ids == [11, 13] and b.output_token_ids == [12, 14, PENDING]
    update = sched.update_from_output(third, [99, 15])
    assert update.sampled_rows == [1] and b.output_token_ids == [12, 14, 15] and a.output_token_ids == [11, 13]
