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

Query groups: a short row's tokens go to the decode kernel in groups of ``query_group(H)``
consecutive tokens (``decode.QueryGroups``): the group's tokens x heads share the kernel's head
block, so a KV tile is read once per group, not once per token (4x fewer reads of the cached
context at H=16). The rows taken are capped in tokens (``max_rows``) and in groups (``max_groups``:
a whole group per ``query_group`` tokens plus slack for the partial groups at the rows' ends).

Which rows: the extend rows form one contiguous run for the expanded path, so the short rows taken
are the run right after the decode rows and the run at the end of the batch (the scheduler puts
continuing chunks and new requests in runs); a short row between two long ones stays expanded
(correct, only slower). The pseudo rows are capped (``max_rows``) so their split-KV workspace
stays bounded; rows past the cap stay expanded too.

Per step: the split (and the group count) is decided from host numpy in ``prepare``; each group's
block table row, causal length, first pseudo row and token count are computed on the device by one
kernel from ``cu_seqlens_q`` and ``seq_lens_k`` into buffers sized at start-up, then the decode plan
is built on the device. No host sync and nothing per layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from paddle_mla.platform.triton_host import next_pow2
from paddle_mla.attention.triton_mla.decode import (QueryGroups, alloc_decode_workspace, build_decode_plan,
                                                   decode_config, mla_decode)
from paddle_mla.attention.triton_mla.decode_plan import (fixed_split_group_bytes, fixed_split_tiles,
                                                        fixed_split_workspace, partial_row_bytes)

GROUP_ROWS = 64   # (token, head) rows of one query group: the decode kernel's head block at h >= 64
GROUP_SLACK = 64  # groups beyond max_rows / qg: room for the partial last groups of that many rows

PSEUDO_MAX_KV_SPLITS = 4          # many rows already fill the GPU; few splits keep partials small
PSEUDO_WORKSPACE_BYTES = 256 << 20  # fp32 partial outputs of the pseudo rows


def crossover_tokens(dims) -> int:
    """Largest q for which the absorbed form costs fewer FLOPs than expanding (see module doc)."""
    C, nope, v = dims.kv_lora_rank, dims.qk_nope_head_dim, dims.v_head_dim
    per_q = 2 * C - nope - v
    return max(int((C * (nope + v) - 1) // max(per_q, 1)), 0)


def query_group(num_heads: int) -> int:
    """Tokens per query group: as many as fill GROUP_ROWS rows (1 at 64 heads and more)."""
    return max(GROUP_ROWS // max(num_heads, 1), 1)


def max_pseudo_rows(dims, max_tokens: int) -> int:
    per_row = PSEUDO_MAX_KV_SPLITS * partial_row_bytes(dims.num_heads, dims.kv_lora_rank)
    return max(min(max_tokens, PSEUDO_WORKSPACE_BYTES // per_row), 0)


@dataclass(frozen=True)
class ShortSplit:
    """Host-side split of a step's extend rows (rows ``[lead_end, tail_begin)`` stay expanded)."""

    lead_begin: int      # first extend row (= number of decode rows)
    lead_end: int        # end of the leading short run
    tail_begin: int      # start of the trailing short run (= num_reqs when none)
    lead_tok: tuple      # token range [a, b) of the leading run
    tail_tok: tuple      # token range [a, b) of the trailing run
    groups: int = 0      # query groups of the taken rows (decode-kernel plan rows)

    @property
    def rows(self) -> int:
        return (self.lead_tok[1] - self.lead_tok[0]) + (self.tail_tok[1] - self.tail_tok[0])


def split_short_rows(seq_lens_q: np.ndarray, first_row: int, max_q: int, max_rows: int, qg: int = 1,
                     max_groups: int | None = None, short: np.ndarray | None = None) -> ShortSplit:
    """Short = 1 <= q <= max_q, or the rows ``short`` (bool [B]) marks. Leading run first, then the
    trailing run, within ``max_rows`` tokens and ``max_groups`` query groups of ``qg`` tokens
    (ceil(q / qg) per row)."""
    n = len(seq_lens_q)
    q = seq_lens_q.astype(np.int64)
    cu = np.concatenate([[0], np.cumsum(q)])
    short = (q >= 1) & ((q <= max_q) if short is None else short)
    ng = -(-q // qg)
    budget, gbudget = max_rows, max_rows if max_groups is None else max_groups
    lead_end = first_row
    while lead_end < n and short[lead_end] and q[lead_end] <= budget and ng[lead_end] <= gbudget:
        budget -= q[lead_end]
        gbudget -= ng[lead_end]
        lead_end += 1
    tail_begin = n
    while tail_begin > lead_end and short[tail_begin - 1] and q[tail_begin - 1] <= budget \
            and ng[tail_begin - 1] <= gbudget:
        budget -= q[tail_begin - 1]
        gbudget -= ng[tail_begin - 1]
        tail_begin -= 1
    groups = int(ng[first_row:lead_end].sum() + ng[tail_begin:].sum())
    return ShortSplit(first_row, lead_end, tail_begin, (int(cu[first_row]), int(cu[lead_end])),
                      (int(cu[tail_begin]), int(cu[n])), groups)


@triton.jit(do_not_specialize=["lead_row", "n_lead", "tail_row", "n_rows", "lead_tok", "n_lead_tok", "tail_tok"])
def _gather_groups_kernel(CU_Q, SEQK, BT, BT_OUT, SEQ_OUT, ROW0_OUT, NTOK_OUT, lead_row, n_lead, tail_row, n_rows,
                          lead_tok, n_lead_tok, tail_tok, stride_bt, stride_bto, M,
                          QG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program k: query group k of the short rows (lead run, then tail run; ceil(q / QG) groups per row)."""
    k = tl.program_id(0)
    j = tl.arange(0, BLOCK_R)
    ok = j < n_rows
    row = tl.where(j < n_lead, lead_row + j, tail_row + (j - n_lead))
    c0 = tl.load(CU_Q + row, mask=ok, other=0)
    q = tl.load(CU_Q + row + 1, mask=ok, other=0) - c0
    ng = (q + QG - 1) // QG
    cum = tl.cumsum(ng, axis=0)
    i = tl.sum((cum <= k).to(tl.int32), 0)          # the short row holding group k
    sel = j == i
    b = tl.sum(tl.where(sel, row, 0), 0).to(tl.int64)
    c0_i = tl.sum(tl.where(sel, c0, 0), 0)
    q_i = tl.sum(tl.where(sel, q, 0), 0)
    first = (k - tl.sum(tl.where(sel, cum - ng, 0), 0)) * QG   # the group's first token within its row
    ntok = tl.minimum(q_i - first, QG)
    t = c0_i + first                                  # its packed token index
    r0 = tl.where(i < n_lead, t - lead_tok, n_lead_tok + t - tail_tok)
    # new tokens end the sequence: the group's last token has causal length seq_len - (q - first - ntok)
    tl.store(SEQ_OUT + k, tl.load(SEQK + b) - (q_i - first - ntok))
    tl.store(ROW0_OUT + k, r0)
    tl.store(NTOK_OUT + k, ntok)
    for m0 in range(0, M, BLOCK_M):
        offs = m0 + tl.arange(0, BLOCK_M)
        mask = offs < M
        tl.store(BT_OUT + k * stride_bto + offs, tl.load(BT + b * stride_bt + offs, mask=mask), mask=mask)


class PseudoRows:
    """Buffers for the pseudo decode rows, sized at start-up: ``max_rows`` token rows in at most
    ``max_groups`` query groups."""

    def __init__(self, dims, max_rows: int, max_blocks: int, device: str, dtype, max_seqs: int = 1,
                 split_tokens: int = 0, max_len: int = 0, cuda=None):
        """``split_tokens`` > 0: the batch-invariant plan (``decode_plan.fixed_split_tiles``) over
        contexts of at most ``max_len`` keys, and room for a partial group in every row. ``cuda``: a
        ``cuda_decode.CudaDecode`` to run the rows with (one token a row: its programs hold the heads
        of one token), planned into this object's workspaces; None: the Triton decode kernel."""
        H, L = dims.num_heads, dims.kv_lora_rank
        self.cuda = cuda
        self.qg = 1 if cuda else query_group(H)
        self.cfg = decode_config(self.qg * H, elem_bytes=torch.zeros(1, dtype=dtype).element_size())
        if cuda:   # the plan's tile and grid are the CUDA launch's
            launch = cuda.launch
            self.cfg = dataclasses.replace(self.cfg, block_n=launch.block_n, programs=launch.programs,
                                           min_tiles=launch.min_tiles)
        self.max_rows = max_rows
        slack = max(GROUP_SLACK, max_seqs) if split_tokens else GROUP_SLACK
        self.max_groups = min(max_rows, max_rows // self.qg + slack)
        self.fixed_tiles = fixed_split_tiles(split_tokens, self.cfg.block_n) if split_tokens else 0
        self.block_r = next_pow2(max(max_seqs, 16))
        rows = max(max_rows, 1)
        groups = max(self.max_groups, 1)
        i32 = torch.int32
        if split_tokens:
            # every group may take all its fixed splits, so the partials grow with max_len: the groups
            # go through the kernel in chunks that fit PSEUDO_WORKSPACE_BYTES, each with its own plan
            # (built in ``plan``), all sharing one workspace's partials. A group's bits do not depend
            # on its chunk: its splits and their merge order are its own.
            self.chunk = max(1, min(groups, PSEUDO_WORKSPACE_BYTES // fixed_split_group_bytes(
                self.qg * H, L, max_len, split_tokens, self.cfg.block_n)))
            self.ws = fixed_split_workspace(self.chunk, self.qg * H, L, max_len, split_tokens, self.cfg.block_n,
                                            device)
        else:
            self.chunk = groups
            self.ws = alloc_decode_workspace(groups, self.qg * H, L, PSEUDO_MAX_KV_SPLITS, device,
                                             programs=self.cfg.programs)
        self.chunk_ws = [self.ws] + [dataclasses.replace(  # own plan arrays, shared partials
            self.ws, num_kv_splits=torch.ones_like(self.ws.num_kv_splits), cu_tiles=torch.zeros_like(self.ws.cu_tiles),
            split_start=torch.zeros_like(self.ws.split_start), tiles_per_prog=torch.ones_like(self.ws.tiles_per_prog))
            for _ in range(1, -(-groups // self.chunk))]
        self.tables = torch.zeros(groups, max(max_blocks, 1), dtype=i32, device=device)
        self.seq_lens = torch.zeros(groups, dtype=i32, device=device)
        self.row0 = torch.zeros(groups, dtype=i32, device=device)
        self.ntok = torch.zeros(groups, dtype=i32, device=device)
        self.q = torch.zeros(rows, H, dims.latent_dim, dtype=dtype, device=device)
        self.o = torch.zeros(rows, H, L, dtype=dtype, device=device)

    def _chunks(self, split: ShortSplit):
        """(first group, group count, workspace) of each launch over the step's groups."""
        for i, g0 in enumerate(range(0, split.groups, self.chunk)):
            yield g0, min(self.chunk, split.groups - g0), self.chunk_ws[i]

    def plan(self, split: ShortSplit) -> None:
        """The decode plan of every chunk of the step's groups (device, once per step)."""
        for g0, n, ws in self._chunks(split):
            if self.cuda:
                self.cuda.plan(self.seq_lens[g0:], n, ws=ws)
            else:
                build_decode_plan(self.seq_lens[g0:], n, ws, self.cfg.block_n, self.cfg.target_items,
                                  self.cfg.min_tiles, self.fixed_tiles)

    def decode(self, q, kv_cache, out, kv_lora_rank: int, sm_scale: float, split: ShortSplit) -> None:
        """Attention of the pseudo rows ``q`` into ``out``, chunk by chunk (plans from ``plan``)."""
        for g0, n, ws in self._chunks(split):
            if self.cuda:   # one token a group: group g0 + i is pseudo row g0 + i
                self.cuda.run(q[g0:], kv_cache, self.tables[g0:], self.seq_lens[g0:], out[g0:], n, sm_scale, ws=ws)
            else:
                mla_decode(q, kv_cache, self.tables[g0:], self.seq_lens[g0:], out, ws, kv_lora_rank, sm_scale,
                           self.cfg, QueryGroups(self.row0[g0:], self.ntok[g0:], self.qg, n))

    def gather(self, meta, split: ShortSplit) -> None:
        """Block-table rows, causal lengths, first rows and token counts of the groups (device, once per step)."""
        n_lead = split.lead_end - split.lead_begin
        n_rows = n_lead + meta.num_reqs - split.tail_begin
        assert n_rows <= self.block_r, "more short rows than max_num_seqs"
        bt = meta.block_tables
        M = bt.shape[1]
        if M > self.tables.shape[1]:
            # sized from max_model_len at start-up; a wider table (padding) grows it once, not per step
            self.tables = torch.zeros(self.tables.shape[0], M, dtype=torch.int32, device=self.tables.device)
        _gather_groups_kernel[(split.groups,)](
            meta.cu_seqlens_q, meta.seq_lens_k_dev, bt, self.tables, self.seq_lens, self.row0, self.ntok,
            split.lead_begin, n_lead, split.tail_begin, n_rows,
            split.lead_tok[0], split.lead_tok[1] - split.lead_tok[0], split.tail_tok[0],
            bt.stride(0), self.tables.stride(0), M,
            QG=self.qg, BLOCK_R=self.block_r, BLOCK_M=min(next_pow2(max(M, 16)), 1024),
        )
