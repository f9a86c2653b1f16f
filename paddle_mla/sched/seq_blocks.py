"""The one interface the scheduler uses for a sequence's KV blocks, whatever the table shape.

``UniformSeqBlocks`` wraps a ``BlockPool``: one block table per sequence (``seq.block_ids``), the
same for every KV head (MLA latent caches, GQA without head-wise SWA). ``HeadWisePool``
(head_pool.py) implements the same methods with one pool per KV head. Every method is
all-or-nothing: a sequence holds blocks for the same logical block indices in every head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from paddle_mla.cache.block_pool import BlockPool
from paddle_mla.sched.request import token_slice

if TYPE_CHECKING:
    from paddle_mla.sched.request import Sequence


class SeqBlocks(Protocol):
    block_size: int

    def can_hold(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether every head's pool can give ``seq`` the blocks it lacks for ``num_tokens`` tokens."""

    def hold(self, seq: Sequence, num_tokens: int) -> None:
        """Give ``seq`` blocks for its first ``num_tokens`` tokens in every head (after can_hold)."""

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (finish, abort, preemption, failure)."""

    def match_prefix(self, seq: Sequence, token_ids: list[int]) -> int:
        """Take the usable cached prefix of ``token_ids`` for an empty ``seq``; returns its tokens."""

    def prompt_need(self, seq: Sequence, num_tokens: int, chunk: int) -> tuple[int, ...]:
        """Blocks each pool must still give ``seq`` before its first ``num_tokens`` tokens are
        computed, ``chunk`` tokens at most a step: the most it will hold meanwhile (an SWA head
        with recycling gives blocks back as it goes) less what it holds now, in ``free_blocks`` order."""

    def free_blocks(self) -> tuple[int, ...]:
        """Free blocks of each pool (the order of ``prompt_need``)."""

    def give_up(self, seq: Sequence, num_tokens: int) -> None:
        """Admission failed after match_prefix: release the hit and watch for what could change that."""

    @property
    def version(self) -> int:
        """Moves on every change that can make a failed admission (give_up) succeed; while it and
        the request stay the same, retrying must fail again (the scheduler's blocked-head memo)."""

    def after_step(self, seq: Sequence) -> None:
        """``seq.num_computed_tokens`` grew: register its full blocks (and recycle dead ones)."""

    def prompt_problem(self, num_tokens: int) -> str | None:
        """Why a request of ``num_tokens`` known tokens (plus the one it samples) can never run,
        even alone (None: it may)."""

    def grow_problem(self, num_tokens: int) -> str:
        """The error of a request that needs ``num_tokens`` tokens of KV and cannot fit alone."""


class _TokenSlices:
    """``seq``'s prompt + output as ``register_full_blocks`` reads it (slices of whole blocks),
    without building the whole list: registering a block costs O(block), not O(context)."""

    __slots__ = ("seq",)

    def __init__(self, seq: Sequence):
        self.seq = seq

    def __getitem__(self, item: slice) -> list[int]:
        return token_slice(self.seq, item.start, item.stop)


class UniformSeqBlocks:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size

    def can_hold(self, seq: Sequence, num_tokens: int) -> bool:
        return self.pool.blocks_for(num_tokens) - len(seq.block_ids) <= self.pool.num_free

    def hold(self, seq: Sequence, num_tokens: int) -> None:
        need = self.pool.blocks_for(num_tokens) - len(seq.block_ids)
        if need > 0:
            seq.block_ids.extend(self.pool.allocate(need))

    def free(self, seq: Sequence) -> None:
        self.pool.release(seq.block_ids)
        seq.block_ids = []
        seq.num_registered_blocks = 0

    def match_prefix(self, seq: Sequence, token_ids: list[int]) -> int:
        seq.block_ids = self.pool.match_prefix(token_ids, seq.block_keys, seq.prompt_len)
        seq.num_registered_blocks = len(seq.block_ids)
        return len(seq.block_ids) * self.block_size

    def prompt_need(self, seq: Sequence, num_tokens: int, chunk: int) -> tuple[int, ...]:
        return (max(0, self.pool.blocks_for(num_tokens) - len(seq.block_ids)),)

    def free_blocks(self) -> tuple[int, ...]:
        return (self.pool.num_free,)

    def give_up(self, seq: Sequence, num_tokens: int) -> None:
        hits = seq.block_ids
        self.free(seq)
        self.pool.watch(hits, seq.block_keys, num_tokens)

    @property
    def version(self) -> int:
        return self.pool.version

    def after_step(self, seq: Sequence) -> None:
        if seq.num_computed_tokens // self.block_size <= seq.num_registered_blocks:
            return
        seq.num_registered_blocks = self.pool.register_full_blocks(
            _TokenSlices(seq), seq.block_ids, seq.num_computed_tokens, seq.block_keys, seq.num_registered_blocks,
            seq.prompt_len)

    def prompt_problem(self, num_tokens: int) -> str | None:
        need = self.pool.blocks_for(num_tokens + 1)
        if need <= self.pool.num_blocks:
            return None
        return (f"prompt of {num_tokens} tokens needs {need} KV blocks but the cache has "
                f"{self.pool.num_blocks}; raise cache.num_blocks")

    def grow_problem(self, num_tokens: int) -> str:
        return (f"request needs {self.pool.blocks_for(num_tokens)} KV blocks of {self.block_size} tokens but the "
                f"cache has {self.pool.num_blocks}; raise cache.num_blocks or lower max_tokens")
