"""The ``triton_mla`` backend: Triton kernels for cache write, prefill/extend and split-KV decode.

Every step writes the new latent rows into the paged cache first. Then the batch is split:
- decode rows (the leading rows with one new token each: the scheduler puts decodes first,
  ``ForwardMeta.num_decode_reqs`` counts them): absorbed MLA (q_nope @ W_UK || q_pe) over the
  paged latent cache with the two-stage split-KV kernel, or with ``cuda_decode`` on SM90 (bf16,
  custom ops built with CUDA) the ``mla_decode`` CUDA op (``cuda_decode.py``). The split plan for
  exactly these rows is built on the GPU once per step in ``prepare``. A decode row is never expanded through kv_b_proj,
  whatever else runs in the step;
- short extend rows (few new tokens, e.g. a prefix-cache hit's tail over a long cached prefix):
  each new token as a pseudo decode row through the same decode kernel, a few consecutive tokens
  of a row sharing one head block (query groups: each KV tile read once per group; ``short_extend.py``);
- the other extend rows (prefill, prefill chunks, prefix-cache continuations): over their own context only,
  chunk-wise through a workspace of fixed size with the partial results merged by log-sum-exp
  (``extend.py`` says how and why).
Under ``deterministic: true`` the split follows the token's place in its request instead: rows of
output tokens (decodes, and a preempted request's outputs when it is recomputed) run absorbed, and
prompt rows run expanded over key segments at fixed positions (``extend_segments.py``).
Pure decode steps run the decode part alone (and replay as CUDA graphs); the decode workspaces
(plan, partial outputs, absorbed q, latent output) and the extend workspaces are sized at start-up.
"""

from __future__ import annotations

import sys

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla.platform import runtime
from paddle_mla.ops import batch_invariant
from paddle_mla.attention.backend import MLABackend, MLADims, deterministic_split_tokens, register_backend
from paddle_mla.attention.forward_meta import MLAStepPlan
from paddle_mla.attention.triton_mla.cache_write import write_latent_cache
from paddle_mla.attention.triton_mla.cuda_decode import CudaDecode, unavailable_reason
from paddle_mla.attention.triton_mla.decode import (
    SMALL_BATCH, alloc_decode_workspace, build_decode_plan, decode_config, mla_decode, split_cap,
)
from paddle_mla.attention.triton_mla.decode_plan import fixed_split_tiles, fixed_split_workspace
from paddle_mla.attention.triton_mla.extend import ExtendWorkspace, default_chunk_tokens, plan_extend
from paddle_mla.attention.triton_mla.extend_segments import SegmentedExtend
from paddle_mla.attention.triton_mla.short_extend import (
    PseudoRows, crossover_tokens, max_pseudo_rows, query_group, split_short_rows,
)

