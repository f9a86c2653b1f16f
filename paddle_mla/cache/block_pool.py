"""Paged KV block pool with a prefix cache (pure Python, host side).

Blocks have reference counts. A full block can be registered under a key that digests its whole
token ancestry: key = SHA-256(parent block's key || the block's token ids as 8-byte integers), the
first block's parent being 32 zero bytes (as vLLM's prefix cache does). So equal prefixes map to
equal keys, and two different ancestries share a key only through a SHA-256 collision: the key is
256 bits wide and does not pass through Python's 64-bit ``hash`` anywhere (the dict only uses
``hash`` to find a bucket, then compares the full 32 bytes). Token ids are packed at a fixed width,
so no two token lists share a byte string. Unreferenced blocks sit in a free queue in
least-recently-used order; a cached block keeps its key while free and is reused on a hit until
allocation evicts it (from the queue's head).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

BlockKey = bytes          # 32-byte SHA-256 digest of the block's token ancestry

ROOT_KEY: BlockKey = bytes(32)   # the parent of a sequence's first block
_TOKEN_FORMAT = "q"              # signed 64-bit: token ids packed at a fixed width
assert array(_TOKEN_FORMAT).itemsize == 8


def block_key(parent: BlockKey, token_ids, mark: bytes = b"") -> BlockKey:
    """Digest of one full block given its parent's digest."""
    return hashlib.sha256(parent + array(_TOKEN_FORMAT, token_ids).tobytes() + mark).digest()


OUTPUT_MARK = b"output"   # digested after the tokens of a block that holds output positions (``outputs_from``)


def extend_chain(keys: list[BlockKey], token_ids: list[int], block_size: int, num_full_blocks: int,
                 outputs_from: int | None = None) -> None:
    """Extend ``keys`` in place to the first ``num_full_blocks`` blocks. Incremental: each block is
    digested once in the sequence's life, not once per step. ``outputs_from``: the sequence's prompt
    length, when blocks holding positions from there on (its outputs) must not match the same tokens
    in another request's prompt (``BlockPool.outputs_apart``)."""
    parent = keys[-1] if keys else ROOT_KEY
    for i in range(len(keys), num_full_blocks):
        mark = b""
        if outputs_from is not None and (i + 1) * block_size > outputs_from:
            # where in the block the outputs begin (0 past the first such block): two requests whose
            # prompts end at different offsets of one block computed its positions on different paths
            mark = OUTPUT_MARK + max(outputs_from - i * block_size, 0).to_bytes(8, "little")
        parent = block_key(parent, token_ids[i * block_size:(i + 1) * block_size], mark)
        keys.append(parent)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, outputs_apart: bool = False):
        """``outputs_apart``: a block holding a request's output positions is found only by requests
        that hold the same tokens as outputs at the same positions (the request itself, re-admitted
        after a preemption), never by a prompt: for a backend that computes prompt and output tokens
        on different paths, whose KV bits then differ (``triton_mla`` under ``deterministic: true``)."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.outputs_apart = outputs_apart
        self.ref_count = [0] * num_blocks
        self.block_key: list[BlockKey | None] = [None] * num_blocks
        self.cached: dict[BlockKey, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.peak_used = 0
        # Bumped by every change that can make the watched (blocked) request admissible where it
        # was not: a block freed, the cache reset, its next missing block cached (more hits), one of
        # its hit blocks evicted (fewer hits can leave more blocks free). Anything else only makes
        # admission harder: the scheduler's blocked-head memo reads it (see ``watch``).
        self.version = 0
        self._watch_blocks: frozenset[int] = frozenset()
        self._watch_key: BlockKey | None = None

    # -- capacity ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks (evicting LRU cached ones); all-or-nothing."""
        if n > len(self.free):
            raise MemoryError(f"need {n} KV blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            key = self.block_key[block]
            if key is not None:
                del self.cached[key]
                self.block_key[block] = None
                if block in self._watch_blocks:
                    self.version += 1
            self.ref_count[block] = 1
            out.append(block)
        self.peak_used = max(self.peak_used, self.num_used)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference of each block; freed blocks join the queue tail, the request's
        last block first, so a shared prefix outlives the tails that extend it."""
        ref_count, keys, free = self.ref_count, self.block_key, self.free   # locals: a finishing
        freed = 0                                                          # batch releases many
        for block in reversed(blocks):
            left = ref_count[block] = ref_count[block] - 1
            if left == 0:
                freed += 1
                free[block] = None
                if keys[block] is None:
                    free.move_to_end(block, last=False)   # uncached blocks are reused first
            elif left < 0:
                self.version += freed
                raise RuntimeError(f"block {block} released more often than taken")
        self.version += freed

    # -- prefix cache -----------------------------------------------------------------------
    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (benchmarks between rounds); only while no block is in use."""
        if self.num_used:
            return False
        self.cached.clear()
        self.block_key = [None] * self.num_blocks
        self.version += 1
        return True

    def _outputs_from(self, prompt_len: int | None) -> int | None:
        if self.outputs_apart and prompt_len is None:
            raise ValueError("a pool that keeps output blocks apart needs each sequence's prompt length")
        return prompt_len if self.outputs_apart else None

    def match_prefix(self, token_ids: list[int], keys: list[BlockKey], prompt_len: int | None = None) -> list[int]:
        """Cached blocks for the longest cached prefix, leaving at least one token to compute
        (its logits are needed); takes a reference on each block it returns. ``keys`` is the
        sequence's key chain (extended here as needed); ``prompt_len`` its prompt's length."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(token_ids) - 1) // self.block_size
        extend_chain(keys, token_ids, self.block_size, max_blocks, self._outputs_from(prompt_len))
        hits: list[int] = []
        for key in keys[:max_blocks]:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        for block in hits:
            if self.ref_count[block] == 0:
                del self.free[block]
            self.ref_count[block] += 1
        self.peak_used = max(self.peak_used, self.num_used)
        return hits

    def watch(self, hits: list[int], keys: list[BlockKey], num_tokens: int) -> None:
        """Watch a request whose admission just failed after ``match_prefix`` returned ``hits``
        (already released): ``version`` then moves when its match could change."""
        self._watch_blocks = frozenset(hits)
        max_blocks = (num_tokens - 1) // self.block_size
        self._watch_key = keys[len(hits)] if self.enable_prefix_caching and len(hits) < max_blocks else None

    def register_full_blocks(self, token_ids: list[int], block_ids: list[int], num_computed: int,
                             keys: list[BlockKey], start: int, prompt_len: int | None = None) -> int:
        """Make blocks ``start..`` whose tokens are all computed findable by later requests;
        returns the new count of registered blocks of the sequence."""
        n_full = min(num_computed // self.block_size, len(block_ids))
        if not self.enable_prefix_caching or n_full <= start:
            return max(start, n_full)
        extend_chain(keys, token_ids, self.block_size, n_full, self._outputs_from(prompt_len))
        for block, key in zip(block_ids[start:n_full], keys[start:n_full]):
            if self.block_key[block] is not None or key in self.cached:
                continue   # already cached, here or (same content) in another block
            self.block_key[block] = key
            self.cached[key] = block
            if key == self._watch_key:
                self.version += 1
        return n_full

    def acquire(self, blocks: list[int]) -> None:
        """Take one more reference on each of ``blocks`` (cached blocks found by key, for prefix
        hits that are not one chain from block 0: head-wise SWA rows keep sink and window only)."""
        for block in blocks:
            if self.ref_count[block] == 0:
                del self.free[block]
            self.ref_count[block] += 1
        self.peak_used = max(self.peak_used, self.num_used)
