"""The prefix-cache key is a 256-bit digest chain, so a hit never rests on Python's 64-bit ``hash``.

The old key was ``(hash(parent key), tokens)``: two blocks with equal tokens under different
ancestries collided as soon as their parents' Python hashes did. Here ``hash`` is forced to collide
(a constant) and a different ancestry must still miss.
"""

from __future__ import annotations

import hashlib
import struct

from paddle_mla.cache import block_pool
from paddle_mla.cache.block_pool import ROOT_KEY, BlockPool, extend_chain


def _cached_pool(*sequences: list[int], block_size: int) -> BlockPool:
    pool = BlockPool(16, block_size, enable_prefix_caching=True)
    for tokens in sequences:
        blocks = pool.allocate(len(tokens) // block_size)
        pool.register_full_blocks(tokens, blocks, len(tokens), [], 0)
        pool.release(blocks)
    return pool


def test_forced_python_hash_collision_gives_no_false_hit(monkeypatch):
    # Every Python-level hash the module might use now collides (the old key called hash(parent)).
    monkeypatch.setattr(block_pool, "hash", lambda _obj: 0, raising=False)
    pool = _cached_pool([1, 2, 3, 4, 9, 9, 9, 9], [5, 6, 7, 8, 0, 0, 0, 0], block_size=4)
    # First block cached (from the second sequence), second block's tokens cached under another
    # ancestry: only the first block may hit. (The old key hit both: a wrong KV for tokens 4..7.)
    hits = pool.match_prefix([5, 6, 7, 8, 9, 9, 9, 9, 0], [])
    assert len(hits) == 1
    pool.release(hits)
    # The true prefix still hits both blocks.
    hits = pool.match_prefix([1, 2, 3, 4, 9, 9, 9, 9, 0], [])
    assert len(hits) == 2
    pool.release(hits)


class _ConstantHash:
    """A key whose Python hash always collides, compared by its full digest."""

    def __init__(self, digest: bytes):
        self.digest = digest

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other) -> bool:
        return isinstance(other, _ConstantHash) and other.digest == self.digest


def test_colliding_dict_buckets_give_no_false_hit(monkeypatch):
    # Every key lands in the same dict bucket: a hit must come from comparing the full digest.
    real = block_pool.block_key
    monkeypatch.setattr(block_pool, "ROOT_KEY", _ConstantHash(ROOT_KEY))
    monkeypatch.setattr(block_pool, "block_key",
                        lambda parent, ids, mark=b"": _ConstantHash(real(parent.digest, ids, mark)))
    pool = _cached_pool([1, 2, 3, 4, 5, 6], block_size=2)
    assert len(pool.match_prefix([1, 2, 3, 4, 7, 7, 0], [])) == 2
    assert len(pool.match_prefix([1, 2, 3, 4, 5, 6, 0], [])) == 3
    assert pool.match_prefix([2, 1, 3, 4, 5, 6, 0], []) == []
    assert pool.match_prefix([1, 2, 4, 3, 5, 6, 0], []) == [pool.cached[_ConstantHash(real(ROOT_KEY, [1, 2]))]]


def test_key_is_a_sha256_chain_of_fixed_width_tokens():
    keys: list[bytes] = []
    tokens = [1, 2, 300000, 4, 5, 6, 7]
    extend_chain(keys, tokens, 3, 2)
    first = hashlib.sha256(bytes(32) + struct.pack("<3q", 1, 2, 300000)).digest()
    second = hashlib.sha256(first + struct.pack("<3q", 4, 5, 6)).digest()
    assert keys == [first, second]
    assert all(len(k) == 32 for k in keys)
    # Incremental: extending again digests only the new blocks (the old keys are kept as they are).
    extend_chain(keys, tokens + [8, 9], 3, 3)
    assert keys[:2] == [first, second] and keys[2] == hashlib.sha256(second + struct.pack("<3q", 7, 8, 9)).digest()


def test_fixed_width_tokens_do_not_alias():
    # As variable-width text "1,23" and "12,3" would alias; 8-byte integers cannot.
    a, b = [], []
    extend_chain(a, [1, 23], 2, 1)
    extend_chain(b, [12, 3], 2, 1)
    c = []
    extend_chain(c, [256, 0], 2, 1)
    d = []
    extend_chain(d, [0, 1], 2, 1)
    assert len({a[0], b[0], c[0], d[0]}) == 4