@register_backend("triton_mla")
class TritonMLABackend(MLABackend):
    def __init__(self, dims: MLADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str, dtype,
                 max_num_batched_tokens: int = 0, extend_chunk_tokens: int = 0, short_extend_tokens: int = -1,
                 cuda_decode: bool = False, deterministic: bool = False,
                 split_tokens: int = 0, segment_tokens: int = 0):
        """``extend_chunk_tokens``: packed key rows per extend chunk (default: ``extend.default_chunk_tokens``).
        ``short_extend_tokens``: extend rows of at most this many new tokens run absorbed (-1: the FLOP
        crossover from the dims, ``short_extend.crossover_tokens``; 0: never). ``cuda_decode``: decode
        rows take the CUDA op where it can run (``cuda_decode.unavailable_reason``); False: Triton.
        ``deterministic``: every output token, decoded or recomputed, runs one absorbed decode kernel
        (the CUDA op where ``cuda_decode`` can run, else the Triton one) with one launch config over
        splits of ``split_tokens`` keys from its row's start (0: from max_model_len,
        ``deterministic_split_tokens``), and every prompt token the expanded extend over segments of
        ``segment_tokens`` keys from key 0 (0: ``extend_segments.SEGMENT_TOKENS``), so a token's bits
        depend on its query, its context and whether it is a prompt or an output token, never on the
        batch (docs/determinism.md). An FP8 latent cache (``cache.fp8_latent``; its GPU checked by the
        plan) is read by the CUDA op and the Triton kernels alike, told apart by the cache's dtype.
        """
        super().__init__(dims, max_num_seqs, max_model_len, block_size, device, dtype, max_num_batched_tokens)
        ok, why = runtime.supports_triton_on("cpu" if device == "cpu" else "gpu")
        if not ok:
            raise RuntimeError(f"attention.backend 'triton_mla' cannot run here: {why}; use backend 'native'")
        H, L = dims.num_heads, dims.kv_lora_rank
        elem = torch.zeros(1, dtype=dtype).element_size()
        self.deterministic = deterministic
        # the mode computes prompt and output tokens on different paths: the scheduler keeps a row
        # from crossing the prompt's end and the prefix cache keeps output blocks from prompts
        self.prompt_apart = deterministic
        split_tokens = split_tokens or deterministic_split_tokens(max_model_len)
        # deterministic: decode rows take the query-group config, the one the extend tokens run
        # with, so a token's bits do not depend on which of the two paths computed it
        self.cfg = decode_config(query_group(H) * H if deterministic else H, elem_bytes=elem)
        # batches of <= SMALL_BATCH rows: other launch details, the same plan (block_n, programs, min_tiles)
        self.cfg_small = decode_config(H, small_batch=True, elem_bytes=elem)
        assert deterministic or (self.cfg_small.block_n, self.cfg_small.programs, self.cfg_small.min_tiles) == \
            (self.cfg.block_n, self.cfg.programs, self.cfg.min_tiles), "the small-batch config needs its own plan"
        # compact split workspace: (max_num_seqs + programs) rows of partials, not max_num_seqs x 32;
        # allocated before the KV-cache profile, so what it does not take goes to the cache. The split
        # cap (``split_cap``): the programs, up to 64 split windows per request
        self.fixed_tiles = fixed_split_tiles(split_tokens, self.cfg.block_n) if deterministic else 0
        why_not_cuda = unavailable_reason(L, dims.latent_dim, dtype, device, block_size) if cuda_decode else \
            "turned off"
        fixed = dict(split_tokens=split_tokens, max_len=max_model_len) if deterministic else {}
        # the op serves the mode at every head count: it pads a pseudo row (a recomputed output token)
        # to its program's heads (16 up to 16 heads, else 64), but those come only with preemptions,
        # while decode rows over long contexts run 1.2x faster than the Triton kernel's
        # (docs/determinism.md, "Cost")
        self.cuda = None if why_not_cuda else CudaDecode(H, max_num_seqs, device, **fixed)
        if self.cuda:   # the CUDA decode plans into its own workspace (its tiles and grid differ from Triton's)
            self.ws = self.cuda.ws
        elif deterministic:
            self.ws = fixed_split_workspace(max_num_seqs, H, L, max_model_len, split_tokens, self.cfg.block_n, device)
        else:
            self.ws = alloc_decode_workspace(max_num_seqs, H, L, split_cap(self.cfg.programs), device,
                                             programs=self.cfg.programs)
        self.q_buf = torch.zeros(max_num_seqs, H, dims.latent_dim, dtype=dtype, device=device)
        self.o_buf = torch.zeros(max_num_seqs, H, L, dtype=dtype, device=device)
        step_tokens = max_num_batched_tokens or max(max_model_len, max_num_seqs)
        chunk = extend_chunk_tokens or default_chunk_tokens(step_tokens)
        self.extend = ExtendWorkspace(dims, step_tokens, chunk, device, dtype)
        # deterministic: which rows run absorbed follows the prompt's end, not the row's length
        self.short_max_q = 0 if deterministic else \
            crossover_tokens(dims) if short_extend_tokens < 0 else short_extend_tokens
        # no workspace when no row may run absorbed (short_extend_tokens 0; dsa's dense steps)
        rows = step_tokens if deterministic else max_pseudo_rows(dims, step_tokens)
        # deterministic: recomputed output tokens run the decode rows' kernel, so a token's bits do not
        # depend on which of the two paths computed it (a preempted request recomputes them as extend)
        self.pseudo = PseudoRows(dims, rows, -(-max_model_len // block_size), device, dtype,
                                 max_seqs=max_num_seqs, cuda=self.cuda if deterministic else None,
                                 **fixed) if self.short_max_q or deterministic else None
        self.segmented = SegmentedExtend(self.extend, device, segment_tokens) if deterministic else None
        if device != "cpu":  # start-up log on the GPU, next to the KV-cache profile's report
            config = self.cfg if not self.cuda else self.cuda.launch if self.cuda.fp8_launch == self.cuda.launch \
                else f"{self.cuda.launch} (FP8 rows: {self.cuda.fp8_launch})"
            print(f"[triton_mla] decode split workspace {self.ws.nbytes / 2**20:.1f} MiB "
                  f"({self.ws.partial_out.shape[0]} "
                  f"partial rows x {H} heads x {L}; config {config}; CUDA decode: "
                  f"{why_not_cuda or 'on'}), pseudo-row workspace "
                  f"{self.pseudo.ws.nbytes / 2**20 if self.pseudo else 0:.1f} MiB", file=sys.stderr, flush=True)

    def _num_decode_rows(self, meta) -> int:
        return meta.num_reqs if meta.is_decode_only else min(meta.num_decode_reqs, self.max_num_seqs)

    def _output_rows(self, meta):
        """Under the mode: (leading single-token output rows, bool [B] rows of output tokens).
        Without prompt lengths (the memory profile's dummy steps) the decode rows are the output rows."""
        gen = np.arange(meta.num_reqs) < meta.num_decode_reqs if meta.prompt_lens is None else \
            meta.num_cached >= meta.prompt_lens
        lead = np.flatnonzero(~(gen & (meta.seq_lens_q == 1)))
        return (int(lead[0]) if len(lead) else meta.num_reqs), gen

    def prepare(self, meta) -> None:
        meta.attn = plan = MLAStepPlan()
        if self.deterministic and not meta.is_decode_only:
            return self._prepare_mode(meta, plan)
        nd = self._num_decode_rows(meta)
        self._plan_decode(meta, nd)
        if not meta.is_decode_only:
            p = self.pseudo
            split = split_short_rows(meta.seq_lens_q, nd, self.short_max_q, p.max_rows, p.qg, p.max_groups) \
                if p else split_short_rows(meta.seq_lens_q, nd, 0, 0)
            plan.short_split = split
            plan.extend_plan = plan_extend(meta, split.lead_end, split.tail_begin)
            self._prepare_short(meta, split)

    def _prepare_short(self, meta, split) -> None:
        if split.rows:
            self.pseudo.gather(meta, split)
            self.pseudo.plan(split)

    def _prepare_mode(self, meta, plan) -> None:
        """A step with extend rows under the mode: decode rows, then the rows of output tokens
        through the pseudo rows, and the prompt rows through the segmented extend."""
        nd, gen = self._output_rows(meta)
        self._plan_decode(meta, nd)
        p = self.pseudo
        split = split_short_rows(meta.seq_lens_q, nd, 0, p.max_rows, p.qg, p.max_groups, short=gen)
        if gen[split.lead_end:split.tail_begin].any():
            raise RuntimeError("deterministic: a row of output tokens sits between prompt rows or past the "
                               "absorbed path's buffers (the scheduler puts them first)")
        plan.short_split = split
        plan.segments = self.segmented.plan(meta, np.arange(split.lead_end, split.tail_begin))
        self._prepare_short(meta, split)

    def _plan_decode(self, meta, nd: int) -> None:
        """The split plan of the leading ``nd`` decode rows (on the GPU, once per step)."""
        if nd and self.cuda:
            self.cuda.plan(meta.seq_lens_k_dev, nd)
        elif nd:
            build_decode_plan(meta.seq_lens_k_dev, nd, self.ws, self.cfg.block_n, self.cfg.target_items,
                              self.cfg.min_tiles, self.fixed_tiles)

    def write_cache(self, latent, kv_cache, slot_mapping) -> None:
        write_latent_cache(latent, kv_cache, slot_mapping)

    def forward(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta):
        if not meta.latents_written:
            write_latent_cache(latent, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return self._decode(q_nope, q_pe, w_kc, w_vc, kv_cache, meta, meta.num_reqs)
        if self.segmented:
            self.segmented.run(meta.attn.segments, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta)
        else:
            self.extend.run(meta.attn.extend_plan, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta)
        out = self.extend.out[:q_nope.shape[0]]
        split = meta.attn.short_split
        if split.lead_begin:
            out[:split.lead_begin].copy_(self._decode(q_nope, q_pe, w_kc, w_vc, kv_cache, meta, split.lead_begin))
        if split.rows:
            self._short_rows(q_nope, q_pe, w_kc, w_vc, kv_cache, split, out)
        return out

    def _short_rows(self, q_nope, q_pe, w_kc, w_vc, kv_cache, split, out):
        """The short extend rows' tokens as pseudo decode rows (tables/lens/plan from ``prepare``)."""
        L, p, n = self.dims.kv_lora_rank, self.pseudo, split.rows
        ranges, r = [], 0
        for a, b in (split.lead_tok, split.tail_tok):
            if b > a:
                ranges.append((a, b, r))
                r += b - a
        q = p.q[:n]
        for a, b, r0 in ranges:
            self._bmm(q_nope[a:b].transpose(0, 1), w_kc, out=q[r0:r0 + b - a, :, :L].transpose(0, 1))
            q[r0:r0 + b - a, :, L:].copy_(q_pe[a:b])
        o = p.o[:n]
        p.decode(q, kv_cache, o, L, self.dims.softmax_scale, split)
        for a, b, r0 in ranges:   # straight into the output rows, a product a range (at most two)
            self._bmm(o[r0:r0 + b - a].transpose(0, 1), w_vc, out=out[a:b].transpose(0, 1))

    def _decode(self, q_nope, q_pe, w_kc, w_vc, kv_cache, meta, bs: int):
        """Rows [0, bs): one query each, over their paged latent context (the plan from ``prepare``)."""
        L = self.dims.kv_lora_rank
        q = self.q_buf[:bs]
        self._bmm(q_nope[:bs].transpose(0, 1), w_kc, out=q[:, :, :L].transpose(0, 1))
        q[:, :, L:].copy_(q_pe[:bs])
        out = self.o_buf[:bs]
        if self.cuda:
            self.cuda.run(q, kv_cache, meta.block_tables, meta.seq_lens_k_dev, out, bs, self.dims.softmax_scale)
        else:
            cfg = self.cfg_small if bs <= SMALL_BATCH and not self.deterministic else self.cfg
            mla_decode(q, kv_cache, meta.block_tables, meta.seq_lens_k_dev, out, self.ws, L, self.dims.softmax_scale,
                       cfg)
        # into [bs, H, v] rows, so that the model's [bs, H * v] is a view, not a copy
        rows = torch.empty((bs, out.shape[1], w_vc.shape[-1]), dtype=out.dtype, device=out.device)
        self._bmm(out.transpose(0, 1), w_vc, out=rows.transpose(0, 1))
        return rows

    def _bmm(self, a, b, out=None):
        """The W_UK / W_UV products, whose M is the step's row count: batch-invariant under the mode.
        ``out``: a strided view of the destination, written in place."""
        return batch_invariant.bmm(a, b, out) if self.deterministic else torch.bmm(a, b, out=out)
