"""The ``dsa`` backend: DeepSeek-V3.2 sparse attention with Triton kernels.

Per layer:
1. ``index_topk``: write the new indexer keys into the paged key cache (same slots as the latent
   cache), score every new token against its request's keys straight from that cache
   (``index_kernels.index_scores``; windows ``[ks, ke)`` from ``ForwardMeta`` in prefill steps,
   positions in pure decode), then the top-k request positions per token (-1 padded).
2. ``forward``: write the latents, turn the top-k positions into cache slots through the block
   table, absorb W_UK into the queries, run sparse MLA over the selected slots (split over the
   top-k axis + merge; the chunks on the SM90 CUDA op where ``cuda_decode`` can serve) and apply
   W_UV. Prefill and decode tokens take the same path: a token with
   no more than ``index_topk`` keys selects all of them, which is dense causal attention.
So in a step with prefill tokens whose extend rows (those after the leading decode rows) all have
contexts that fit ``index_topk`` (every prompt of at most 2048 tokens under V3.2's top-k, and its
chunks up to there), those rows are dense attention: they skip the scoring and top-k (their indexer
keys are still written) and run ``triton_mla``'s extend kernels, whose non-absorbed prefill does
192 + 128 dims of work per head and key against the sparse kernel's 576 + 512 (BENCHMARKS.md, "DSA":
the sparse prefill is the costly part of a V3.2 prefill). The step's decode rows stay sparse, and
decode-only steps always are: one path, so the CUDA graphs hold for every context.
Decode workspaces are sized on the first call for ``max_num_seqs`` rows and ``max_model_len``
columns, so decode steps are captured as CUDA graphs. Prefill steps score their rows in chunks
through one buffer of at most 256 MiB made at the first prefill (the memory profile's), so an
8k-token chunk against a 128k context needs no 4 GiB score matrix; their other per-row arrays are
allocated once per step, in the first layer.
"""

from __future__ import annotations

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import sys

import torch

from paddle_mla.platform import runtime
from paddle_mla.attention.backend import MLADims, register_backend
from paddle_mla.attention.forward_meta import MLAStepPlan
from paddle_mla.attention.dsa.index_kernels import index_scores, positions_to_slots
from paddle_mla.attention.dsa.topk_select import topk_scratch_shape, topk_select
from paddle_mla.attention.dsa.sparse_mla import partial_rows, plan_splits, sparse_config, sparse_mla
from paddle_mla.attention.triton_mla.backend import TritonMLABackend
from paddle_mla.attention.triton_mla.cache_write import write_latent_cache
from paddle_mla.attention.triton_mla.cuda_decode import unavailable_reason
from paddle_mla.attention.triton_mla.extend import plan_extend


PREFILL_SCORE_BYTES = 256 << 20   # prefill indexer scores per chunk of rows (fp32 [rows, longest context])
PREFILL_TOPK_ROWS = 1024            # rows per chunk, at most (the top-k candidate buffers: 32 MiB at top-k 2048)


