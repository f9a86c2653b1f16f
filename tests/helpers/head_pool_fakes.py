"""Token-level fakes for head-wise KV pools (no model, no tensors).

``FakeHeadCache`` stands in for the head-major K/V cache: each pool's range is a dict of slots
(block, offset) -> token id. Before a step writes positions [c, c + n) of a sequence, it checks
that every cached position the step's first query may see on that head (by the issue's
definition, computed position by position here, independently of cache/swa.py) is in the
sequence's row and holds exactly the sequence's token. Later queries of the step see a subset of
those cached positions, so one check per step covers them all.
"""

from __future__ import annotations

from paddle_mla.cache.head_pool import HeadWisePool, flat_cache_blocks
from paddle_mla.sched.request import GenerationRequest, RequestMetrics, SamplingParams, Sequence


def make_seq(i: int, tokens: list[int], max_tokens: int = 8) -> Sequence:
    req = GenerationRequest(id=i, prompt_token_ids=list(tokens), params=SamplingParams(max_tokens=max_tokens))
    return Sequence(request=req, index=i, seed=0, metrics=RequestMetrics(arrival_time=0.0))


def sees(is_swa: bool, window: int, sink: int, p: int, j: int) -> bool:
    """The issue's definition, written out again here as the tests' oracle."""
    return j <= p and (not is_swa or j < sink or j > p - window)


def dead_block(i: int, block_size: int, window: int, sink: int, num_computed: int) -> bool:
    """No position of block i is visible to an SWA query at any position >= num_computed."""
    last = (i + 1) * block_size - 1
    return all(not sees(True, window, sink, p, j)      # p = max(num_computed, j) sees most
               for j in range(i * block_size, last + 1) for p in range(num_computed, max(num_computed, last) + 1))


class FakeHeadCache:
    def __init__(self, pool: HeadWisePool):
        self.pool = pool
        self.slots: list[dict[tuple[int, int], int]] = [{} for _ in pool.pools]

    def step(self, seq: Sequence, num_cached: int, num_new: int) -> None:
        pool, spec, bs = self.pool, self.pool.spec, self.pool.block_size
        ids = seq.token_ids()
        for k, (row, slots) in enumerate(zip(pool.rows(seq), self.slots)):
            is_swa = pool.pools[k] is not pool.full
            for j in range(num_cached):
                if sees(is_swa, spec.window, spec.sink, num_cached, j):
                    block = row[j // bs] if j // bs < len(row) else -1
                    assert block >= 0, f"pool {k}: visible position {j} has no block (query {num_cached})"
                    assert slots.get((block, j % bs)) == ids[j], f"pool {k}: stale KV at position {j}"
            for p in range(num_cached, num_cached + num_new):
                block = row[p // bs]
                assert block >= 0
                assert pool.pools[k].ref_count[block] == 1, f"pool {k}: writing shared block {block}"
                slots[(block, p % bs)] = ids[p]


def check_global_ids(pool: HeadWisePool, live: list[Sequence]) -> None:
    """The uploaded table: with unequal ranges (one flat cache), head h's ids lie in its own range
    [base_h, base_h + range_h), the ranges are disjoint and inside the flat cache, so no block of
    storage is named by two heads; with equal ranges, ids are local to [0, range_h)."""
    spec = pool.spec
    sizes = [pool.head_pool(h).num_blocks for h in range(spec.num_kv_heads)]
    if pool.bases is None:
        assert len(set(sizes)) == 1
        bases = [0] * spec.num_kv_heads
    else:
        bases = [int(b) for b in pool.bases]
        spans = sorted(zip(bases, sizes))
        assert spans[0][0] >= 0 and all(b0 + n0 <= b1 for (b0, n0), (b1, _) in zip(spans, spans[1:]))
        assert spans[-1][0] + spans[-1][1] <= flat_cache_blocks(spec, sizes[0], sizes[-1])
    width = max([pool.num_logical_blocks(s) for s in live] + [1])
    table = pool.block_tables(live, width)
    for b, seq in enumerate(live):
        rows = pool.rows(seq)
        for h in range(spec.num_kv_heads):
            local = (rows[0] if pool.full and h < spec.first_swa_head
                     else rows[h - spec.first_swa_head + bool(pool.full)])
            want = [x + bases[h] if x >= 0 else -1 for x in local] + [-1] * (width - len(local))
            assert table[b, h].tolist() == want
            ids = table[b, h][table[b, h] >= 0]
            assert ((ids >= bases[h]) & (ids < bases[h] + sizes[h])).all(), f"head {h} id outside its range"


def check_invariants(pool: HeadWisePool, live: list[Sequence]) -> None:
    """Per pool: every id in its range, free + used = total, reference counts = holders; a block
    held twice is a cached, fully computed block at the same index; SWA rows hold every block the
    next query may see (sink and window) and, with recycling, nothing else that is computed."""
    spec, bs = pool.spec, pool.block_size
    for k, p in enumerate(pool.pools):
        is_swa = p is not pool.full
        holders: dict[int, list[tuple[Sequence, int]]] = {}
        for seq in live:
            rows = pool.rows(seq)
            row = rows[k]
            assert len(row) == pool.num_logical_blocks(seq)
            for i, b in enumerate(row):
                if b == -1:
                    assert is_swa, "a full head's row has a hole"
                    continue
                assert 0 <= b < p.num_blocks, f"id {b} outside the head's range [0, {p.num_blocks})"
                holders.setdefault(b, []).append((seq, i))
        used = [b for b in range(p.num_blocks) if p.ref_count[b] > 0]
        assert len(p.free) + len(used) == p.num_blocks
        assert all(p.ref_count[b] == 0 for b in p.free)
        for b in range(p.num_blocks):
            assert p.ref_count[b] == len(holders.get(b, [])), f"pool {k} block {b}: refcount != holders"
        for b, hs in holders.items():
            if len(hs) > 1:   # shared: a cached block every holder has computed, at one logical index
                assert p.block_key[b] is not None and len({i for _, i in hs}) == 1
                assert all(s.num_computed_tokens >= (i + 1) * bs for s, i in hs), f"shared block {b} being written"
    check_global_ids(pool, live)
    for seq in live:
        c = seq.num_computed_tokens
        for row in seq.swa_block_ids:
            for i, b in enumerate(row):
                dead = dead_block(i, bs, spec.window, spec.sink, c)
                if not dead:
                    assert b >= 0, f"SWA row lost live block {i} (computed {c})"
                elif spec.recycle and (i + 1) * bs <= c:
                    assert b == -1, f"SWA row kept dead block {i} with recycling on (computed {c})"
