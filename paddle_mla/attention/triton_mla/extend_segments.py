"""Prompt tokens under ``deterministic: true``: the expanded extend (``extend.py``), with every bound
a query's bits depend on fixed by its position alone.

``extend.py`` chunks the step's packed keys where the workspace fills, so the merges a query goes
through, and the key tiles its kernel walks, follow the other requests and where its own chunk
began. Here each request's keys are cut into segments of ``SEGMENT_TOKENS`` positions from key 0:
  1. round s takes segment s, positions [s * S, (s + 1) * S), of every extend row that has keys
     there, as a piece; the pieces are packed into launches of at most the workspace's rows (a
     piece never splits: S <= the workspace);
  2. each launch gathers its pieces' latent rows (``interleave.read_pieces``), expands them with
     the batch-invariant GEMM (its bits do not follow the row count) and attends
     (``prefill.extend_pieces``: query blocks at absolute positions, key tiles from the segment's
     start);
  3. round 0 writes each query's partial output and log-sum-exp; later rounds fold theirs in, one
     segment at a time, left to right.
So a prompt token computes the same chain of tiles, masks and merges whether its prompt runs whole
or in chunks, alone or in a batch of 256, after a prefix-cache hit or not: the expanded path's
FLOPs (192 + 128 dims a head against the absorbed 576 + 512) with decode's batch invariance.

The records of every launch of a step are planned on the host from the scheduler's lengths and go
up in one copy (``prepare``); nothing here reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_mla.attention.triton_mla.interleave import read_pieces
from paddle_mla.attention.triton_mla.prefill import PIECE_FIELDS, config_for_dims, extend_pieces
from paddle_mla.ops import batch_invariant

SEGMENT_TOKENS = 2048   # = extend.CHUNK_TOKENS_MIN: a piece always fits the workspace


@dataclass(frozen=True)
class Launch:
    first: int        # first record of the launch in the step's record array
    count: int        # its pieces
    rows: int         # key rows they fill in the workspace
    merge: bool       # a later round: fold into the stored partials


@dataclass(frozen=True)
class SegmentPlan:
    records: np.ndarray          # int32 [pieces, PIECE_FIELDS]
    launches: tuple[Launch, ...]
    max_seqlen_q: int
    rounds: int

    @property
    def empty(self) -> bool:
        return not self.launches


def plan_segments(seq_lens_q: np.ndarray, seq_lens_k: np.ndarray, rows: np.ndarray, segment: int,
                  capacity: int) -> SegmentPlan:
    """Pieces and launches for the batch rows ``rows`` (indices into the step's rows), segments of
    ``segment`` positions, launches of at most ``capacity`` key rows. Host numpy only."""
    assert segment <= capacity, "a segment must fit the workspace"
    q = seq_lens_q.astype(np.int64)
    q0 = np.concatenate([[0], np.cumsum(q)])[:-1]
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[q[rows] > 0]
    k = seq_lens_k.astype(np.int64)
    parts, launches, first = [], [], 0
    rounds = int(-(-k[rows].max(initial=0) // segment))
    for s in range(rounds):
        lo = s * segment
        # a row's first query sits at k - q: rounds wholly before it still hold keys it sees
        sel = rows[k[rows] > lo]
        hi = np.minimum(k[sel], lo + segment)
        cum = np.concatenate([[0], np.cumsum(hi - lo)])     # the round's pieces end to end
        row0 = np.empty_like(hi)
        a = 0
        while a < len(sel):     # greedy: each launch takes the most pieces that fit (one a step)
            b = int(np.searchsorted(cum, cum[a] + capacity, side="right")) - 1
            row0[a:b] = cum[a:b] - cum[a]
            launches.append(Launch(first + a, b - a, int(cum[b] - cum[a]), s > 0))
            a = b
        parts.append(np.stack([q0[sel], q[sel], k[sel], np.full_like(sel, lo), hi, row0, sel,
                               np.zeros_like(sel)], axis=1))
        first += len(sel)
    records = np.concatenate(parts).astype(np.int32) if parts else np.zeros((0, PIECE_FIELDS), np.int32)
    return SegmentPlan(records, tuple(launches), int(q[rows].max(initial=0)), rounds)


class SegmentedExtend:
    """Runs ``SegmentPlan``s of segments of ``segment_tokens`` keys (0: ``SEGMENT_TOKENS``) with an
    ``extend.ExtendWorkspace``'s buffers; its own ``platform.staging.Uploader`` carries the step's
    one copy of the records."""

    def __init__(self, workspace, device: str, segment_tokens: int = 0):
        from paddle_mla.platform.staging import Uploader

        d = workspace.dims
        self.segment_tokens = segment_tokens or SEGMENT_TOKENS
        tile = config_for_dims(d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim,
                               workspace.latent.element_size()).block_n
        if self.segment_tokens > workspace.chunk_tokens or self.segment_tokens % tile:
            raise ValueError(f"segment_tokens {self.segment_tokens}: must be a multiple of the extend kernel's key "
                             f"tile ({tile}) and at most its workspace ({workspace.chunk_tokens} rows)")
        self.ws = workspace
        self.uploader = Uploader(device, 1 << 12)
        self.records = None

    def plan(self, meta, rows) -> SegmentPlan:
        """The step's plan for batch rows ``rows`` (host arrays of ``meta``), its records sent up
        (once per step, before the layers run)."""
        plan = plan_segments(meta.seq_lens_q, meta.seq_lens_k, rows, self.segment_tokens, self.ws.chunk_tokens)
        self.records = None if plan.empty else self.uploader.commit([self.uploader.add(plan.records)])[0]
        return plan

    def run(self, plan: SegmentPlan, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta):
        """Attention of the plan's query rows into ``workspace.out`` (the step's latent is already
        in ``kv_cache``; its new rows are read from ``latent``)."""
        ws, d = self.ws, self.ws.dims
        H, C, T = d.num_heads, d.kv_lora_rank, q_nope.shape[0]
        ws.check_step(T)
        if plan.empty:
            return
        w_k, w_v = ws.expansion_weights(w_kc, w_vc)[None], ws.w_v[None]
        out = ws.out[:T]
        lse = ws.lse[:T] if plan.rounds > 1 else None
        for launch in plan.launches:
            n, recs = launch.rows, self.records[launch.first:launch.first + launch.count]
            lat = read_pieces(kv_cache, meta.block_tables, latent, recs, launch.count, n, ws.latent[:n])
            ckv = lat[None, :, :C]
            k_nope, v = ws.k_nope[:n], ws.v[:n]
            batch_invariant.bmm(ckv, w_k, out=k_nope.view(1, n, H * d.qk_nope_head_dim))
            batch_invariant.bmm(ckv, w_v, out=v.view(1, n, H * d.v_head_dim))
            extend_pieces(q_nope, q_pe, k_nope, lat[:, C:], v, out, lse, recs, launch.count, plan.max_seqlen_q,
                          d.softmax_scale, merge=launch.merge, k_b_shared=True)
