"""Per-KV-head block pools for head-wise sliding-window attention (pure Python, host side).

Every KV head has its own range of the cache (head-major: ``[num_kv_heads, num_blocks, ...]``) and
its own pool: block ids are local to the head's range, ``0 <= id < capacity``, and the same id in
two heads names two different blocks.

- **SWA heads** each have their own ``BlockPool`` (free list, reference counts, prefix-cache keys).
- **Full heads** share one ``BlockPool``. Their allocations, releases and prefix hits are the same
  by construction (every full head holds every block of every sequence), so H_full separate pools
  would go through identical states; one pool whose id ``b`` means block ``b`` of each full head's
  range is the same accounting at 1/H_full of the cost. ``seq.block_ids`` is their row.

A sequence holds the same logical block indices (block i = positions [i*bs, (i+1)*bs)) in every
head, except that an SWA row has -1 where the block is not needed: blocks between the sink and
the window, after recycling (``swa_recycle``) or on a prefix hit. This module implements the
scheduler's ``SeqBlocks`` interface (seq_blocks.py) and gives the runner the head-wise tables.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from paddle_mla.cache.block_pool import BlockPool, extend_chain
from paddle_mla.cache.swa import HeadWiseSwa, swa_needed_blocks, usable_hit


class SeqState(Protocol):
    """What the pool reads and writes on a scheduled sequence (the scheduler's ``Sequence``)."""

    block_ids: list[int]
    block_keys: list
    num_computed_tokens: int
    num_registered_blocks: int
    swa_block_ids: list
    swa_dead_below: list

    def token_ids(self) -> list[int]: ...


class HeadWisePool:
    def __init__(self, spec: HeadWiseSwa, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 swa_num_blocks: int | None = None):
        """``num_blocks`` blocks in each full head's range; ``swa_num_blocks`` (default the same) in
        each SWA head's range (split_head_blocks sizes the two for one memory budget)."""
        if spec.num_swa_heads < 1 or spec.window < 1 or spec.sink < 0:
            raise ValueError(f"head-wise pools need >= 1 SWA head, window >= 1 and sink >= 0: {spec}")
        self.spec = spec
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        swa_num_blocks = num_blocks if swa_num_blocks is None else swa_num_blocks
        self.full = BlockPool(num_blocks, block_size, enable_prefix_caching) if spec.num_full_heads else None
        self.swa = [BlockPool(swa_num_blocks, block_size, enable_prefix_caching) for _ in range(spec.num_swa_heads)]
        self.pools = ([self.full] if self.full else []) + self.swa
        self.num_blocks = self.pools[0].num_blocks   # the full heads' range (the SWA heads' when all are SWA)
        # Unequal ranges live in one flat cache per layer (kv_cache.allocate_flat_gqa_caches): the
        # tables then carry global ids, head h's local id i being bases[h] + i. Equal ranges keep the
        # head-major [Hkv, num_blocks, ...] cache and local ids.
        self.bases = head_bases(spec, num_blocks, swa_num_blocks) if swa_num_blocks != num_blocks else None
        self._changes = 0    # see version
        self.peak_head_blocks = 0   # peak of head_blocks_used(): KV memory, for benchmarks

    # -- per head -----------------------------------------------------------------------------
    def head_pool(self, head: int) -> BlockPool:
        """The pool of KV head ``head`` (the shared full-head pool for every full head)."""
        return self.swa[head - self.spec.first_swa_head] if self.spec.is_swa_head(head) else self.full

    def head_free(self) -> list[int]:
        """Free blocks of each KV head: exact counts (each head allocates whole blocks of its own range)."""
        return [self.head_pool(h).num_free for h in range(self.spec.num_kv_heads)]

    def head_blocks_used(self) -> int:
        """Blocks in use summed over every KV head: the KV memory held, in blocks of one head."""
        full = self.full.num_used * self.spec.num_full_heads if self.full else 0
        return full + sum(p.num_used for p in self.swa)

    def _note_peak(self) -> None:
        self.peak_head_blocks = max(self.peak_head_blocks, self.head_blocks_used())

    def rows(self, seq: SeqState) -> list[list[int]]:
        """``seq``'s row for each pool, in ``self.pools`` order."""
        return ([seq.block_ids] if self.full else []) + seq.swa_block_ids

    def num_logical_blocks(self, seq: SeqState) -> int:
        return len(seq.block_ids) if self.full else len(seq.swa_block_ids[0]) if seq.swa_block_ids else 0

    # -- engine-wide numbers (what LLM reports for a BlockPool) -------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks every head can still give (allocation takes the same count from each head)."""
        return min(p.num_free for p in self.pools)

    @property
    def num_used(self) -> int:
        return max(p.num_used for p in self.pools)

    @property
    def peak_used(self) -> int:
        return max(p.peak_used for p in self.pools)

    @peak_used.setter
    def peak_used(self, value: int) -> None:   # LLM.reset_stats restarts the peak at num_used
        for p in self.pools:
            p.peak_used = value

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def reset_prefix_cache(self) -> bool:
        if any(p.num_used for p in self.pools):
            return False
        self._changes += 1
        return all([p.reset_prefix_cache() for p in self.pools])

    # -- SeqBlocks ------------------------------------------------------------------------------
    def can_hold(self, seq: SeqState, num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - self.num_logical_blocks(seq)
        return need <= 0 or all(need <= p.num_free for p in self.pools)

    def prompt_need(self, seq: SeqState, num_tokens: int, chunk: int) -> tuple[int, ...]:
        """Per pool (``self.pools`` order): blocks ``seq`` must still take before its first
        ``num_tokens`` tokens are computed. Full heads, and SWA heads without recycling, hold every
        logical block. A recycled SWA row computing a chunk of n <= ``chunk`` tokens at c holds
        its sink blocks and blocks [(c - W + 1) // bs, ceil((c + n) / bs)): at most
        sink_blocks + ceil((n + W - 1) / bs) + 1, and never more than the whole row."""
        total = self.blocks_for(num_tokens)
        logical = self.num_logical_blocks(seq)
        grow = max(0, total - logical)
        if not self.spec.recycle:
            return (grow,) * len(self.pools)
        bs, sb = self.block_size, self.spec.sink_blocks(self.block_size)
        peak = min(total, sb + -(-(min(chunk, num_tokens) + self.spec.window - 1) // bs) + 1)
        live = logical - max(0, min(seq.swa_dead_below, logical) - sb)    # -1 exactly on [sb, dead_below)
        swa = max(0, peak - live)
        return ((grow,) if self.full else ()) + (swa,) * len(self.swa)

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(p.num_free for p in self.pools)

    @property
    def version(self) -> int:
        """Moves whenever any pool's state changes other than by a match_prefix that give_up
        undoes: a superset of BlockPool.version's events (a hit here is not one chain: an SWA
        row's window blocks can be registered or evicted anywhere), so never stale."""
        return self._changes + sum(p.version for p in self.pools)

    def give_up(self, seq: SeqState, num_tokens: int) -> None:
        self.free(seq)

    def hold(self, seq: SeqState, num_tokens: int) -> None:
        need = self.blocks_for(num_tokens) - self.num_logical_blocks(seq)
        if need <= 0:
            return
        self._changes += 1     # allocation may evict cached blocks: hits can shrink
        if not self.can_hold(seq, num_tokens):    # all heads or none
            raise MemoryError(f"need {need} KV blocks in every head; free per head: {self.head_free()}")
        if not seq.swa_block_ids:
            seq.swa_block_ids = [[] for _ in self.swa]
        for pool, row in zip(self.pools, self.rows(seq)):
            row.extend(pool.allocate(need))
        self._note_peak()

    def free(self, seq: SeqState) -> None:
        for pool, row in zip(self.pools, self.rows(seq)):
            pool.release([b for b in row if b >= 0])
        seq.block_ids = []
        seq.swa_block_ids = []
        seq.num_registered_blocks = 0
        seq.swa_dead_below = 0

    def match_prefix(self, seq: SeqState, token_ids: list[int]) -> int:
        """Full heads take the cached chain as BlockPool does; the hit then shrinks to the longest
        one for which every SWA head still holds its sink blocks and the window before it; SWA
        rows take only those blocks (-1 elsewhere). At least one token is left to compute."""
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        max_blocks = (len(token_ids) - 1) // bs
        keys = seq.block_keys
        extend_chain(keys, token_ids, bs, max_blocks)
        chain = max_blocks
        if self.full:
            chain = next((i for i, key in enumerate(keys[:max_blocks]) if key not in self.full.cached), max_blocks)
        k = usable_hit(self.spec, chain, lambda i: all(keys[i] in p.cached for p in self.swa), bs)
        if k == 0:
            return 0
        if self.full:
            seq.block_ids = [self.full.cached[key] for key in keys[:k]]
            self.full.acquire(seq.block_ids)
        needed = swa_needed_blocks(self.spec, k, bs)
        seq.swa_block_ids = []
        for pool in self.swa:
            row = [-1] * k
            for i in needed:
                row[i] = pool.cached[keys[i]]
            pool.acquire([row[i] for i in needed])
            seq.swa_block_ids.append(row)
        seq.num_registered_blocks = k
        seq.swa_dead_below = self.spec.first_window_block(k * bs, bs)
        self._note_peak()
        return k * bs

    def after_step(self, seq: SeqState) -> None:
        """Register newly full blocks in every head (before recycling, so a recycled block stays
        findable until its pool reuses it), then recycle."""
        c = seq.num_computed_tokens
        start = seq.num_registered_blocks
        if c // self.block_size > start:
            # rows[start:] have no -1: only indices below the last registration are ever dropped
            self._changes += self.enable_prefix_caching     # new keys: hits can grow
            tokens = seq.token_ids()
            for pool, row in zip(self.pools, self.rows(seq)):
                seq.num_registered_blocks = pool.register_full_blocks(tokens, row, c, seq.block_keys, start)
        if self.spec.recycle:
            self.recycle(seq)

    def recycle(self, seq: SeqState) -> None:
        """Give back each SWA head's blocks that lie wholly outside [0, S) and wholly before the
        window of every query at a position >= num_computed_tokens. Those blocks hold only
        computed positions, so none is still being written."""
        bs = self.block_size
        start = max(self.spec.sink_blocks(bs), seq.swa_dead_below)
        end = self.spec.first_window_block(seq.num_computed_tokens, bs)
        if end <= start:
            return
        self._changes += 1
        for pool, row in zip(self.swa, seq.swa_block_ids):
            dead = [b for b in row[start:end] if b >= 0]
            row[start:end] = [-1] * (end - start)
            pool.release(dead)
        seq.swa_dead_below = end

    def prompt_problem(self, num_tokens: int) -> str | None:
        need = self.blocks_for(num_tokens + 1)
        # With recycling an SWA head may run a long request in fewer blocks (chunked prefill), so
        # only the full heads, or every head without recycling, bound the prompt up front.
        bounded = [self.full] if self.full else []
        if not self.spec.recycle:
            bounded += self.swa[:1]
        cap = min((p.num_blocks for p in bounded), default=need)
        if need <= cap:
            return None
        return (f"prompt of {num_tokens} tokens needs {need} KV blocks in every KV head but a head's range "
                f"has {cap}; raise cache.num_blocks")

    def grow_problem(self, num_tokens: int) -> str:
        full = f"full heads {self.full.num_blocks} blocks, " if self.full else ""
        return (f"request needs KV blocks for {num_tokens} tokens, more than a KV head's range holds ({full}SWA "
                f"heads {self.swa[0].num_blocks} blocks, of {self.block_size} tokens); raise cache.num_blocks or "
                "lower max_tokens")

    # -- what the model runner uploads ---------------------------------------------------------------
    def block_tables(self, seqs: list[SeqState], width: int) -> np.ndarray:
        """int32 ``[len(seqs), num_kv_heads, width]``: each KV head's row of each sequence, with
        local block ids (global ids in the flat cache when ranges differ: ``bases``) and -1 for no
        block (the head-wise table of docs/append_attention.md)."""
        spec = self.spec
        out = np.full((len(seqs), spec.num_kv_heads, width), -1, dtype=np.int32)
        for b, seq in enumerate(seqs):
            if self.full and seq.block_ids:
                out[b, :spec.first_swa_head, :len(seq.block_ids)] = seq.block_ids
            for r, row in enumerate(seq.swa_block_ids):
                out[b, spec.first_swa_head + r, :len(row)] = row
        if self.bases is not None:
            out = np.where(out >= 0, out + self.bases[None, :, None], -1).astype(np.int32)
        return out


def split_head_blocks(total_head_blocks: int, spec: HeadWiseSwa, block_size: int, max_num_seqs: int,
                      max_num_batched_tokens: int, max_model_len: int = 0) -> tuple[int, int]:
    """(full-head, SWA-head) range sizes for a budget of ``total_head_blocks`` blocks of one head.
    Without recycling every head needs the whole context: equal ranges. With recycling an SWA row
    holds at most the sink blocks, the window's blocks and those of the step's new tokens, so the
    SWA ranges get exactly what ``max_num_seqs`` such rows can use and the full heads the rest.
    When that reaches the equal split (a large max_num_seqs: recycling would free nothing) and
    ``max_model_len`` is given, the SWA ranges are sized for the rows the budget holds at
    max_model_len instead (when it holds one at all), so the full heads keep room for them."""
    equal = total_head_blocks // spec.num_kv_heads
    if not spec.recycle or spec.num_full_heads == 0:
        return equal, equal
    window_blocks = -(-(spec.window - 1) // block_size) + 1     # (p - W, p] spans at most this many
    per_seq = spec.sink_blocks(block_size) + window_blocks
    chunk = -(-max_num_batched_tokens // block_size)
    rows = max_num_seqs
    if rows * per_seq + chunk + rows >= equal and max_model_len > 0:
        row_blocks = -(-max_model_len // block_size)
        fit = (total_head_blocks - spec.num_swa_heads * chunk) // (
            spec.num_full_heads * row_blocks + spec.num_swa_heads * (per_seq + 1))
        rows = min(rows, fit) if fit >= 1 else rows     # no max_model_len row fits: the budget is not for them
    swa = min(equal, rows * per_seq + chunk + rows)
    full = (total_head_blocks - spec.num_swa_heads * swa) // spec.num_full_heads
    return full, swa


def head_ranges(spec: HeadWiseSwa, num_blocks: int, block_size: int, sched, usable_blocks: int,
                max_model_len: int = 0) -> tuple[int, int | None]:
    """(full heads' range, SWA heads' range or None when equal) for a budget of ``num_blocks`` blocks
    per KV head (``cache.num_blocks``, or what the memory profile fits): split_head_blocks, the full
    heads capped at ``usable_blocks`` (kv_cache.usable_num_blocks: more are never used). Unequal
    ranges go into one flat cache of flat_cache_blocks(...) <= num_kv_heads x num_blocks blocks."""
    full, swa = split_head_blocks(spec.num_kv_heads * num_blocks, spec, block_size, sched.max_num_seqs,
                                  sched.max_num_batched_tokens, max_model_len)
    if swa == full:
        return num_blocks, None
    return min(full, usable_blocks), swa


def head_bases(spec: HeadWiseSwa, full_num_blocks: int, swa_num_blocks: int) -> np.ndarray:
    """First global block id of each KV head's range in one flat cache: the full heads' ranges of
    ``full_num_blocks`` first, then the SWA heads' of ``swa_num_blocks`` (int32 [num_kv_heads])."""
    nf = spec.num_full_heads
    return np.array([h * full_num_blocks if h < nf else nf * full_num_blocks + (h - nf) * swa_num_blocks
                     for h in range(spec.num_kv_heads)], dtype=np.int32)


def flat_cache_blocks(spec: HeadWiseSwa, full_num_blocks: int, swa_num_blocks: int) -> int:
    """Blocks of the flat cache holding every head's range."""
    return spec.num_full_heads * full_num_blocks + spec.num_swa_heads * swa_num_blocks


def make_block_pool(num_blocks: int, block_size: int, enable_prefix_caching: bool,
                    spec: HeadWiseSwa | None, swa_num_blocks: int | None = None,
                    outputs_apart: bool = False) -> BlockPool | HeadWisePool:
    """The engine's pool: one BlockPool (uniform tables) without head-wise SWA or in its mask mode,
    else per-head pools (``num_blocks`` per full head, ``swa_num_blocks``, default the same, per SWA head).
    ``outputs_apart``: ``BlockPool``'s (MLA backends only: head-wise SWA is GQA's)."""
    if spec is None or not spec.head_wise_tables:
        return BlockPool(num_blocks, block_size, enable_prefix_caching, outputs_apart)
    if outputs_apart:
        raise ValueError("head-wise pools do not keep output blocks apart")
    return HeadWisePool(spec, num_blocks, block_size, enable_prefix_caching, swa_num_blocks)
