"""The scheduler over per-KV-head pools, with a token-level fake of the head-major KV cache.

The fake runner (tests/head_pool_fakes.FakeHeadCache) checks, before every step, that each KV head
finds every cached position its queries may see (full heads: all; SWA heads: sink and window)
with exactly the request's token, and the pool invariants are checked after every step. The
"model" is a pure function of the token history, so outputs must match the uniform-table run
whatever the pools do (preemption, recycling, prefix hits). Then: more requests fit with recycling.
"""

from __future__ import annotations

import pytest
from helpers.head_pool_fakes import FakeHeadCache, check_invariants, make_seq
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_scheduler import drive, next_token, workload

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.cache.head_pool import HeadWisePool, split_head_blocks
from paddle_mla.cache.swa import HeadWiseSwa
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.scheduler import Scheduler


def run(prompts, max_tokens, pool, chunked=False, budget=512, max_num_seqs=8):
    """Runs to completion; returns (outputs, errors, scheduler, steps taken). Fewer steps for the
    same tokens = larger batches: more requests fit in the cache at once."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                      enable_chunked_prefill=chunked), pool, max_model_len=10_000)
    cache = FakeHeadCache(pool) if isinstance(pool, HeadWisePool) else None
    seqs = [make_seq(i, p, max_tokens) for i, p in enumerate(prompts)]
    sched.add(*seqs)

    def execute(out):
        for s in out.scheduled:
            if cache is not None:
                cache.step(s.seq, s.num_cached, s.num_new)
        return [next_token(s.seq.token_ids()[: s.num_cached + s.num_new]) if s.samples else -1 for s in out.scheduled]

    def check(out):
        if cache is not None:
            check_invariants(pool, sched.running)

    steps = drive(sched, execute, max_tokens, check)
    pools = pool.pools if isinstance(pool, HeadWisePool) else [pool]
    assert all(p.num_free == p.num_blocks for p in pools), "blocks leaked"
    return [s.output_token_ids for s in seqs], [s.error for s in seqs], sched, steps


def head_pool(n_swa, recycle, num_blocks, prefix, window=6, sink=2, block_size=4, swa_num_blocks=None, heads=4):
    return HeadWisePool(HeadWiseSwa(heads, n_swa, window, sink, recycle), num_blocks, block_size, prefix,
                        swa_num_blocks=swa_num_blocks)


@pytest.mark.parametrize("n_swa", [1, 2, 4])
@pytest.mark.parametrize("recycle", [False, True])
@pytest.mark.parametrize("prefix, chunked", [(False, False), (True, False), (True, True)])
def test_outputs_match_uniform_tables(n_swa, recycle, prefix, chunked):
    prompts = workload(0)
    # 8 output tokens: admission keeps room for the running prompts, so it is the decodes' growth
    # that runs the small pools out and forces preemption
    base, errors, _, _ = run(prompts, 8, BlockPool(200, 4, False))
    assert not any(errors)
    got, errors, sched, _ = run(prompts, 8, head_pool(n_swa, recycle, 14, prefix), chunked=chunked,
                                budget=7 if chunked else 64)
    assert not any(errors)
    assert got == base
    if n_swa < 4 or not (recycle and chunked):   # all-SWA recycled rows in 7-token chunks stay small
        assert sched.num_preemptions > 0, "the small pools must force preemption"
    if prefix:
        assert sched.cached_prompt_tokens > 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4]), heads=st.integers(1, 4),
       data=st.data(), window=st.integers(1, 20), sink=st.integers(0, 8), recycle=st.booleans(),
       prefix=st.booleans(), chunked=st.booleans(), budget=st.integers(3, 40))
def test_random_workloads_match_uniform(seed, block_size, heads, data, window, sink, recycle, prefix, chunked,
                                        budget):
    prompts = workload(seed, n=6, shared=12, block_size=block_size)
    if not chunked:
        budget = max(budget, max(len(p) for p in prompts) + 8)
    fits = -(-(max(len(p) for p in prompts) + 5) // block_size) + 1    # the longest request alone
    n_swa = data.draw(st.integers(1, heads))
    pool = HeadWisePool(HeadWiseSwa(heads, n_swa, window, sink, recycle), data.draw(st.integers(fits, 60)),
                        block_size, prefix, swa_num_blocks=data.draw(st.integers(fits, 60)))
    base, _, _, _ = run(prompts, 5, BlockPool(10_000, block_size, False), budget=10_000)
    got, errors, _, _ = run(prompts, 5, pool, chunked=chunked, budget=budget)
    assert not any(errors)
    assert got == base


def long_decodes():
    return [[(7 * i + j) % 11 for j in range(8)] for i in range(16)], 120   # 16 requests, 128-token contexts


def test_more_requests_fit_with_recycling_when_every_head_is_swa():
    prompts, max_tokens = long_decodes()
    base, _, _, _ = run(prompts, max_tokens, BlockPool(10_000, 4, False), max_num_seqs=16)
    steps, preemptions = {}, {}
    for recycle in (False, True):
        got, errors, sched, steps[recycle] = run(
            prompts, max_tokens, head_pool(2, recycle, 120, False, window=16, sink=4, heads=2), max_num_seqs=16)
        assert not any(errors) and got == base
        preemptions[recycle] = sched.num_preemptions
    # without recycling a 128-token row takes 32 of the 120 blocks (3 or 4 requests at a time);
    # with it a row holds at most 1 + 5 + 1 blocks, so all 16 decode together: 120 steps
    assert steps[True] == max_tokens and preemptions[True] == 0
    assert steps[False] > 2.5 * steps[True] and preemptions[False] > 0, (steps, preemptions)


def test_more_requests_fit_at_a_fixed_kv_budget_with_half_swa_heads():
    """Same memory (blocks of one head, summed over the 4 KV heads): uniform tables against half
    the heads SWA with recycling, their ranges sized by split_head_blocks."""
    prompts, max_tokens = long_decodes()
    budget_head_blocks = 4 * 300
    base, _, _, uniform_steps = run(prompts, max_tokens, BlockPool(budget_head_blocks // 4, 4, False),
                                    max_num_seqs=16)
    spec = HeadWiseSwa(4, 2, window=16, sink=4, recycle=True)
    full, swa = split_head_blocks(budget_head_blocks, spec, 4, max_num_seqs=16, max_num_batched_tokens=16)
    assert 2 * full + 2 * swa <= budget_head_blocks and full > 300 > swa
    got, errors, _, steps = run(prompts, max_tokens, HeadWisePool(spec, full, 4, False, swa_num_blocks=swa),
                                max_num_seqs=16)
    assert not any(errors) and got == base
    assert steps < 0.8 * uniform_steps, (steps, uniform_steps)   # 127 against 176 steps


def test_preemption_under_swa_head_pressure():
    """The SWA heads' ranges are the small ones: they, not the full heads, force preemption."""
    prompts = workload(3)
    base, _, _, _ = run(prompts, 10, BlockPool(200, 4, False))
    pool = head_pool(2, False, 200, True, swa_num_blocks=14)
    got, errors, sched, _ = run(prompts, 10, pool)     # decode growth, not admission, runs them out
    assert not any(errors) and got == base
    assert sched.num_preemptions > 0 and pool.full.peak_used < 200


