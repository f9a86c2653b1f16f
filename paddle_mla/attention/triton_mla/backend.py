"""The ``triton_mla`` backend: Triton kernels for cache write, prefill/extend and split-KV decode.

- Decode-only steps: absorbed MLA (q_nope @ W_UK || q_pe) over the paged latent cache with the
  two-stage split-KV kernel; the split plan is built on the GPU once per step in ``prepare``.
- Steps with prefill tokens (pure or mixed with decodes): the cached prefix is read from the paged
  cache and interleaved with the new latent rows (one fused kernel), ``kv_b_proj`` expands the
  whole context to K/V, and the varlen causal flash kernel attends the new tokens over it. Every
  token of a mixed batch gets its real output.
Workspaces (plan, partial outputs, absorbed q, latent output) are sized at start-up, so decode
steps can be captured in a CUDA graph.
"""

from __future__ import annotations

from paddle_mla import runtime as _runtime

_runtime.require_selected(__name__)

import torch

from paddle_mla import runtime
from paddle_mla.attention.backend import MLABackend, MLADims, register_backend
from paddle_mla.attention.triton_mla.cache_write import write_latent_cache
from paddle_mla.attention.triton_mla.decode import alloc_decode_workspace, build_decode_plan, decode_config, mla_decode
from paddle_mla.attention.triton_mla.interleave import read_cache_and_interleave
from paddle_mla.attention.triton_mla.prefill import prefill_attention

MAX_KV_SPLITS = 32


@register_backend("triton_mla")
class TritonMLABackend(MLABackend):
    def __init__(self, dims: MLADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str, dtype):
        super().__init__(dims, max_num_seqs, max_model_len, block_size, device, dtype)
        ok, why = runtime.supports_triton_on("cpu" if device == "cpu" else "gpu")
        if not ok:
            raise RuntimeError(f"attention.backend 'triton_mla' cannot run here: {why}; use backend 'native'")
        H, L = dims.num_heads, dims.kv_lora_rank
        self.cfg = decode_config(H)
        self.ws = alloc_decode_workspace(max_num_seqs, H, L, MAX_KV_SPLITS, device)
        self.q_buf = torch.zeros(max_num_seqs, H, dims.latent_dim, dtype=dtype, device=device)
        self.o_buf = torch.zeros(max_num_seqs, H, L, dtype=dtype, device=device)

    def prepare(self, meta) -> None:
        if meta.is_decode_only:
            build_decode_plan(meta.seq_lens_k_dev, meta.num_reqs, self.ws, self.cfg.block_n, self.cfg.target_items,
                              self.cfg.min_tiles)

    def forward(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta):
        write_latent_cache(latent, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return self._decode(q_nope, q_pe, w_kc, w_vc, kv_cache, meta)
        return self._extend(q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta)

    def _decode(self, q_nope, q_pe, w_kc, w_vc, kv_cache, meta):
        bs, L = q_nope.shape[0], self.dims.kv_lora_rank
        q = self.q_buf[:bs]
        q[:, :, :L].copy_(torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1))
        q[:, :, L:].copy_(q_pe)
        out = self.o_buf[:bs]
        mla_decode(q, kv_cache, meta.block_tables, meta.seq_lens_k_dev, out, self.ws, L,
                   self.dims.softmax_scale, self.cfg)
        return torch.bmm(out.transpose(0, 1), w_vc).transpose(0, 1)

    def _extend(self, q_nope, q_pe, latent, w_kc, w_vc, kv_cache, meta):
        d = self.dims
        total_k = int(meta.seq_lens_k.sum())
        full = read_cache_and_interleave(kv_cache, meta.block_tables, latent, meta.cu_seqlens_q, meta.cu_seqlens_k,
                                         total_k)
        ckv, k_pe = full[:, : d.kv_lora_rank], full[:, d.kv_lora_rank:]
        k_nope = torch.einsum("tc,hnc->thn", ckv, w_kc)
        v = torch.einsum("tc,hcv->thv", ckv, w_vc).contiguous()
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(total_k, d.num_heads, d.qk_rope_head_dim)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        return prefill_attention(q.contiguous(), k.contiguous(), v, meta.cu_seqlens_q, meta.cu_seqlens_k,
                                 meta.max_seqlen_q, d.softmax_scale)
