"""Short extend rows (a few new tokens over a long cached context) through the decode kernel.

An extend row whose new tokens are few costs less in absorbed form than expanded. Per layer and
head, with ctx keys and q new tokens:
  expanded: ctx * C * (nope + v) * 2       (kv_b_proj over the whole context)
            + q * ctx * (nope + rope + v) * 2  (attention)
  absorbed: q * ctx * ((C + rope) + C) * 2  (scores over the latent, output in latent space)
so absorbed wins while q * (2C + rope - nope - rope - v) < C * (nope + v), independent of ctx:
``crossover_tokens`` (170 tokens at DeepSeek V2/V3 dims). Each new token t of such a row becomes a
pseudo decode row: absorbed q, block table row = the request's, seq_len = position(t) + 1
(causal; the step's latent is already in the cache when attention runs).

Which rows: the extend rows form one contiguous run for the expanded path, so the short rows taken
are the run right after the decode rows and the run at the end of the batch (the scheduler puts
continuing chunks and new requests in runs); a short row between two long ones stays expanded
(correct, only slower). The pseudo rows are capped (``max_rows``) so their split-KV workspace
stays bounded; rows past the cap stay expanded too.

Per step: the split is decided from host numpy in ``prepare``; the block tables and seq lens of
the pseudo rows are gathered on the device by one kernel from ``batch_id_per_token`` and
``positions`` into buffers sized at start-up, then the decode plan is built on the device. No host
sync and nothing per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from paddle_mla.attention.triton_mla._util import next_pow2

PSEUDO_MAX_KV_SPLITS = 4          # many rows already fill the GPU; few splits keep partials small
PSEUDO_WORKSPACE_BYTES = 256 << 20  # fp32 partial outputs of the pseudo rows


def crossover_tokens(dims) -> int:
    """Largest q for which the absorbed form costs fewer FLOPs than expanding (see module doc)."""
    C, nope, v = dims.kv_lora_rank, dims.qk_nope_head_dim, dims.v_head_dim
    per_q = 2 * C - nope - v
    return max(int((C * (nope + v) - 1) // max(per_q, 1)), 0)


def max_pseudo_rows(dims, max_tokens: int) -> int:
    per_row = dims.num_heads * PSEUDO_MAX_KV_SPLITS * dims.kv_lora_rank * 4
    return max(min(max_tokens, PSEUDO_WORKSPACE_BYTES // per_row), 0)


@dataclass(frozen=True)
class ShortSplit:
    """Host-side split of a step's extend rows (rows ``[lead_end, tail_begin)`` stay expanded)."""

    lead_begin: int      # first extend row (= number of decode rows)
    lead_end: int        # end of the leading short run
    tail_begin: int      # start of the trailing short run (= num_reqs when none)
    lead_tok: tuple      # token range [a, b) of the leading run
    tail_tok: tuple      # token range [a, b) of the trailing run

    @property
    def rows(self) -> int:
        return (self.lead_tok[1] - self.lead_tok[0]) + (self.tail_tok[1] - self.tail_tok[0])


def split_short_rows(seq_lens_q: np.ndarray, first_row: int, max_q: int, max_rows: int) -> ShortSplit:
    """Short = 1 <= q <= max_q. Leading run first, then the trailing run, within ``max_rows`` tokens."""
    n = len(seq_lens_q)
    q = seq_lens_q.astype(np.int64)
    cu = np.concatenate([[0], np.cumsum(q)])
    short = (q >= 1) & (q <= max_q)
    budget = max_rows
    lead_end = first_row
    while lead_end < n and short[lead_end] and q[lead_end] <= budget:
        budget -= q[lead_end]
        lead_end += 1
    tail_begin = n
    while tail_begin > lead_end and short[tail_begin - 1] and q[tail_begin - 1] <= budget:
        budget -= q[tail_begin - 1]
        tail_begin -= 1
    return ShortSplit(first_row, lead_end, tail_begin, (int(cu[first_row]), int(cu[lead_end])),
                      (int(cu[tail_begin]), int(cu[n])))


@triton.jit
def _gather_rows_kernel(BATCH_ID, POS, BT, BT_OUT, SEQ_OUT, lead_tok, n_lead, tail_tok, stride_bt, stride_bto,
                        M, BLOCK_M: tl.constexpr):
    r = tl.program_id(0)
    t = tl.where(r < n_lead, lead_tok + r, tail_tok + (r - n_lead)).to(tl.int64)
    b = tl.load(BATCH_ID + t).to(tl.int64)
    tl.store(SEQ_OUT + r, (tl.load(POS + t) + 1).to(tl.int32))
    for m0 in range(0, M, BLOCK_M):
        offs = m0 + tl.arange(0, BLOCK_M)
        mask = offs < M
        tl.store(BT_OUT + r * stride_bto + offs, tl.load(BT + b * stride_bt + offs, mask=mask), mask=mask)


class PseudoRows:
    """Buffers for the pseudo decode rows, sized at start-up (``max_rows`` rows)."""

    def __init__(self, dims, max_rows: int, max_blocks: int, device: str, dtype, programs: int = 0):
        from paddle_mla.attention.triton_mla.decode import alloc_decode_workspace

        H, L = dims.num_heads, dims.kv_lora_rank
        self.max_rows = max_rows
        rows = max(max_rows, 1)
        self.ws = alloc_decode_workspace(rows, H, L, PSEUDO_MAX_KV_SPLITS, device, programs=programs)
        self.tables = torch.zeros(rows, max(max_blocks, 1), dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.q = torch.zeros(rows, H, dims.latent_dim, dtype=dtype, device=device)
        self.o = torch.zeros(rows, H, L, dtype=dtype, device=device)

    def gather(self, meta, split: ShortSplit) -> None:
        """Block-table rows and seq lens of the pseudo rows (device, once per step)."""
        n = split.rows
        n_lead = split.lead_tok[1] - split.lead_tok[0]
        bt = meta.block_tables
        M = bt.shape[1]
        if M > self.tables.shape[1]:
            # sized from max_model_len at start-up; a wider table (padding) grows it once, not per step
            self.tables = torch.zeros(self.tables.shape[0], M, dtype=torch.int32, device=self.tables.device)
        _gather_rows_kernel[(n,)](
            meta.batch_id_per_token, meta.positions, bt, self.tables, self.seq_lens,
            split.lead_tok[0], n_lead, split.tail_tok[0], bt.stride(0), self.tables.stride(0), M,
            BLOCK_M=min(next_pow2(max(M, 16)), 1024),
        )