def test_long_request_runs_in_a_small_all_swa_cache_only_with_recycling():
    prompt = [(5 * j) % 13 for j in range(100)]
    got, errors, _, _ = run([prompt], 20, head_pool(2, True, 12, False, window=8, sink=4, heads=2),
                            chunked=True, budget=16)
    base, _, _, _ = run([prompt], 20, BlockPool(10_000, 4, False))
    assert errors == [None] and got == base
    _, errors, _, _ = run([prompt], 20, head_pool(2, False, 12, False, window=8, sink=4, heads=2),
                          chunked=True, budget=16)
    assert "needs 26 KV blocks in every KV head but a head's range has 12" in errors[0]


def test_request_that_cannot_fit_alone_fails_alone():
    """The SWA heads' range (10 blocks, no recycling) takes request 1's 30-token prompt but not
    its growth to 41 tokens: it fails, alone, when it runs out; the others finish."""
    prompts = [[1] * 5, [2] * 30, [3] * 6]
    pool = head_pool(1, False, 200, False, swa_num_blocks=10)
    got, errors, _, _ = run(prompts, 20, pool, chunked=True, budget=16)
    assert errors[0] is None and errors[2] is None and len(got[0]) == len(got[2]) == 20
    assert errors[1] == ("request needs KV blocks for 41 tokens, more than a KV head's range holds (full heads 200 "
                         "blocks, SWA heads 10 blocks, of 4 tokens); raise cache.num_blocks or lower max_tokens")


