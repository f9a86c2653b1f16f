"""Head-wise sliding-window attention: which KV heads are SWA heads, what they see, and which of
their KV blocks must stay (pure Python; the definitions of docs/head_wise_swa.md).

A query at position p of an SWA head sees key position j iff ``j <= p`` and (``j < S`` or
``j > p - W``); a full head sees every ``j <= p``. The SWA heads are the last ``n_swa`` KV heads
of every layer. Block ``i`` covers positions ``[i * bs, (i + 1) * bs)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from paddle_mla.config.schema import ConfigError, swa_heads

if TYPE_CHECKING:
    from paddle_mla.config.schema import EngineConfig


@dataclass(frozen=True)
class HeadWiseSwa:
    num_kv_heads: int
    num_swa_heads: int
    window: int          # W, tokens
    sink: int            # S, tokens
    recycle: bool        # cache.swa_recycle
    mask: bool = False   # attention.swa_mode mask: uniform tables, SWA heads walk the whole row and mask

    @property
    def head_wise_tables(self) -> bool:
        """Per-KV-head pools and [B, Hkv, M] tables (skip mode); mask mode keeps one uniform pool."""
        return not self.mask

    @property
    def first_swa_head(self) -> int:
        return self.num_kv_heads - self.num_swa_heads

    @property
    def num_full_heads(self) -> int:
        return self.first_swa_head

    def is_swa_head(self, head: int) -> bool:
        return head >= self.first_swa_head

    def visible(self, head: int, p: int, j: int) -> bool:
        """Whether a query at position ``p`` on KV head ``head`` sees key position ``j``."""
        return j <= p and (not self.is_swa_head(head) or j < self.sink or j > p - self.window)

    def sink_blocks(self, block_size: int) -> int:
        """Blocks that hold at least one sink position: they stay for the whole request."""
        return -(-self.sink // block_size)

    def first_window_block(self, num_computed: int, block_size: int) -> int:
        """Lowest block any query at a position >= ``num_computed`` sees through its window: the
        blocks from ``sink_blocks`` up to this one are dead for every future query."""
        return max(0, num_computed - self.window + 1) // block_size

    def backend_kwargs(self) -> dict[str, int]:
        """What the attention op takes (docs/append_attention.md: num_swa_heads, window, sink; swa_mask)."""
        return {"num_swa_heads": self.num_swa_heads, "window": self.window, "sink": self.sink, "swa_mask": self.mask}


def per_rank_swa_heads(num_kv_heads: int, num_swa_heads: int, tp_size: int) -> int:
    """SWA heads of each tensor-parallel rank. The ranks hold equal shares of the full heads and of
    the SWA heads (the loader picks each rank's heads so: models.sharding), so their attention
    time and KV memory stay equal and every rank runs one local plan, its SWA heads last.
    ConfigError when either count does not split evenly."""
    full = num_kv_heads - num_swa_heads
    if full % tp_size or num_swa_heads % tp_size:
        raise ConfigError([f"'parallel.tensor_parallel_size' {tp_size} must divide both the {full} full and the "
                           f"{num_swa_heads} SWA KV heads of head-wise SWA (each rank holds an equal share of "
                           f"each); choose a head_wise_swa_ratio or tensor_parallel_size that splits both"])
    return num_swa_heads // tp_size


def head_wise_swa(cfg: EngineConfig, family: str, num_kv_heads: int, tp_size: int = 1) -> HeadWiseSwa | None:
    """The head-wise SWA plan of one rank of ``cfg`` for a model of ``family`` with ``num_kv_heads``
    KV heads in all, over ``tp_size`` tensor-parallel ranks; None when the ratio is 0 (every head
    full: uniform block tables). ConfigError when the model cannot take it."""
    a = cfg.attention
    if a.head_wise_swa_ratio == 0:
        return None
    if family != "gqa":
        raise ConfigError([f"'attention.head_wise_swa_ratio' is {a.head_wise_swa_ratio}: head-wise sliding-window "
                           f"attention needs a GQA model (qwen3, ernie4_5, llama); this checkpoint is {family!r}"])
    local_swa = per_rank_swa_heads(num_kv_heads, swa_heads(a.head_wise_swa_ratio, num_kv_heads), tp_size)
    return HeadWiseSwa(num_kv_heads // tp_size, local_swa, a.sliding_window, a.sink_tokens, cfg.cache.swa_recycle,
                       a.swa_mode == "mask")


def swa_needed_blocks(spec: HeadWiseSwa, num_cached_blocks: int, block_size: int) -> list[int]:
    """Blocks of a cached prefix of ``num_cached_blocks`` blocks that an SWA head must still hold
    for the queries after it: its sink blocks and the blocks of the window (n - W, n)."""
    k = num_cached_blocks
    lo = max(spec.sink_blocks(block_size), spec.first_window_block(k * block_size, block_size))
    return list(range(min(spec.sink_blocks(block_size), k))) + list(range(lo, k))


def usable_hit(spec: HeadWiseSwa, num_hit_blocks: int, held: Callable[[int], bool], block_size: int) -> int:
    """Longest usable prefix hit, in blocks, when the full heads hold the first ``num_hit_blocks``
    blocks and ``held(i)`` says whether every SWA head still holds block ``i``: a hit of k blocks
    is usable iff every block of ``swa_needed_blocks(k)`` is held (vLLM's rule for sliding-window
    layers). O(num_hit_blocks): one pass for the held prefix and the held run ending at each block."""
    sb = spec.sink_blocks(block_size)
    prefix = 0            # blocks 0..prefix-1 all held
    run = [0] * num_hit_blocks   # run[i]: held blocks ending at block i
    for i in range(num_hit_blocks):
        h = held(i)
        run[i] = run[i - 1] + 1 if h and i else int(h)
        if h and prefix == i:
            prefix = i + 1
    for k in range(num_hit_blocks, 0, -1):
        lo = spec.first_window_block(k * block_size, block_size)
        if min(sb, k) <= prefix and k - lo <= run[k - 1]:
            return k
    return 0
