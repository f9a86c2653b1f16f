"""Scheduler + block pool against a token-level fake of the KV cache.

The fake runner writes each computed token id into its physical slot and, before writing, checks
that every cached slot the request's block table points at holds exactly the token the request has
at that position. So any wrong block table, prefix hit, chunk boundary or preemption shows up as a
mismatch, without a model. The "model" is a pure function of the token history, so outputs must be
identical with prefix caching, chunking and preemption on or off.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence
from paddle_mla.sched.scheduler import Scheduler

from helpers.scheduler_fakes import FakeRunner, drive, next_token  # noqa: F401


def run(prompts, max_tokens, num_blocks, block_size, prefix, chunked, budget, max_num_seqs=8):
    pool = BlockPool(num_blocks, block_size, prefix)
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                      enable_chunked_prefill=chunked), pool, max_model_len=10_000)
    runner = FakeRunner(num_blocks, block_size)
    seqs = []
    for i, p in enumerate(prompts):
        req = GenerationRequest(id=i, prompt_token_ids=list(p), params=SamplingParams(max_tokens=max_tokens))
        seq = Sequence(request=req, index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0))
        seqs.append(seq)
        sched.add(seq)
    drive(sched, runner.execute, max_tokens)
    assert pool.num_free == pool.num_blocks, "blocks leaked"
    return [s.output_token_ids for s in seqs], [s.error for s in seqs], sched, runner


def workload(seed: int, n: int = 10, shared: int = 24, block_size: int = 4):
    rng = random.Random(seed)
    prefix = [rng.randrange(90) for _ in range(shared)]
    return [prefix[: rng.randrange(shared + 1)] + [rng.randrange(90) for _ in range(rng.randrange(1, 20))]
            for _ in range(n)]


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("num_blocks", [200, 14])
def test_equivalence_with_prefix_chunking_preemption(prefix, chunked, num_blocks):
    prompts = workload(0)
    base, errors, _, _ = run(prompts, 6, 200, 4, prefix=False, chunked=False, budget=64)
    assert not any(errors)
    got, errors, sched, runner = run(prompts, 6, num_blocks, 4, prefix=prefix, chunked=chunked,
                                     budget=7 if chunked else 64)
    assert not any(errors)
    assert got == base
    if num_blocks == 14:
        assert sched.num_preemptions > 0, "the small pool must force preemption"
    if chunked:
        assert max(runner.tokens_per_step) <= 7
    if prefix:
        assert sched.cached_prompt_tokens > 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4, 8]), num_blocks=st.integers(12, 60),
       budget=st.integers(3, 40), prefix=st.booleans(), chunked=st.booleans())
def test_random_workloads_match_baseline(seed, block_size, num_blocks, budget, prefix, chunked):
    prompts = workload(seed, n=6, shared=12, block_size=block_size)
    if not chunked:
        budget = max(budget, max(len(p) for p in prompts) + 8)
    need = max(len(p) for p in prompts) + 5
    if -(-need // block_size) + 1 > num_blocks:
        num_blocks = -(-need // block_size) + 1
    base, _, _, _ = run(prompts, 5, 10_000, block_size, False, False, 10_000)
    got, errors, _, _ = run(prompts, 5, num_blocks, block_size, prefix, chunked, budget)
    assert not any(errors)
    assert got == base


def test_request_that_cannot_fit_alone_fails_alone():
    prompts = [[1] * 5, [2] * 40, [3] * 6]
    got, errors, _, _ = run(prompts, 3, 6, 4, prefix=False, chunked=True, budget=16)
    assert errors[0] is None and errors[2] is None
    assert "KV blocks" in errors[1]
    assert len(got[0]) == 3 and len(got[2]) == 3


def test_prefix_hit_counts_shared_blocks():
    shared = list(range(32))
    prompts = [shared + [50 + i, 60 + i] for i in range(4)]
    _, _, sched, _ = run(prompts, 2, 100, 8, prefix=True, chunked=False, budget=512, max_num_seqs=1)
    # The first request computes everything; each later one reuses the 4 full shared blocks.
    assert sched.cached_prompt_tokens == 3 * 32


def test_block_pool_lru_and_refcounts():
    pool = BlockPool(4, 2, enable_prefix_caching=True)
    keys: list = []
    a = pool.allocate(2)
    pool.register_full_blocks([1, 2, 3, 4], a, 4, keys, 0)
    pool.release(a)
    assert pool.num_free == 4
    hits = pool.match_prefix([1, 2, 3, 4, 5], [])
    assert hits == a and pool.num_free == 2
    pool.release(hits)
    b = pool.allocate(2)          # uncached blocks go first: the cached prefix survives
    assert set(b).isdisjoint(a)
    pool.allocate(2)              # now the cached ones are evicted
    assert pool.match_prefix([1, 2, 3, 4, 5], []) == []
    with pytest.raises(MemoryError):
        pool.allocate(1)


@pytest.mark.parametrize("chunked", [False, True])
def test_absorbed_context_cap_bounds_each_step_and_keeps_outputs(chunked):
    """Prefix hits whose few new tokens the backend runs absorbed (each re-reading its whole context)
    are admitted only while a step's new x context work stays under the cap (the first always runs);
    outputs equal the uncapped run's."""
    rng = random.Random(3)
    shared = [rng.randrange(90) for _ in range(40)]
    prompts = [shared + [rng.randrange(90) for _ in range(3 + i % 4)] for i in range(9)]
    cap, absorb_max = 600, 8   # rows of 3..6 new tokens over 40 cached cost 129..276: two or three fit

    def run_cap(c):
        pool = BlockPool(200, 4, True)
        sched = Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, enable_chunked_prefill=chunked,
                                          max_num_batched_absorbed_context=c), pool, max_model_len=10_000,
                          absorbed_max_new=absorb_max)
        runner = FakeRunner(200, 4)
        seqs = [Sequence(request=GenerationRequest(id=i, prompt_token_ids=p, params=SamplingParams(max_tokens=5)),
                         index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0)) for i, p in enumerate(prompts)]
        sched.add(*seqs)
        work = []

        def execute(out):
            absorbed = [s.num_new * (s.num_cached + s.num_new) for s in out.scheduled
                        if s.is_prefill and s.num_new <= absorb_max]
            work.append(absorbed)
            return runner.execute(out)

        drive(sched, execute, 5)
        assert pool.num_free == pool.num_blocks
        return [s.output_token_ids for s in seqs], work

    base, free = run_cap(0)
    got, capped = run_cap(cap)
    assert got == base
    assert max(len(w) for w in free) > 2          # uncapped: one step takes many prefix hits
    assert all(sum(w) <= cap or len(w) == 1 for w in capped)
    assert 1 < max(len(w) for w in capped) < max(len(w) for w in free)