class NoMemoScheduler(Scheduler):
    def schedule(self):
        self._blocked = None
        return super().schedule()


def trace(cls, prompts, pool, chunked, budget, max_num_seqs):
    """Every step's schedule, rows and free queues as plain data."""
    sched = cls(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                enable_chunked_prefill=chunked), pool, max_model_len=10_000)
    seqs = [make_seq(i, p, 6) for i, p in enumerate(prompts)]
    sched.add(*seqs)
    steps = []

    def record(out):
        steps.append(([(s.seq.index, s.num_new, s.num_cached, tuple(s.seq.block_ids),
                        tuple(map(tuple, s.seq.swa_block_ids))) for s in out.scheduled],
                      [f.index for f in out.failed], out.num_preempted, [tuple(p.free) for p in pool.pools]))

    execute = lambda out: [next_token(s.seq.token_ids()[: s.num_cached + s.num_new]) if s.samples else -1  # noqa: E731
                           for s in out.scheduled]
    drive(sched, execute, 6, record)
    return steps


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), recycle=st.booleans(), prefix=st.booleans(), chunked=st.booleans(),
       budget=st.integers(3, 40), max_num_seqs=st.integers(1, 4), swa_blocks=st.integers(10, 30))
# a prefill that completes gives back its reserve with no pool event: the memo must see that too
@example(seed=7411, recycle=True, prefix=True, chunked=False, budget=3, max_num_seqs=3, swa_blocks=14)
def test_blocked_head_memo_changes_no_head_wise_schedule(seed, recycle, prefix, chunked, budget, max_num_seqs,
                                                         swa_blocks):
    """The scheduler's blocked-head memo reads HeadWisePool.version: it must skip only retries
    that would fail again, so the schedule is step for step the one without the memo."""
    prompts = workload(seed, n=6, shared=12, block_size=2)
    if not chunked:
        budget = max(budget, max(len(p) for p in prompts) + 8)
    make = lambda: head_pool(2, recycle, 30, prefix, window=5, sink=2, block_size=2,  # noqa: E731
                             swa_num_blocks=swa_blocks)
    base = trace(NoMemoScheduler, prompts, make(), chunked, budget, max_num_seqs)
    assert trace(Scheduler, prompts, make(), chunked, budget, max_num_seqs) == base


def test_first_chunk_too_big_for_swa_heads_fails_instead_of_waiting_forever():
    """All heads SWA with recycling: no up-front bound on the prompt, so a whole unchunked prompt
    larger than an SWA range is caught at admission, when nothing else holds blocks."""
    prompts = [[1] * 50, [2] * 6]
    got, errors, _, _ = run(prompts, 4, head_pool(2, True, 10, False, window=4, sink=0, heads=2), budget=64)
    assert errors[0] == ("request needs KV blocks for 50 tokens, more than a KV head's range holds (SWA heads 10 "
                         "blocks, of 4 tokens); raise cache.num_blocks or lower max_tokens")
    assert errors[1] is None and len(got[1]) == 4
