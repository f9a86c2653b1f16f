"""``prompt_apart``: a backend that computes prompt and output tokens on different paths
(``triton_mla`` under ``deterministic: true``) needs the scheduler to keep every row on one side of
its prompt's end and the rows of output tokens first, and the prefix cache to keep blocks that hold
outputs from matching another request's prompt."""

from __future__ import annotations

import pytest

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence
from paddle_mla.sched.scheduler import Scheduler

from helpers.scheduler_fakes import FakeRunner, drive
from test_scheduler import workload


def _seq(i, prompt, max_tokens):
    req = GenerationRequest(id=i, prompt_token_ids=list(prompt), params=SamplingParams(max_tokens=max_tokens))
    return Sequence(request=req, index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0))


def _run(prompts, num_blocks, prefix, chunked, budget, apart):
    pool = BlockPool(num_blocks, 4, prefix, outputs_apart=apart)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=chunked),
                      pool, max_model_len=10_000, prompt_apart=apart)
    runner = FakeRunner(num_blocks, 4)
    seqs = [_seq(i, p, 6) for i, p in enumerate(prompts)]
    sched.add(*seqs)
    rows = []
    drive(sched, runner.execute, 6, after_step=lambda out: rows.append(
        [(s.num_cached, s.num_new, s.seq.prompt_len) for s in out.scheduled]))
    assert pool.num_free == pool.num_blocks
    return [s.output_token_ids for s in seqs], sched, rows


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_rows_stay_on_one_side_of_the_prompt_end(prefix, chunked):
    preempted = recomputed = 0
    for seed in range(6):
        prompts = workload(seed)
        base, _, _ = _run(prompts, 200, False, False, 64, apart=False)
        got, sched, steps = _run(prompts, 14, prefix, chunked, 7 if chunked else 64, apart=True)
        assert got == base
        preempted += sched.num_preemptions
        for rows in steps:
            outputs = [c >= p for c, n, p in rows]
            assert outputs == sorted(outputs, reverse=True), "a prompt row before a row of output tokens"
            assert not any(c < p < c + n for c, n, p in rows), "a row crosses its prompt's end"
            recomputed += sum(c >= p and n > 1 for c, n, p in rows)
    # the small pool preempts, and some re-admitted request recomputes several outputs in one row
    assert preempted > 0 and recomputed > 0


def test_output_blocks_never_match_a_prompt():
    pool = BlockPool(32, 4, True, outputs_apart=True)
    prompt = [1, 2, 3, 4, 5, 6]
    tokens = prompt + [7, 8, 9, 10, 11]            # 6 prompt tokens, then 5 outputs
    keys = []
    blocks = pool.allocate(3)
    pool.register_full_blocks(tokens, blocks, len(tokens), keys, 0, prompt_len=len(prompt))
    # the same tokens as another request's prompt: only block 0 (positions 0-3, all prompt) matches
    hits = pool.match_prefix(tokens + [12], [], prompt_len=len(tokens) + 1)
    assert hits == blocks[:1]
    pool.release(hits)
    # the request itself, re-admitted after a preemption: its output blocks match too
    hits = pool.match_prefix(tokens + [12], [], prompt_len=len(prompt))
    assert hits == blocks[:2]
    pool.release(hits)
    # without the flag, the prompt matches both blocks (the default engine's behaviour)
    plain = BlockPool(32, 4, True)
    blocks = plain.allocate(3)
    plain.register_full_blocks(tokens, blocks, len(tokens), [], 0, prompt_len=len(prompt))
    assert plain.match_prefix(tokens + [12], [], prompt_len=len(tokens) + 1) == blocks[:2]


def test_output_mark_holds_where_the_prompt_ends():
    """A 5-token prompt and a 6-token prompt that repeats the first request's first output: block 1
    (positions 4-7) holds output positions from 5 for one and from 6 for the other, so its KV was
    computed on different paths for position 5: no match across them."""
    pool = BlockPool(32, 4, True, outputs_apart=True)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    blocks = pool.allocate(2)
    pool.register_full_blocks(tokens, blocks, 8, [], 0, prompt_len=5)
    hits = pool.match_prefix(tokens, [], prompt_len=6)
    assert hits == blocks[:1]
    pool.release(hits)
    hits = pool.match_prefix(tokens, [], prompt_len=5)
    assert hits == blocks
    pool.release(hits)
    with pytest.raises(ValueError, match="prompt length"):
        pool.match_prefix(tokens, [])


def test_absorbed_cap_counts_rows_of_output_tokens():
    """Under prompt_apart the backend runs rows of output tokens absorbed whatever their length, and
    prompt rows expanded: the per-step absorbed-context cap counts the former only."""
    pool = BlockPool(64, 4, False, outputs_apart=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_batched_absorbed_context=1),
                      pool, max_model_len=1000, absorbed_max_new=0, prompt_apart=True)
    seq = _seq(0, [1] * 10, 4)
    assert sched._absorbed_cost(seq, 10, 0) == 0                 # a prompt row
    assert sched._absorbed_cost(seq, 3, 10) == 3 * 13            # recomputed outputs
