"""A request blocked at the head of the waiting queue costs O(1) per step, and changes nothing.

The scheduler remembers (head, pool version, budget) of a failed admission and skips the retry
while they are unchanged. The schedule must be step for step the same as with the memo off, and
the blocked steps must not call ``match_prefix`` (which walks the whole prompt).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence
from paddle_mla.sched.scheduler import Scheduler
from helpers.scheduler_fakes import FakeRunner


class NoMemoScheduler(Scheduler):
    def schedule(self):
        self._blocked = None
        return super().schedule()


class CountingPool(BlockPool):
    def __init__(self, *args):
        super().__init__(*args)
        self.matches = 0

    def match_prefix(self, token_ids, keys, prompt_len=None):
        self.matches += 1
        return super().match_prefix(token_ids, keys, prompt_len)


def trace(cls, prompts, max_tokens, num_blocks, block_size, prefix, chunked, budget, max_num_seqs=4):
    """Every step's schedule as plain data, and the count of match_prefix calls."""
    pool = CountingPool(num_blocks, block_size, prefix)
    sched = cls(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                enable_chunked_prefill=chunked), pool, max_model_len=10_000)
    runner = FakeRunner(num_blocks, block_size)
    for i, p in enumerate(prompts):
        req = GenerationRequest(id=i, prompt_token_ids=list(p), params=SamplingParams(max_tokens=max_tokens))
        sched.add(Sequence(request=req, index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0)))
    steps = []
    while sched.has_work():
        out = sched.schedule()
        steps.append(([(s.seq.index, s.num_new, s.num_cached, tuple(s.seq.block_ids)) for s in out.scheduled],
                      [f.index for f in out.failed], out.num_preempted, tuple(pool.free)))
        sampled = runner.execute(out) if out.scheduled else []
        sched.update_from_output(out, sampled)     # the requests' max_tokens finish them
        assert len(steps) < 5_000
    assert pool.num_free == pool.num_blocks
    return steps, pool.matches


def test_blocked_head_skips_match_prefix():
    # One long decode hogs the pool; the next prompt (no shared prefix) waits for it for ~30 steps
    # while the first one's blocks fill and get cached.
    prompts = [list(range(40)), list(range(50, 91))]
    kw = dict(max_tokens=30, num_blocks=20, block_size=4, prefix=True, chunked=False, budget=512, max_num_seqs=4)
    base, base_matches = trace(NoMemoScheduler, prompts, **kw)
    got, matches = trace(Scheduler, prompts, **kw)
    assert got == base
    blocked_steps = base_matches - 2   # without the memo: one retry per blocked step (2 admissions)
    assert blocked_steps >= 10, "the workload must keep the second request waiting"
    # A admitted; B blocked at step 1 (budget left by A's prefill) and again at step 2 (the budget
    # left by A's decode: a new memo); then no retry until A's blocks are freed and B is admitted.
    assert matches == 4, (matches, base_matches)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(10, 40),
       budget=st.integers(3, 40), prefix=st.booleans(), chunked=st.booleans(), max_num_seqs=st.integers(1, 4))
def test_memo_changes_no_schedule(seed, block_size, num_blocks, budget, prefix, chunked, max_num_seqs):
    rng = random.Random(seed)
    shared = [rng.randrange(50) for _ in range(12)]
    prompts = [shared[:rng.randrange(13)] + [rng.randrange(50) for _ in range(rng.randrange(1, 14))]
               for _ in range(6)]
    if not chunked:
        budget = max(budget, max(len(p) for p in prompts) + 8)
    num_blocks = max(num_blocks, -(-(max(len(p) for p in prompts) + 6) // block_size) + 1)
    args = (prompts, 6, num_blocks, block_size, prefix, chunked, budget, max_num_seqs)
    base, base_matches = trace(NoMemoScheduler, *args)
    got, matches = trace(Scheduler, *args)
    assert got == base        # same schedule, same block ids, same free-queue order at every step
    assert matches <= base_matches


def test_pool_version_moves_only_on_what_can_unblock_the_watched_request():
    pool = BlockPool(6, 2, enable_prefix_caching=True)
    a = pool.allocate(2)
    pool.register_full_blocks([1, 2, 3, 4], a, 4, [], 0)
    pool.release(a)
    # The blocked request: prompt [1, 2, 3, 4, 5, 6, 7] hits blocks a, needs [5, 6] next.
    keys: list = []
    hits = pool.match_prefix([1, 2, 3, 4, 5, 6, 7], keys)
    assert hits == a
    pool.release(hits)
    pool.watch(hits, keys, 7)
    v = pool.version
    other = pool.allocate(2)                               # uncached blocks: harder, not easier
    pool.register_full_blocks([9, 9, 8, 8], other, 4, [], 0)   # someone else's blocks cached
    assert pool.version == v
    mine = pool.allocate(1)
    pool.register_full_blocks([1, 2, 3, 4, 5, 6], a + mine, 6, keys, 2)   # its next block cached
    assert pool.version == v + 1
    pool.release(other)                                    # blocks freed
    assert pool.version > v + 1
    v = pool.version
    pool.allocate(5)                                       # evicts every cached block, a among them
    assert pool.version > v
