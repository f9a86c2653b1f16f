"""Per-KV-head block pools (head-wise SWA): accounting invariants under any sequence of operations,
exact capacity, recycling bounds and prefix hits that shrink to what the SWA heads still hold.
Pure Python; the oracles (visibility, dead blocks, expected hits) are written position by position
in tests/helpers/head_pool_fakes.py, independently of paddle_mla/cache/swa.py."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_mla.cache.block_pool import extend_chain
from paddle_mla.cache.head_pool import HeadWisePool, flat_cache_blocks, split_head_blocks
from paddle_mla.cache.swa import HeadWiseSwa
from helpers.head_pool_fakes import FakeHeadCache, check_invariants, make_seq, sees


def expected_hit(pool: HeadWisePool, seq, tokens: list[int]) -> int:
    """Longest k blocks of the full heads' cached chain whose SWA-visible blocks (for the query at
    k * bs) every SWA head still holds in its cache; in tokens."""
    if not pool.enable_prefix_caching:
        return 0
    spec, bs = pool.spec, pool.block_size
    max_blocks = (len(tokens) - 1) // bs
    keys = list(seq.block_keys)
    extend_chain(keys, tokens, bs, max_blocks)
    chain = 0
    while chain < max_blocks and (pool.full is None or keys[chain] in pool.full.cached):
        chain += 1
    for k in range(chain, 0, -1):
        needed = {j // bs for j in range(k * bs) if sees(True, spec.window, spec.sink, k * bs, j)}
        if all(keys[i] in p.cached for p in pool.swa for i in needed):
            return k * bs
    return 0


class Driver:
    """Does what the scheduler does to a pool: admit (prefix hit, then blocks for a first chunk),
    compute steps, preempt, finish, abort; the fake cache checks the KV every step."""

    def __init__(self, pool: HeadWisePool):
        self.pool = pool
        self.cache = FakeHeadCache(pool)
        self.running = []
        self.waiting = []

    def admit(self, seq, first_chunk: int) -> bool:
        tokens = seq.token_ids()
        want = expected_hit(self.pool, seq, tokens)
        num_cached = self.pool.match_prefix(seq, tokens)
        assert num_cached == want
        seq.num_computed_tokens = num_cached
        n = max(1, min(first_chunk, len(tokens) - num_cached))
        if not self.pool.can_hold(seq, num_cached + n):
            self.pool.free(seq)
            seq.num_computed_tokens = 0
            assert seq.block_ids == [] and seq.swa_block_ids == []
            self.waiting.append(seq)
            return False
        self.pool.hold(seq, num_cached + n)
        self.running.append(seq)
        self.compute(seq, n)
        return True

    def compute(self, seq, n: int) -> None:
        c = seq.num_computed_tokens
        self.cache.step(seq, c, n)
        seq.num_computed_tokens = c + n
        self.pool.after_step(seq)

    def step(self, seq, n: int, new_token: int) -> bool:
        c = seq.num_computed_tokens
        if c == seq.num_tokens:
            seq.output_token_ids.append(new_token)     # decode: one sampled token more
        n = max(1, min(n, seq.num_tokens - c))
        if not self.pool.can_hold(seq, c + n):
            return False
        self.pool.hold(seq, c + n)
        self.compute(seq, n)
        return True

    def drop(self, seq) -> None:
        self.pool.free(seq)
        seq.num_computed_tokens = 0
        if seq in self.running:
            self.running.remove(seq)


@st.composite
def pools(draw):
    heads = draw(st.integers(1, 4))
    spec = HeadWiseSwa(heads, draw(st.integers(1, heads)), window=draw(st.integers(1, 12)),
                       sink=draw(st.integers(0, 6)), recycle=draw(st.booleans()))
    return HeadWisePool(spec, draw(st.integers(3, 24)), draw(st.sampled_from([1, 2, 4])), draw(st.booleans()),
                        swa_num_blocks=draw(st.integers(2, 12)))


# weighted towards admissions and finishes: cache churn evicts the SWA heads' free cached blocks
# before the full heads' ones, which is what makes prefix hits shrink
OPS = ["new"] * 4 + ["step"] * 3 + ["finish"] * 2 + ["readmit", "preempt", "abort", "recycle", "reset"]


@settings(max_examples=300, deadline=None)
@given(pools(), st.integers(0, 2**32 - 1))
def test_invariants_after_any_operations(pool, seed):
    # the operations come from a seeded Random (hypothesis draws per operation cost ~10x the test)
    rng = random.Random(seed)
    d = Driver(pool)
    small = lambda: rng.randrange(3)     # noqa: E731  a small alphabet, so prompts share prefixes
    bases = [[small() for _ in range(24)] for _ in range(2)]
    pick = rng.choice
    for i in range(rng.randrange(1, 61)):
        op = pick(OPS)
        if op == "new":
            prompt = pick(bases)[:rng.randrange(25)] + [small() for _ in range(rng.randrange(1, 7))]
            d.admit(make_seq(i, prompt), rng.randrange(1, 31))
        elif op == "readmit" and d.waiting:
            seq = pick(d.waiting)
            d.waiting.remove(seq)
            d.admit(seq, rng.randrange(1, 31))
        elif op == "step" and d.running:
            d.step(pick(d.running), rng.randrange(1, 9), small())
        elif op == "preempt" and d.running:
            seq = pick(d.running)
            d.drop(seq)
            d.waiting.append(seq)
        elif op == "finish" and d.running:
            d.drop(pick(d.running))
        elif op == "abort" and (d.running or d.waiting):
            seq = pick(d.running + d.waiting)
            d.drop(seq)
            if seq in d.waiting:
                d.waiting.remove(seq)
        elif op == "recycle" and d.running and pool.spec.recycle:
            pool.recycle(pick(d.running))
        elif op == "reset":
            assert pool.reset_prefix_cache() == all(p.num_used == 0 for p in pool.pools)
        check_invariants(pool, d.running)
        # exact capacity: a new sequence can take exactly num_free blocks in every head
        probe = make_seq(-1, [0])
        assert pool.head_free() == [pool.head_pool(h).num_free for h in range(pool.spec.num_kv_heads)]
        assert pool.can_hold(probe, pool.num_free * pool.block_size)
        assert not pool.can_hold(probe, (pool.num_free + 1) * pool.block_size)
    for seq in list(d.running):
        d.drop(seq)
    assert all(p.num_free == p.num_blocks for p in pool.pools), "blocks leaked"


def test_exact_capacity_per_head():
    """Free blocks are counted per head, exactly: the SWA heads' recycled blocks show up as theirs,
    and with fewer than num_kv_heads blocks free nothing is rounded away (the seed's integer
    division reported 0 there)."""
    spec = HeadWiseSwa(4, 2, window=4, sink=0, recycle=True)
    pool = HeadWisePool(spec, 10, 2, enable_prefix_caching=False)
    d = Driver(pool)
    seq = make_seq(0, list(range(19)))
    assert d.admit(seq, 19)                    # 10 blocks in every head, then recycling
    assert pool.head_free() == [0, 0, 8, 8]   # SWA rows keep blocks 7..9: (19 - 4, 19) plus the tail
    assert pool.num_free == 0 and not pool.can_hold(make_seq(1, [1]), 1)
    d.drop(seq)
    other = make_seq(2, list(range(17)))
    assert d.admit(other, 17)                  # 9 blocks: one left in every head
    assert pool.head_free() == [1, 1, 8, 8] and pool.num_free == 1
    assert pool.can_hold(make_seq(3, [1]), 2) and not pool.can_hold(make_seq(3, [1]), 3)


@pytest.mark.parametrize("recycle", [False, True])
def test_long_request_holds_sink_plus_window_blocks(recycle):
    """Decoding 600 tokens: full rows grow with the context; with recycling an SWA row never holds
    more than the sink blocks, the window's blocks and the block being written."""
    bs, window, sink = 4, 13, 6
    spec = HeadWiseSwa(2, 1, window=window, sink=sink, recycle=recycle)
    pool = HeadWisePool(spec, 200, bs, enable_prefix_caching=True)
    d = Driver(pool)
    seq = make_seq(0, [1, 2, 3])
    assert d.admit(seq, 3)
    bound = -(-sink // bs) + -(-(window - 1) // bs) + 2
    peak = 0
    for t in range(600):
        assert d.step(seq, 1, t % 5)
        live = sum(b >= 0 for b in seq.swa_block_ids[0])
        peak = max(peak, live)
        assert len(seq.block_ids) == -(-seq.num_computed_tokens // bs)
    check_invariants(pool, d.running)
    full_blocks = len(seq.block_ids)
    if recycle:
        assert peak <= bound and pool.swa[0].num_used <= bound
        assert pool.head_blocks_used() <= full_blocks + bound and pool.peak_head_blocks <= full_blocks + bound
    else:
        assert peak == full_blocks == pool.swa[0].num_used
        assert pool.peak_head_blocks == pool.head_blocks_used() == 2 * full_blocks


def shared_prefix_after_eviction(recycle: bool):
    """A computes 40 tokens (bs 4, S 4, W 8); a filler then takes the SWA heads' oldest free blocks
    (the full heads have room to spare); B asks for A's prefix."""
    spec = HeadWiseSwa(4, 2, window=8, sink=4, recycle=recycle)
    pool = HeadWisePool(spec, 40, 4, enable_prefix_caching=True, swa_num_blocks=16)
    d = Driver(pool)
    prompt = [(7 * i) % 5 for i in range(40)]
    a = make_seq(0, prompt + [9])
    assert d.admit(a, 41)
    if not recycle:
        d.drop(a)                  # its blocks stay cached while free
    filler = make_seq(1, [4] * 32)
    assert d.admit(filler, 32)     # 8 blocks per head: the fresh ones first, then the LRU cached ones
    b = make_seq(2, prompt[:30] + [3, 3] if recycle else prompt + [3])
    return pool, d, b


@pytest.mark.parametrize("recycle", [False, True])
def test_prefix_hit_shrinks_to_what_swa_heads_hold(recycle):
    pool, d, b = shared_prefix_after_eviction(recycle)
    tokens = b.token_ids()
    chain = (len(tokens) - 1) // 4    # the full heads hold the whole chain
    want = expected_hit(pool, b, tokens)
    assert 0 < want < chain * 4, "the setup must force a shrunk but non-empty hit"
    assert d.admit(b, 8)              # asserts the hit equals the oracle; the fake cache checks the KV
    assert b.num_computed_tokens == want + min(8, len(tokens) - want)
    check_invariants(pool, d.running)


def test_full_hit_when_the_owner_still_runs_with_recycling():
    """With recycling on, a running owner keeps sink and window, so its whole prompt is a hit."""
    spec = HeadWiseSwa(2, 1, window=8, sink=4, recycle=True)
    pool = HeadWisePool(spec, 40, 4, enable_prefix_caching=True)
    d = Driver(pool)
    prompt = [(3 * i) % 7 for i in range(40)]
    assert d.admit(make_seq(0, prompt + [1]), 41)
    b = make_seq(1, prompt + [2])
    assert d.admit(b, 8)
    assert b.num_computed_tokens == 41 and sum(x >= 0 for x in b.swa_block_ids[0]) == 1 + 3
    check_invariants(pool, d.running)


def test_block_tables_are_head_wise_with_minus_one_holes():
    spec = HeadWiseSwa(3, 1, window=4, sink=2, recycle=True)
    pool = HeadWisePool(spec, 20, 2, enable_prefix_caching=False)
    d = Driver(pool)
    s0, s1 = make_seq(0, list(range(11))), make_seq(1, [1, 2, 3])
    assert d.admit(s0, 11) and d.admit(s1, 3)
    t = pool.block_tables([s0, s1], width=8)
    assert t.shape == (2, 3, 8) and str(t.dtype) == "int32"
    assert (t[0, 0] == t[0, 1]).all() and list(t[0, 0, :6]) == s0.block_ids
    assert list(t[0, 2, :6]) == s0.swa_block_ids[0] and t[0, 2, 1] == -1 and t[0, 2, 0] >= 0
    assert (t[1, :, 2:] == -1).all() and (t[0, :, 6:] == -1).all()
    assert spec.backend_kwargs() == {"num_swa_heads": 1, "window": 4, "sink": 2, "swa_mask": False}


def test_unequal_ranges_give_global_ids_in_one_flat_cache():
    """Full heads 20 blocks each, the SWA head 7: one flat cache of 2 x 20 + 7 blocks, head h's
    ids offset by its base (0, 20, 40); -1 stays -1."""
    spec = HeadWiseSwa(3, 1, window=4, sink=2, recycle=True)
    pool = HeadWisePool(spec, 20, 2, enable_prefix_caching=False, swa_num_blocks=7)
    assert pool.bases.tolist() == [0, 20, 40] and flat_cache_blocks(spec, 20, 7) == 47
    d = Driver(pool)
    s0 = make_seq(0, list(range(11)))
    assert d.admit(s0, 11)
    t = pool.block_tables([s0], width=6)
    assert list(t[0, 0]) == s0.block_ids and list(t[0, 1]) == [b + 20 for b in s0.block_ids]
    assert list(t[0, 2]) == [b + 40 if b >= 0 else -1 for b in s0.swa_block_ids[0]] and t[0, 2, 1] == -1
    assert HeadWisePool(spec, 20, 2, False).bases is None    # equal ranges: head-major cache, local ids


def test_split_head_blocks_gives_swa_heads_what_recycled_rows_can_use():
    spec = HeadWiseSwa(8, 4, window=4096, sink=64, recycle=True)
    full, swa = split_head_blocks(8 * 10_000, spec, 64, max_num_seqs=32, max_num_batched_tokens=8192)
    assert swa == 32 * (1 + 65) + 128 + 32 and 4 * full + 4 * swa <= 80_000 and full > 10_000
    off = HeadWiseSwa(8, 4, window=4096, sink=64, recycle=False)
    assert split_head_blocks(80_000, off, 64, 32, 8192) == (10_000, 10_000)


def test_split_head_blocks_sizes_swa_ranges_for_the_rows_the_budget_holds():
    """max_num_seqs 256 with a budget of about four 32k rows per head: the SWA ranges are sized for
    the rows the budget holds at max_model_len, not for 256 rows (which would take the whole budget
    and leave the full heads the equal split, so recycling would admit nothing more)."""
    spec = HeadWiseSwa(4, 2, window=4096, sink=64, recycle=True)
    total, max_len = 4 * 2100, 32768 + 128
    row_blocks = -(-max_len // 64)
    assert split_head_blocks(total, spec, 64, 256, 8192) == (2100, 2100)     # no max_model_len: 256 rows
    full, swa = split_head_blocks(total, spec, 64, 256, 8192, max_model_len=max_len)
    rows = full // row_blocks
    assert rows == 7 and swa >= rows * (1 + 65) + 128 and 2 * full + 2 * swa <= total
    assert rows >= 1.5 * (2100 // row_blocks)                 # 7 rows of 32k where equal ranges hold 4
    assert split_head_blocks(total, spec, 64, 4, 8192, max_model_len=max_len)[1] == 4 * 66 + 128 + 4
