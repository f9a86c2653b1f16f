"""Decode steps replayed as CUDA graphs.

Graphs are captured at start-up for the plan's batch sizes (1, 2, 4, 8, 16, ... up to
``max_num_seqs``: ``worker.plan.capture_sizes``), over static metadata buffers, each recording the
runner's one model call on them. A decode step of ``bs`` requests copies its freshly built metadata into
the first ``bs`` rows, pads to the next captured size (padded rows: length 0 and slot -1, so they
write nothing and attend to nothing), replays, and reads the first ``bs`` rows of the logits.
``backend.prepare`` is part of the graph, so the split plan is rebuilt on the GPU at each replay.
Under ``parallel.attention_split: rows`` each graph also holds this rank's static share of the rows
(``attention.row_share``): the graph runs ``ranks * ceil(size / ranks)`` rows (padded like the
rest), of which rank r attends ``[r * chunk, (r + 1) * chunk)``.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

from paddle_mla.attention.forward_meta import ForwardMeta  # noqa: E402
from paddle_mla.attention.row_share import RowShare  # noqa: E402


class DecodeGraphs:
    def __init__(self, forward_meta: Callable[[ForwardMeta], Any], sizes: Sequence[int], max_blocks_per_seq: int,
                 block_size: int, device: str, num_table_heads: int = 0, share: tuple[int, int] | None = None):
        """``forward_meta``: the runner's model call on a step's metadata (``ModelRunner._forward_meta``:
        prepare, every layer, the logits of every row), captured once per size of ``sizes`` (the
        plan's ``cuda_graph_sizes``). ``num_table_heads`` > 0: head-wise block tables [bs, heads,
        max_blocks] (head-wise SWA). ``share``: (rank, ranks) when attention is split by rows."""
        self.sizes = list(sizes)
        self.share = share
        n, i32, i64 = self._padded(self.sizes[-1]), torch.int32, torch.int64
        self.input_ids = torch.zeros(n, dtype=i64, device=device)
        self.positions = torch.zeros(n, dtype=i64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=i64, device=device)
        heads = (num_table_heads,) if num_table_heads else ()
        self.block_tables = torch.zeros(n, *heads, max_blocks_per_seq, dtype=i32, device=device)
        self.seq_lens_k = torch.zeros(n, dtype=i32, device=device)
        self.cu_seqlens = torch.arange(n + 1, dtype=i32, device=device)
        self.batch_ids = torch.arange(n, dtype=i32, device=device)
        self.rows = torch.arange(n, dtype=i64, device=device)
        self.graphs: dict[int, _runtime.CudaGraph] = {}
        self.logits: dict[int, object] = {}
        pool = None
        for bs in reversed(self.sizes):       # largest first, so smaller graphs reuse its memory pool
            rows = self._padded(bs)           # under a row share: every rank's share whole
            meta = self._static_meta(rows, block_size)
            if share is not None:
                chunk = rows // share[1]
                start = share[0] * chunk
                attended = self._static_meta(chunk, block_size, start)
                attended.latents_written = True
                meta.share = RowShare(start, start + chunk, chunk, rows, attended)
            graph = _runtime.CudaGraph(pool)
            self.logits[bs] = graph.capture(lambda meta=meta: forward_meta(meta))
            self.graphs[bs] = graph
            pool = pool or graph.pool_handle()

    def _padded(self, bs: int) -> int:
        """Rows a graph of ``bs`` rows touches: ``bs``, or every rank's whole share of them."""
        if self.share is None:
            return bs
        ranks = self.share[1]
        return ranks * -(-bs // ranks)

    def _static_meta(self, bs: int, block_size: int, first: int = 0) -> ForwardMeta:
        """Rows [first, first + bs) of the buffers as a decode step's metadata."""
        ones, end = np.ones(bs, dtype=np.int32), first + bs
        return ForwardMeta(
            num_reqs=bs, num_tokens=bs, block_size=block_size, seq_lens_q=ones, num_cached=ones, seq_lens_k=ones * 2,
            max_seqlen_q=1, max_seqlen_k=2, is_decode_only=True, sample_mask=ones.astype(bool),
            input_ids=self.input_ids[first:end], positions=self.positions[first:end],
            cu_seqlens_q=self.cu_seqlens[:bs + 1], cu_seqlens_k=self.cu_seqlens[:bs + 1],
            batch_id_per_token=self.batch_ids[:bs], slot_mapping=self.slot_mapping[first:end],
            block_tables=self.block_tables[first:end], seq_lens_k_dev=self.seq_lens_k[first:end],
            logits_indices=self.rows[:bs],
        )

    def can_run(self, meta: ForwardMeta) -> bool:
        return meta.is_decode_only and meta.num_reqs <= self.sizes[-1]

    def run(self, meta: ForwardMeta):
        """Logits [bs, vocab] of a decode step (a view into the graph's output; read it before the next run)."""
        bs = meta.num_reqs
        gbs = self.sizes[bisect.bisect_left(self.sizes, bs)]
        width = meta.block_tables.shape[-1]
        self.input_ids[:bs].copy_(meta.input_ids)
        self.positions[:bs].copy_(meta.positions)
        self.slot_mapping[:bs].copy_(meta.slot_mapping)
        self.block_tables[:bs, ..., :width].copy_(meta.block_tables)
        self.seq_lens_k[:bs].copy_(meta.seq_lens_k_dev)
        end = self._padded(gbs)
        if end > bs:
            self.slot_mapping[bs:end].fill_(-1)
            self.seq_lens_k[bs:end].fill_(0)
            self.input_ids[bs:end].fill_(0)
            self.positions[bs:end].fill_(0)
        self.graphs[gbs].replay()
        return self.logits[gbs][:bs]