@register_backend("dsa")
class DSABackend(TritonMLABackend):
    def __init__(self, dims: MLADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str, dtype,
                 max_num_batched_tokens: int = 0, index_topk: int = 0, deterministic: bool = False,
                 cuda_decode: bool = False):
        """``index_topk``: the model's top-k; steps with prefill tokens whose contexts all fit it run
        dense (``triton_mla``). 0: every step sparse. ``deterministic``: the sparse rows' plan does not
        depend on the batch (``sparse_plan``, ``topk_segments``; docs/dsa.md)."""
        ok, why = runtime.supports_triton_on("cpu" if device == "cpu" else "gpu")
        if not ok:
            raise RuntimeError(f"attention.backend 'dsa' cannot run here: {why}; use backend 'native'")
        # dense steps send every extend row through the extend kernels (their contexts are short):
        # no absorbed short extends, so the scheduler's absorbed-context cap stays off for dsa, as before
        super().__init__(dims, max_num_seqs, max_model_len, block_size, device, dtype, max_num_batched_tokens,
                         short_extend_tokens=0, cuda_decode=cuda_decode and not deterministic)
        # deterministic: every step sparse, since whether a step runs dense depends on every
        # prefill row in it (a row's path would follow the batch)
        self.dense_max_context = 0 if deterministic else index_topk
        self._decode_ws = None
        self._prefill = None
        # the sparse rows on the SM90 CUDA op where it serves (cuda_decode's conditions; any page size);
        # it is batch-invariant at one split, so the deterministic mode keeps it
        why_not = unavailable_reason(dims.kv_lora_rank, dims.latent_dim, dtype, device) if cuda_decode else "turned off"
        self.sparse_cfg = sparse_config(dims.num_heads, cuda=not why_not)
        if device != "cpu":  # start-up log beside triton_mla's (whose decode rows dsa does not run)
            print(f"[dsa] sparse MLA: {'the mla_sparse CUDA op' if not why_not else f'Triton ({why_not})'}",
                  file=sys.stderr, flush=True)
        self.deterministic = deterministic
        # one split of the top-k axis: the split count otherwise follows the row count (programs to
        # fill the GPU), and with it where the partial sums break and how they merge
        self.forced_splits = 1 if deterministic else 0
        # one candidate program per row appends in column order, so the selected positions come out
        # in an order fixed by the row alone (0: programs per row from the row count)
        self.topk_segments = 1 if deterministic else 0

    def sparse_plan(self, rows: int, topk: int) -> tuple[int, int, int]:
        """(splits, chunk length, slots per tile) of the sparse MLA over ``rows`` query rows."""
        return plan_splits(rows, self.dims.num_heads, topk, self.sparse_cfg, self.forced_splits)

    def _workspace(self, meta, rows: int, topk: int):
        """Decode: the start-up workspace. Steps with prefill tokens: one per step, made by the first
        layer and kept in ``meta.attn`` for the others (never one per layer)."""
        if meta.is_decode_only:
            if self._decode_ws is None or self._decode_ws["topk"] != topk:
                n = self.max_num_seqs
                self._decode_ws = dict(self._alloc(n, topk), topk=topk, score_rows=n,
                                       scores=torch.empty(n * self.max_model_len, dtype=torch.float32,
                                                          device=self.device),
                                       topk_scratch=self._topk_scratch(n, topk))
            return self._decode_ws
        ws = meta.attn.dsa_ws
        if ws is None or ws["topk"] != topk:
            ws = dict(self._alloc(rows, topk), topk=topk, **self._prefill_scores(topk, rows))
        return ws

    def _prefill_scores(self, topk: int, rows: int) -> dict:
        """Score rows of prefill steps: a buffer of at most PREFILL_SCORE_BYTES, made once (in the memory
        profile's dummy prefill, so the KV cache is sized around it); steps score their rows in chunks
        of buffer / (4 x longest context) rows, whatever the context."""
        if self._prefill is None or self._prefill["topk"] != topk:
            tokens = self.max_num_batched_tokens or rows      # 0: not configured; the first step's
            nbytes = min(PREFILL_SCORE_BYTES, tokens * self.max_model_len * 4)
            rows = min(PREFILL_TOPK_ROWS, tokens)
            self._prefill = dict(topk=topk, score_rows=rows,
                                 scores=torch.empty(nbytes // 4, dtype=torch.float32, device=self.device),
                                 topk_scratch=self._topk_scratch(rows, topk))
        return {k: v for k, v in self._prefill.items() if k != "topk"}

    def _dense_rows(self, meta) -> int | None:
        """The first row of a dense tail (the extend rows after the leading decode rows), or None
        (``prepare`` sets it, never in a decode-only step)."""
        return meta.attn.dense_from

    def prepare(self, meta) -> None:
        """Once per step, from host arrays: whether the extend rows run dense, and their plan."""
        meta.attn = MLAStepPlan()
        if meta.is_decode_only or not self.dense_max_context:
            return
        nd = meta.num_decode_reqs
        ext = meta.seq_lens_k[nd:meta.num_reqs]
        if ext.size and int(ext.max()) <= self.dense_max_context:
            meta.attn.dense_from = nd
            meta.attn.extend_plan = plan_extend(meta, nd)

    def _topk_scratch(self, rows: int, topk: int):
        return torch.zeros(topk_scratch_shape(rows, topk), dtype=torch.int32, device=self.device)

    def _alloc(self, rows: int, topk: int) -> dict:
        d, dev = self.dims, self.device
        # merge workspace: rows x splits (none when the plan never splits)
        split_rows = 0 if self.forced_splits == 1 else partial_rows(rows, d.num_heads, topk, self.sparse_cfg)
        return {
            "pos": torch.empty(rows, topk, dtype=torch.int64, device=dev),
            "topk_fallbacks": torch.zeros(1, dtype=torch.int32, device=dev),   # rows whose sample missed
            "slots": torch.empty(rows, topk, dtype=torch.int64, device=dev),
            "part_o": torch.empty(max(split_rows, 1) * d.num_heads * d.kv_lora_rank, dtype=torch.float32, device=dev),
            "part_lse": torch.empty(max(split_rows, 1) * d.num_heads, dtype=torch.float32, device=dev),
            "o_lat": torch.empty(rows, d.num_heads, d.kv_lora_rank, dtype=self.dtype, device=dev),
        }

    def index_topk(self, q, k, w, index_cache, meta, topk: int):
        """The top-k request positions per new token of the sparse rows (all, or the leading decode
        rows of a step with a dense tail), or None when no row is sparse; every key is written."""
        T = q.shape[0]
        dense_from = self._dense_rows(meta)
        if dense_from is not None:
            T = meta.num_decode_tokens      # the leading decode rows: one token each
            if T == 0:
                write_latent_cache(k, index_cache, meta.slot_mapping)
                return None
        decode = meta.is_decode_only
        if not decode and (meta.index_ks is None or meta.index_ke is None):
            raise ValueError("dsa: a step with prefill tokens needs meta.index_ks/index_ke "
                             "(ForwardMeta.build(..., key_windows=KeyWindows(...)))")
        # decode: one width for every step (a captured graph replays one launch); the kernels follow
        # each row's own length, so the unused columns cost nothing
        width = self.max_model_len if decode else meta.max_seqlen_k
        ws = meta.attn.dsa_ws = self._workspace(meta, T, topk)
        write_latent_cache(k, index_cache, meta.slot_mapping)
        chunk = min(ws["score_rows"], ws["scores"].numel() // max(width, 1)) if not decode else T
        if chunk < 1:
            raise ValueError(f"dsa: a {width}-key score row does not fit the {ws['scores'].numel()}-float buffer")
        bids, pos = meta.batch_id_per_token, meta.positions
        for r0 in range(0, T, chunk):       # one pass in decode; prefill rows in bounded chunks
            r1 = min(T, r0 + chunk)
            win = {} if decode else dict(ks=meta.index_ks[r0:r1], ke=meta.index_ke[r0:r1],
                                         cu_seqlens_k=meta.cu_seqlens_k)
            scores = ws["scores"][:(r1 - r0) * width].view(r1 - r0, width)
            index_scores(q[r0:r1], w[r0:r1], index_cache, meta.block_tables, bids[r0:r1], pos[r0:r1], width,
                         scores, **win)
            topk_select(scores, topk, ws["pos"][r0:r1], bids[r0:r1], pos[r0:r1], **win,
                        scratch=ws["topk_scratch"], fallbacks=ws["topk_fallbacks"], segments=self.topk_segments)
        return ws["pos"][:T]

    def forward(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta, topk_pos=None):
        dense_from = self._dense_rows(meta)
        if topk_pos is None and dense_from is None:
            raise ValueError("attention.backend 'dsa' runs deepseek_v32 checkpoints only (no top-k given); "
                             "use triton_mla for other MLA models")
        if not meta.latents_written:
            write_latent_cache(latent, kv_cache, meta.slot_mapping)
        if dense_from is None:
            return self._sparse(q_nope, q_pe, w_kc, w_vc, kv_cache, meta, topk_pos)
        self.extend.run(meta.attn.extend_plan, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta)
        out = self.extend.out[:q_nope.shape[0]]
        n = meta.num_decode_tokens
        if n:
            out[:n].copy_(self._sparse(q_nope[:n], q_pe[:n], w_kc, w_vc, kv_cache, meta, topk_pos))
        return out

    def _sparse(self, q_nope, q_pe, w_kc, w_vc, kv_cache, meta, topk_pos):
        """Sparse MLA of the first ``len(q_nope)`` tokens over their top-k (the latents are written)."""
        d = self.dims
        ws = meta.attn.dsa_ws
        bids = meta.batch_id_per_token[:q_nope.shape[0]]
        slots = positions_to_slots(topk_pos, bids, meta.block_tables, self.block_size, ws["slots"])
        q_lat = self._bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1)            # [T, H, C]
        o_lat = sparse_mla(q_lat.contiguous(), q_pe, kv_cache, slots, d.softmax_scale, ws["part_o"],
                           ws["part_lse"], ws["o_lat"], self.sparse_cfg, num_splits=self.forced_splits)
        return self._bmm(o_lat.transpose(0, 1), w_vc).transpose(0, 1)
