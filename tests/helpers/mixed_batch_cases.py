"""Mixed decode + extend batches for the attention backends (shared by the CPU and GPU tests):
random paged latent caches, random physical block tables, and the plain-tensor oracle composed
from ``attention.triton_mla.reference`` (interleave, explicit K/V through kv_b_proj, dense causal
attention over every row)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_mla.attention.backend import MLADims, create_backend
from paddle_mla.attention.forward_meta import ForwardMeta, StepBatch
from paddle_mla.platform.tensor_api import torch

DIMS = MLADims(num_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
               softmax_scale=24 ** -0.5)


@dataclass
class MixedCase:
    rows: list[tuple[int, int]]   # (cached, new) per request, decodes first
    batch: StepBatch
    cache: Any                    # [NB, page, 1, D]: every request's cached prefix already written
    q_nope: Any
    q_pe: Any
    latent: Any                   # the step's new latent rows
    w_kc: Any
    w_vc: Any
    page: int


def make_case(rows, page: int, device: str, dtype, seed: int, dims: MLADims = DIMS, prompt_lens=None) -> MixedCase:
    """``rows``: (cached, new) each; ``prompt_lens``: each row's prompt length (``StepBatch.prompt_lens``)."""
    rng = np.random.default_rng(seed)
    H, D = dims.num_heads, dims.latent_dim
    cached = np.array([c for c, _ in rows], dtype=np.int32)
    new = np.array([n for _, n in rows], dtype=np.int32)
    per_req = int(((cached + new).max() + page - 1) // page) + 1
    num_blocks = per_req * len(rows) + 3
    tables = rng.permutation(num_blocks)[:per_req * len(rows)].reshape(len(rows), per_req).astype(np.int32)
    T = int(new.sum())

    def t(shape, scale=1.0):
        return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(device).to(dtype)

    cache = t((num_blocks, page, 1, D))      # the cached prefixes, and garbage everywhere else
    batch = StepBatch(token_ids=np.zeros(T, dtype=np.int64), num_new=new, num_cached=cached, block_tables=tables,
                      is_prefill=np.array([n > 1 or c == 0 for c, n in rows]),
                      sample_mask=np.ones(len(rows), dtype=bool),
                      prompt_lens=None if prompt_lens is None else np.array(prompt_lens, dtype=np.int32))
    return MixedCase(rows=list(rows), batch=batch, cache=cache, q_nope=t((T, H, dims.qk_nope_head_dim)),
                     q_pe=t((T, H, dims.qk_rope_head_dim)), latent=t((T, D)),
                     w_kc=t((H, dims.qk_nope_head_dim, dims.kv_lora_rank), 0.3),
                     w_vc=t((H, dims.kv_lora_rank, dims.v_head_dim), 0.3), page=page)


def run_backend(name: str, case: MixedCase, device: str, dims: MLADims = DIMS, **kwargs):
    """(output [T, H, v], the cache after the step, meta) of one step of backend ``name``."""
    max_len = max(c + n for c, n in case.rows)
    be = create_backend(name, dims=dims, max_num_seqs=len(case.rows), max_model_len=max_len, block_size=case.page,
                        device=device, dtype=case.cache.dtype, max_num_batched_tokens=int(case.batch.num_new.sum()),
                        **kwargs)
    meta = ForwardMeta.build(case.batch, case.page, device)
    cache = case.cache.clone()
    be.prepare(meta)
    out = be.forward(case.q_nope, case.q_pe, case.latent, case.w_kc, case.w_vc, cache, meta)
    return out.clone(), cache, meta


def plain_reference(case: MixedCase, cache_after, meta, dims: MLADims = DIMS, compute_dtype=None):
    """Every row (decode or extend) by the dense references: full latent -> explicit K/V -> causal,
    computed in float32, or in ``compute_dtype`` (float64: the exact answer the fp32 runs are held to)."""
    cd = torch.float32 if compute_dtype is None else compute_dtype
    from paddle_mla.attention.triton_mla import reference as ref

    total_k = int(meta.seq_lens_k.sum())
    full = ref.read_cache_and_interleave_ref(cache_after, meta.block_tables, case.latent, meta.cu_seqlens_q,
                                             meta.cu_seqlens_k, total_k).to(cd)
    c, k_pe = full[:, :dims.kv_lora_rank], full[:, dims.kv_lora_rank:]
    k_nope = torch.einsum("tc,hnc->thn", c, case.w_kc.to(cd))
    v = torch.einsum("tc,hcv->thv", c, case.w_vc.to(cd))
    k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(total_k, dims.num_heads, dims.qk_rope_head_dim)], -1)
    q = torch.cat([case.q_nope, case.q_pe], -1).to(cd)
    return ref.prefill_ref(q, k, v, meta.cu_seqlens_q, meta.cu_seqlens_k, dims.softmax_scale, compute_dtype)
