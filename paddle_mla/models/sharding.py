"""Which part of each checkpoint tensor a tensor-parallel rank holds (plain Python, no tensors).

Megatron-style splits of the DeepSeek layers over ``size`` ranks:
- MLA: ``q_proj`` / ``q_b_proj`` and ``kv_b_proj`` are column-parallel (rows = output features,
  split by heads); ``o_proj`` is row-parallel (its input columns split by heads; the partial outputs
  are all-reduced). ``q_a_proj`` / ``kv_a_proj_with_mqa`` and their norms are replicated: every
  rank computes the same latent and keeps the whole latent cache (see ``paddle_mla.parallel.group``).
- MLPs (dense, shared experts, routed experts): ``gate_proj`` / ``up_proj`` split by the
  intermediate dim (rows), ``down_proj`` by its input columns; one all-reduce per block.
- ``embed_tokens`` and ``lm_head``: vocabulary-parallel (rows split by token id).
- GQA (qwen3, ernie4_5, llama and their MoE): KV heads split (``num_key_value_heads`` % size == 0,
  never replicated), q heads with their groups; q/k/v projections and their biases column-parallel,
  ``o_proj`` row-parallel; per-head q/k norms replicated (no collective). With head-wise SWA
  (``swa_kv_heads`` > 0: the last ones are SWA heads) a rank holds its share of the full heads and
  then its share of the SWA heads (two ranges), so every rank has the same number of each, its SWA
  heads last: the attention time and KV memory of the ranks stay equal, and each rank runs the
  same local plan (``cache.swa.per_rank_swa_heads``).
- Everything else (norms, the router, the V3.2 indexer, o_proj / down_proj biases) is replicated.

Expert parallel (``expert_parallel``): the routed experts are placed whole, rank r holding the
contiguous id range ``expert_range(E, r, size)``; shared experts, dense MLPs and attention keep the
splits above.

Attention split by rows (``attention_rows``, MLA only: ``parallel.attention_split: rows``): every
attention weight is replicated (a rank attends its share of the step's tokens with all heads); the
MLPs, experts, embedding and LM head keep the splits above.

Splits are contiguous ranges (the GQA heads' two under head-wise SWA); the vocabulary and MLP ranges
may be uneven (ceil-sized chunks, the last rank takes the rest); heads must divide evenly. 1-D
tensors are only split as GQA / MLP biases.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from paddle_mla.cache.swa import per_rank_swa_heads

_LAYER_NAME = re.compile(r"^model\.layers\.\d+\.")


@dataclass(frozen=True)
class Shard:
    """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of a 2-D checkpoint tensor, then
    ``[start2, stop2)`` when that is not empty (a rank's SWA heads after its full heads)."""

    dim: int
    start: int
    stop: int
    start2: int = 0
    stop2: int = 0

    @property
    def contiguous(self) -> bool:
        return self.stop2 == self.start2

    @property
    def size(self) -> int:
        return self.stop - self.start + self.stop2 - self.start2

    def shape(self, full: list[int]) -> list[int]:
        out = list(full)
        out[self.dim] = self.size
        return out

    def numpy_index(self) -> tuple:
        if self.contiguous:
            return (slice(None),) * self.dim + (slice(self.start, self.stop),)
        return (slice(None),) * self.dim + (list(range(self.start, self.stop)) + list(range(self.start2, self.stop2)),)


def split_range(n: int, rank: int, size: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s ceil-sized chunk of ``n`` (the last rank takes the rest)."""
    chunk = -(-n // size)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


def expert_range(num_experts: int, rank: int, size: int) -> tuple[int, int]:
    """[first, stop) of the routed experts ``rank`` holds under expert parallelism (may be empty
    when there are more ranks than experts: that rank then adds nothing to the routed sum)."""
    return split_range(num_experts, rank, size)


def vocab_chunk(vocab_size: int, size: int) -> int:
    """Rows of every rank's (padded) LM-head shard, so the gathered logits have equal parts."""
    return -(-vocab_size // size)


def check_tp_arch(arch, size: int, attention_rows: bool = False) -> None:
    """A clear error when ``arch`` cannot be split ``size`` ways (before any weight is read);
    ``attention_rows``: the heads stay whole, so any head count splits."""
    if attention_rows and arch.family == "gqa":
        raise ValueError(f"parallel.attention_split 'rows' needs an MLA model (deepseek_v2 / deepseek_v3); "
                         f"{arch.model_type} splits its KV heads: use attention_split 'heads'")
    if attention_rows and arch.indexer is not None:
        raise ValueError(f"parallel.attention_split 'rows' does not serve {arch.model_type}'s sparse "
                         f"attention (the indexer's per-step key windows follow the whole step): use "
                         f"attention_split 'heads'")
    if arch.family == "gqa":
        # KV heads are split, never replicated: tp > num_key_value_heads is refused like any non-divisor
        kv = arch.gqa.num_kv_heads
        if kv % size:
            raise ValueError(f"parallel.tensor_parallel_size {size} must divide num_key_value_heads {kv} "
                             f"({arch.model_type}: KV heads are split over the ranks, not replicated)")
    elif not attention_rows and arch.mla.num_heads % size:
        raise ValueError(f"parallel.tensor_parallel_size {size} must divide num_attention_heads {arch.mla.num_heads}")
    if arch.vocab_size < size:
        raise ValueError(f"parallel.tensor_parallel_size {size} exceeds vocab_size {arch.vocab_size}")


def local_arch(arch, size: int, attention_rows: bool = False):
    """``arch`` as one rank sees it: its share of the attention heads (GQA: of the q and KV heads, so
    its KV cache holds only its KV heads; ``attention_rows``: all of them); everything else
    unchanged, vocab_size included: the sampler sees gathered full-vocabulary logits."""
    if size == 1:
        return arch
    check_tp_arch(arch, size, attention_rows)
    if attention_rows:
        return arch
    if arch.family == "gqa":
        g = arch.gqa
        return dataclasses.replace(arch, gqa=dataclasses.replace(
            g, num_heads=g.num_heads // size, num_kv_heads=g.num_kv_heads // size))
    return dataclasses.replace(arch, mla=dataclasses.replace(arch.mla, num_heads=arch.mla.num_heads // size))


def _mlp_shard(name: str, shape: list[int], rank: int, size: int) -> Shard | None:
    """Dense, shared and per-expert MLPs: gate/up rows (and their biases), down columns; the down
    bias is replicated (the model adds it on one rank only)."""
    if name.endswith(("gate_proj.weight", "up_proj.weight", "gate_proj.bias", "up_proj.bias")):
        return Shard(0, *split_range(shape[0], rank, size))
    if name.endswith("down_proj.weight"):
        return Shard(1, *split_range(shape[1], rank, size))
    return None


def _head_ranges(arch, rank: int, size: int, swa_kv_heads: int) -> tuple[int, int, int, int]:
    """``rank``'s KV heads as two ranges [a, b) + [c, d): its share of the full heads, then of the
    SWA heads (the second empty without SWA heads, the first without full heads)."""
    n = arch.gqa.num_kv_heads
    swa = per_rank_swa_heads(n, swa_kv_heads, size)
    full = (n - swa_kv_heads) // size
    first_swa = n - swa_kv_heads
    if full == 0:      # every head an SWA head: one contiguous range
        return rank * swa, (rank + 1) * swa, 0, 0
    if swa == 0:
        return rank * full, (rank + 1) * full, 0, 0
    return rank * full, (rank + 1) * full, first_swa + rank * swa, first_swa + (rank + 1) * swa


def _gqa_shard(name: str, arch, rank: int, size: int, swa_kv_heads: int = 0) -> Shard | None:
    """q heads split with their groups (q head i belongs to KV head i // group: a rank's q heads are
    exactly those of its KV heads, in their order); q/k/v rows and biases column-parallel, o_proj
    columns row-parallel (its bias replicated, added once)."""
    d = arch.gqa
    group = d.num_heads // d.num_kv_heads
    a, b, c, e = _head_ranges(arch, rank, size, swa_kv_heads)
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.o_proj.weight")):
        unit = group * d.head_dim
        return Shard(1 if name.endswith("o_proj.weight") else 0, a * unit, b * unit, c * unit, e * unit)
    if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias",
                      "self_attn.v_proj.weight", "self_attn.v_proj.bias")):
        return Shard(0, a * d.head_dim, b * d.head_dim, c * d.head_dim, e * d.head_dim)
    return None


def checkpoint_shard(name: str, shape: list[int], arch, rank: int, size: int,
                     expert_parallel: bool = False, swa_kv_heads: int = 0,
                     attention_rows: bool = False) -> Shard | None:
    """The slice of checkpoint tensor ``name`` (of ``shape``) that ``rank`` holds; None: all of it
    (under ``expert_parallel`` a routed expert is whole; which experts a rank loads at all is
    ``expert_range``'s). ``swa_kv_heads``: the model's head-wise SWA heads (GQA), balanced over ranks.
    ``attention_rows``: the attention weights are whole on every rank."""
    if size == 1 or len(shape) not in (1, 2):
        return None
    if len(shape) == 2 and name in ("model.embed_tokens.weight", "lm_head.weight"):
        return Shard(0, *split_range(shape[0], rank, size))
    if not _LAYER_NAME.match(name):
        return None
    if expert_parallel and ".mlp.experts." in name:
        return None
    if ".mlp." in name:
        return _mlp_shard(name, shape, rank, size)
    if arch.family == "gqa":
        return _gqa_shard(name, arch, rank, size, swa_kv_heads)
    if len(shape) != 2 or attention_rows:
        return None
    d = arch.mla
    heads = d.num_heads // size
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
        per = d.qk_nope_head_dim + d.qk_rope_head_dim
        return Shard(0, rank * heads * per, (rank + 1) * heads * per)
    if name.endswith("self_attn.kv_b_proj.weight"):
        per = d.qk_nope_head_dim + d.v_head_dim
        return Shard(0, rank * heads * per, (rank + 1) * heads * per)
    if name.endswith("self_attn.o_proj.weight"):
        return Shard(1, rank * heads * d.v_head_dim, (rank + 1) * heads * d.v_head_dim)
    return None


def scale_shard(shard: Shard | None, full_shape: list[int], block: tuple[int, int]) -> Shard | None:
    """The block-scale rows/columns of an FP8 weight's ``shard``; None when the shard is not one range
    that starts and ends on block boundaries (the caller dequantizes the whole weight, then slices)."""
    if shard is None or not shard.contiguous:
        return None
    b = block[shard.dim]
    if shard.start % b or (shard.stop % b and shard.stop != full_shape[shard.dim]):
        return None
    return Shard(shard.dim, shard.start // b, -(-shard.stop // b))
