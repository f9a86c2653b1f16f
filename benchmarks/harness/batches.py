"""Step batches the step benchmarks feed a ModelRunner directly (no scheduler): decode rows at a
context, prefill/extend rows, a decode batch with a chunk, one with short extends over a shared
prefix. Block tables are random permutations, so pages are read in no particular order."""

from __future__ import annotations

import numpy as np

from paddle_mla.platform import runtime

runtime.require_selected(__name__)

from paddle_mla.attention.forward_meta import StepBatch  # noqa: E402

PAGE = 64   # the block size every step benchmark runs at


def decode_batch(num_blocks: int, batch: int, context: int, seed: int = 0) -> StepBatch:
    """``batch`` decode rows, each with ``context - 1`` cached tokens and one new one."""
    per_seq = -(-context // PAGE)
    perm = np.random.default_rng(seed).permutation(num_blocks)[: batch * per_seq]
    return StepBatch(token_ids=np.arange(batch, dtype=np.int64) + 5, num_new=np.ones(batch, np.int32),
                     num_cached=np.full(batch, context - 1, np.int32),
                     block_tables=perm.reshape(batch, per_seq).astype(np.int32),
                     is_prefill=np.zeros(batch, bool), sample_mask=np.ones(batch, bool))


def step_batch(runner, b: int, new: int, cached: int, block: int, prefill: bool, seed: int) -> StepBatch:
    """``b`` rows of ``new`` random tokens after ``cached`` cached ones (prefill rows or decode rows)
    over ``runner``'s cache blocks."""
    per_seq = -(-(new + cached) // block)
    perm = np.random.default_rng(seed).permutation(runner.limits.num_blocks)[: b * per_seq]
    rng = np.random.default_rng(seed)
    return StepBatch(token_ids=rng.integers(2, 100, b * new).astype(np.int64), num_new=np.full(b, new, np.int32),
                     num_cached=np.full(b, cached, np.int32), block_tables=perm.reshape(b, per_seq).astype(np.int32),
                     is_prefill=np.full(b, prefill, bool), sample_mask=np.ones(b, bool))


def mixed_batches(decodes: int, context: int, chunk: int, cached: int, page: int, num_blocks: int):
    """(decode, chunk, mixed) StepBatches over disjoint random blocks."""
    rng = np.random.default_rng(cached)
    per_dec, per_chunk = -(-context // page), -(-(cached + chunk) // page)
    width = max(per_dec, per_chunk)
    perm = rng.permutation(num_blocks)[:decodes * per_dec + per_chunk].astype(np.int32)
    tables = np.full((decodes + 1, width), -1, np.int32)
    tables[:decodes, :per_dec] = perm[:decodes * per_dec].reshape(decodes, per_dec)
    tables[decodes, :per_chunk] = perm[decodes * per_dec:]
    dec = StepBatch(token_ids=np.arange(decodes, dtype=np.int64) + 5, num_new=np.ones(decodes, np.int32),
                    num_cached=np.full(decodes, context - 1, np.int32), block_tables=tables[:decodes],
                    is_prefill=np.zeros(decodes, bool), sample_mask=np.ones(decodes, bool))
    chk = StepBatch(token_ids=(np.arange(chunk, dtype=np.int64) % 97) + 3, num_new=np.array([chunk], np.int32),
                    num_cached=np.array([cached], np.int32), block_tables=tables[decodes:],
                    is_prefill=np.ones(1, bool), sample_mask=np.ones(1, bool))
    mixed = StepBatch(token_ids=np.concatenate([dec.token_ids, chk.token_ids]),
                      num_new=np.concatenate([dec.num_new, chk.num_new]),
                      num_cached=np.concatenate([dec.num_cached, chk.num_cached]), block_tables=tables,
                      is_prefill=np.concatenate([dec.is_prefill, chk.is_prefill]),
                      sample_mask=np.ones(decodes + 1, bool))
    return dec, chk, mixed


def short_batch(dec: StepBatch, n: int, q: int, cached: int, page: int, first_block: int) -> StepBatch:
    """``dec`` plus ``n`` extend rows of ``q`` new tokens over one shared ``cached``-token prefix
    (blocks from ``first_block`` on: the shared prefix, then each row's own tail blocks)."""
    shared, own = cached // page, -(-(cached % page + q) // page)
    width = max(dec.block_tables.shape[1], shared + own)
    tables = np.full((len(dec.num_new) + n, width), -1, np.int32)
    tables[:len(dec.num_new), :dec.block_tables.shape[1]] = dec.block_tables
    for i in range(n):
        row = tables[len(dec.num_new) + i]
        row[:shared] = np.arange(first_block, first_block + shared)
        row[shared:shared + own] = first_block + shared + i * own + np.arange(own)
    return StepBatch(token_ids=np.concatenate([dec.token_ids, (np.arange(n * q, dtype=np.int64) % 97) + 3]),
                     num_new=np.concatenate([dec.num_new, np.full(n, q, np.int32)]),
                     num_cached=np.concatenate([dec.num_cached, np.full(n, cached, np.int32)]), block_tables=tables,
                     is_prefill=np.concatenate([dec.is_prefill, np.ones(n, bool)]),
                     sample_mask=np.ones(len(dec.num_new) + n, bool))
