"""Extend (prefill / chunked prefill / prefix-cache continuation) rows of a step, over their own
context only, with the expansion of the latent bounded in memory.

The extend rows' keys form one packed sequence (per request its cached rows, then its new rows;
``cu_seqlens_k`` counts them). It is processed in chunks of at most ``chunk_tokens`` packed rows:
  1. ``read_cache_and_interleave`` copies the chunk's latent rows (cached ones from the paged
     cache, new ones from this step's latent) into a workspace;
  2. two GEMMs expand them through kv_b_proj: K_nope = c W_kc^T, V = c W_vc (k_pe is read
     straight from the latent rows, shared by every head);
  3. ``extend_attention`` attends every query of the chunk's requests, causally by absolute
     position, over the chunk's keys and folds the result into the partial outputs of the earlier
     chunks by log-sum-exp (vLLM's chunked-context MLA prefill does the same merge).
A step whose extend context fits one chunk (every plain prefill) runs one pass and no merge.

Why expand rather than attend the cached context in absorbed form (decode-style): a 512-token
chunk over an 8k cached prefix costs ~0.6 TFLOP per layer expanded but ~1.2 TFLOP absorbed (the
absorbed key/value width is 576/512 per head instead of 192/128), and a decode-style kernel
re-reads the whole context per query token. Rows with one new token go to the decode kernel
instead (``backend.py``): for them the absorbed form is the cheap one.

Workspaces are allocated once, at start-up: latent [chunk, C+R], K_nope [chunk, H, nope], V
[chunk, H, v], the V weight laid out for one GEMM [C, H*v], and per step token: LSE float32 [H],
output [H, v]. The chunk is the step's token budget clamped to [2048, 8192] rows: a plain prefill
is one chunk, a small budget does not cut long contexts into many small GEMMs, and the K/V
workspace stays bounded (DeepSeek-V3 dims, H 128, bf16: 64 KiB per row, 512 MiB at 8192).
Sizes come from the host (the scheduler's numpy lengths); nothing here reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paddle_mla.attention.triton_mla.interleave import read_cache_and_interleave
from paddle_mla.attention.triton_mla.prefill import extend_attention


CHUNK_TOKENS_MIN = 2048
CHUNK_TOKENS_MAX = 8192


def default_chunk_tokens(max_num_batched_tokens: int) -> int:
    return min(max(max_num_batched_tokens, CHUNK_TOKENS_MIN), CHUNK_TOKENS_MAX)


@dataclass(frozen=True)
class ExtendPlan:
    """Host-side description of a step's extend rows (built once per step in ``prepare``)."""

    first_row: int       # rows before it went to the decode kernel
    first_token: int     # token row of the first extend token
    k_begin: int         # packed key row where the extend rows' keys begin (= cu_seqlens_k[first_row])
    k_end: int           # = cu_seqlens_k[-1]
    max_seqlen_q: int    # longest query of the extend rows
    last_row: int = -1   # rows from it on went elsewhere (short rows, ``short_extend.py``); -1: none


    @property
    def empty(self) -> bool:
        return self.k_end <= self.k_begin or self.max_seqlen_q == 0


def plan_extend(meta, first_row: int, last_row: int | None = None) -> ExtendPlan:
    """Rows [first_row, last_row) (default: to the end). From the host arrays of ``ForwardMeta``:
    no device tensor is read."""
    end = meta.num_reqs if last_row is None else last_row
    q = meta.seq_lens_q[first_row:end]
    return ExtendPlan(
        first_row=first_row,
        first_token=int(np.sum(meta.seq_lens_q[:first_row], dtype=np.int64)),
        k_begin=int(np.sum(meta.seq_lens_k[:first_row], dtype=np.int64)),
        k_end=int(np.sum(meta.seq_lens_k[:end], dtype=np.int64)),
        max_seqlen_q=int(q.max(initial=0)),
        last_row=-1 if end >= meta.num_reqs else end,
    )


class ExtendWorkspace:
    def __init__(self, dims, max_tokens: int, chunk_tokens: int, device: str, dtype):
        if chunk_tokens <= 0 or max_tokens <= 0:
            raise ValueError(f"extend workspace needs positive sizes (max_tokens {max_tokens}, chunk {chunk_tokens})")
        H, C = dims.num_heads, dims.kv_lora_rank
        self.dims, self.max_tokens, self.chunk_tokens = dims, max_tokens, chunk_tokens
        self.latent = torch.empty(chunk_tokens, dims.latent_dim, dtype=dtype, device=device)
        self.k_nope = torch.empty(chunk_tokens, H, dims.qk_nope_head_dim, dtype=dtype, device=device)
        self.v = torch.empty(chunk_tokens, H, dims.v_head_dim, dtype=dtype, device=device)
        self.w_v = torch.empty(C, H * dims.v_head_dim, dtype=dtype, device=device)
        self.lse = torch.empty(max_tokens, H, dtype=torch.float32, device=device)
        self.out = torch.empty(max_tokens, H, dims.v_head_dim, dtype=dtype, device=device)

    def check_step(self, num_tokens: int) -> None:
        if num_tokens > self.max_tokens:
            raise ValueError(f"a step of {num_tokens} tokens exceeds the extend workspace ({self.max_tokens} "
                             "tokens, sized from scheduler.max_num_batched_tokens)")

    def expansion_weights(self, w_kc, w_vc):
        """kv_b_proj's halves laid out for the expansion GEMMs: returns W_K [C, H*nope] (a view of
        ``w_kc``) and fills ``self.w_v`` [C, H*v] from ``w_vc``."""
        d = self.dims
        H, C = d.num_heads, d.kv_lora_rank
        self.w_v.view(C, H, d.v_head_dim).copy_(w_vc.permute(1, 0, 2))
        return w_kc.reshape(H * d.qk_nope_head_dim, C).transpose(0, 1)

    def run(self, plan: ExtendPlan, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta):
        """Attention of the extend tokens into ``self.out[plan.first_token:T]`` (the latent of the
        step is already in ``kv_cache``; the new rows are read from ``latent`` all the same)."""
        d = self.dims
        H, C, T = d.num_heads, d.kv_lora_rank, q_nope.shape[0]
        self.check_step(T)
        if plan.empty:
            return
        r0, r1 = plan.first_row, (meta.num_reqs if plan.last_row < 0 else plan.last_row)
        cu_q, cu_k, tables = meta.cu_seqlens_q[r0:r1 + 1], meta.cu_seqlens_k[r0:r1 + 1], meta.block_tables[r0:r1]
        w_k = self.expansion_weights(w_kc, w_vc)
        out = self.out[:T]
        lse = self.lse[:T] if plan.k_end - plan.k_begin > self.chunk_tokens else None
        for start in range(plan.k_begin, plan.k_end, self.chunk_tokens):
            n = min(self.chunk_tokens, plan.k_end - start)
            lat = read_cache_and_interleave(kv_cache, tables, latent, cu_q, cu_k, n, out=self.latent[:n],
                                            k_start=start)
            ckv = lat[:, :C]
            k_nope, v = self.k_nope[:n], self.v[:n]
            torch.matmul(ckv, w_k, out=k_nope.view(n, H * d.qk_nope_head_dim))
            torch.matmul(ckv, self.w_v, out=v.view(n, H * d.v_head_dim))
            extend_attention(q_nope, q_pe, k_nope, lat[:, C:], v, out, lse, cu_q, cu_k, plan.max_seqlen_q,
                             d.softmax_scale, k_start=start, k_rows=n, merge=start > plan.k_begin,
                             k_b_shared=True)
