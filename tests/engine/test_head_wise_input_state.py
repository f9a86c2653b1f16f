"""Head-wise block-table rows by deltas (worker/head_tables.py) against a full rebuild.

At every step of the real scheduler over per-KV-head pools (recycling on and off, prefix hits,
chunked prefill, preemption from small pools, equal and unequal per-head ranges), the rows that
``InputState.apply`` keeps by deltas (the scheduler's plain-data ``step_input``) equal
``HeadWisePool.block_tables``, which rebuilds them from the pools. And a step writes only what changed:
nothing in a decode step that stays inside its blocks.
"""

from __future__ import annotations

import numpy as np
from helpers.head_pool_fakes import make_seq
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import drive, next_token, workload

from paddle_mla.cache.head_pool import HeadWisePool
from paddle_mla.cache.swa import HeadWiseSwa
from paddle_mla.config.schema import SchedulerConfig
from paddle_mla.worker.input_state import InputState
from paddle_mla.sched.scheduler import Scheduler


def run(prompts, pool, max_tokens, chunked, budget, max_num_seqs, slots=None):
    """Drives the scheduler; returns (scheduler, state, entries written per step, steps checked)."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                      enable_chunked_prefill=chunked), pool, max_model_len=10_000)
    state = InputState(slots or max_num_seqs, 64, pool)
    seqs = [make_seq(i, p, max_tokens) for i, p in enumerate(prompts)]
    sched.add(*seqs)
    written = []

    def execute(out):
        before = state.heads.written
        host = state.apply(sched.step_input(out))
        written.append(state.heads.written - before)
        rows = [s.seq for s in out.scheduled]
        width = max(pool.num_logical_blocks(q) for q in rows)
        assert host.block_tables.shape == (len(rows), pool.spec.num_kv_heads, max(width, 1))
        np.testing.assert_array_equal(host.block_tables[..., :width], pool.block_tables(rows, width))
        assert (host.block_tables[..., width:] == -1).all()
        return [next_token(s.seq.token_ids()[: s.num_cached + s.num_new]) if s.samples else -1 for s in out.scheduled]

    drive(sched, execute, max_tokens)
    return sched, state, written


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4]), heads=st.integers(1, 4), data=st.data(),
       window=st.integers(1, 20), sink=st.integers(0, 8), recycle=st.booleans(), prefix=st.booleans(),
       chunked=st.booleans(), budget=st.integers(3, 40), max_num_seqs=st.integers(1, 6))
def test_rows_by_deltas_equal_a_rebuild_at_every_step(seed, block_size, heads, data, window, sink, recycle, prefix,
                                                      chunked, budget, max_num_seqs):
    prompts = workload(seed, n=8, shared=12, block_size=block_size)
    if not chunked:
        budget = max(budget, max(len(p) for p in prompts) + 8)
    fits = -(-(max(len(p) for p in prompts) + 6) // block_size) + 1
    spec = HeadWiseSwa(heads, data.draw(st.integers(1, heads)), window, sink, recycle)
    pool = HeadWisePool(spec, data.draw(st.integers(fits, 50)), block_size, prefix,
                        swa_num_blocks=data.draw(st.integers(fits, 50)))   # unequal ranges: global ids
    run(prompts, pool, 6, chunked, budget, max_num_seqs)


def test_small_pools_preempt_hit_and_recycle_and_rows_stay_exact():
    """A case that surely takes every path: small pools (preemption), a shared prefix (hits), a
    short window with recycling, unequal ranges (bases added)."""
    prompts = workload(7, n=10, shared=24)
    spec = HeadWiseSwa(4, 2, window=6, sink=2, recycle=True)
    pool = HeadWisePool(spec, 16, 4, True, swa_num_blocks=12)
    sched, _, _ = run(prompts, pool, 12, True, 9, 4)
    assert sched.num_preemptions > 0 and sched.cached_prompt_tokens > 0


def test_decode_steps_write_only_what_changed():
    """One long decode: a step writes the new block's ids when one starts, the recycled block's -1
    when one leaves the window, and nothing otherwise (a rebuild would write every row each step)."""
    spec = HeadWiseSwa(4, 2, window=8, sink=4, recycle=True)
    pool = HeadWisePool(spec, 40, 4, False)
    _, _, written = run([list(range(16))], pool, 40, False, 64, 1)
    decode = written[1:]                      # after the prefill step
    assert decode.count(0) >= len(decode) // 2
    # a new block: 2 full heads + 2 SWA heads; a recycled block: 2 SWA heads
    assert set(decode) <= {0, 2, 4, 6}, written
