"""Attention split by rows under tensor parallelism (``parallel.attention_split: rows``, MLA).

Split by heads (the default), every rank attends every token with 1/N of the heads, and so reads
the whole latent cache each layer: MLA's one latent a token serves all heads, and the rank's
attention time does not shrink with N. Split by rows, rank r attends token rows
``[r * chunk, (r + 1) * chunk)`` of the step (``chunk = ceil(T / N)``) with all heads, and reads
only the cache of those rows' requests: 1/N of the bytes when the rows' contexts are alike (the cut
counts tokens, not context: rows 0-31 at 8k and 32-63 at 200 tokens put nearly every byte on rank
0, which then sets the step). The MLPs stay tensor-parallel on every
token: after attention each rank's o_proj output (whole o_proj, its bias once) is all-gathered
(``TPGroup.gather_rows``) in place of the o_proj all-reduce, so a layer still has two collectives.

The cut falls at token rows, not requests: a prompt chunk may be attended partly on one rank and
partly on the next. Its part on rank r is a request whose first ``offset`` new tokens count as
cached (``share_batch``). That is exact because every rank first writes the latents of every token
of the step into its own copy of the cache (``MLABackend.write_cache``), as under the head split:
the cache stays replicated, so the scheduler, block tables, prefix cache and preemption are those of
one engine, and a request may be attended on a different rank every step. The cost is the cache's
memory, which does not shrink with N (SGLang's DP-attention shrinks it too, with a scheduler and a
block pool per rank).

``build_share`` runs on the host once per step, from the step's plain data, the same on every rank;
CUDA-graph decode steps use static shares of the graph's buffers (``worker.cuda_graph``): a decode
row is one token, so rank r's share is rows ``[r * chunk, (r + 1) * chunk)`` of them, the rows
past the step padded as the graph pads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_mla.attention.forward_meta import StepBatch, build_step


@dataclass
class RowShare:
    """One rank's share of a step's token rows, ``[start, stop)`` of ``num_tokens``. Every rank's
    share counts ``chunk`` rows in the gather (the last ranks' padded); ``meta``: the attention
    metadata of the share's rows (None: this rank attends nothing this step)."""

    start: int
    stop: int
    chunk: int
    num_tokens: int
    meta: Any = None


def share_range(num_tokens: int, rank: int, size: int) -> tuple[int, int, int]:
    """(start, stop, chunk): rank ``rank``'s token rows of ``num_tokens`` split ``size`` ways."""
    chunk = -(-num_tokens // size)
    start = min(rank * chunk, num_tokens)
    return start, min(start + chunk, num_tokens), chunk


def share_batch(batch: StepBatch, start: int, stop: int) -> StepBatch:
    """The parts of ``batch``'s requests over token rows [start, stop): each request that has new
    tokens there, its tokens before ``start`` counted as cached (their latents are in the cache by
    then), its block table row whole. Nothing samples: the logits come from the whole step."""
    ends = np.cumsum(batch.num_new, dtype=np.int64)
    begins = ends - batch.num_new
    rows = np.flatnonzero((ends > start) & (begins < stop) & (batch.num_new > 0))
    lo, hi = np.maximum(begins[rows], start), np.minimum(ends[rows], stop)
    return StepBatch(token_ids=batch.token_ids[start:stop], num_new=(hi - lo).astype(np.int32),
                     num_cached=(batch.num_cached[rows] + (lo - begins[rows])).astype(np.int32),
                     block_tables=batch.block_tables[rows], is_prefill=batch.is_prefill[rows],
                     sample_mask=np.zeros(len(rows), dtype=bool),
                     prompt_lens=None if batch.prompt_lens is None else batch.prompt_lens[rows])


def build_share(batch: StepBatch, rank: int, size: int, block_size: int, device: str, uploader=None) -> RowShare:
    """Rank ``rank``'s share of the step ``batch`` with its attention metadata (its own upload)."""
    num_tokens = int(batch.num_new.sum())
    start, stop, chunk = share_range(num_tokens, rank, size)
    share = RowShare(start, stop, chunk, num_tokens)
    if stop > start:
        share.meta = build_step(share_batch(batch, start, stop), block_size, device, uploader=uploader)[0]
        share.meta.latents_written = True
    return share

