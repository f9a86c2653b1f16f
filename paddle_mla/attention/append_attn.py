"""The ``append_attn`` GQA backend: one ``append_attention`` custom-op call per layer (RoPE, paged
K/V write and causal attention fused; C++ on CPU, CUDA on the GPU).

The decode workspace (split-KV partial outputs) is allocated once here, for ``max_num_seqs``
requests, so a decode step launches with shape-only parameters and replays inside a CUDA graph.
Per-step inputs come from ``ForwardMeta`` (computed once per step): cu_seqlens_q, seq_lens_k,
batch_id_per_token, positions and the uniform or head-wise block tables. Steps where every request
has one new token skip the prefill kernel's launch (``meta.is_decode_only``, host-side).
``deterministic: true`` sends every token through the prefill kernel instead (batch-invariant sums;
docs/determinism.md).
"""

from __future__ import annotations

import torch

from paddle_mla.attention.backend import GQABackend, GQADims, LayerRope, deterministic_split_tokens, register_backend
from paddle_mla.ops import append_attention as op
from paddle_mla.ops import build


@register_backend("append_attn")
class AppendAttnBackend(GQABackend):
    def __init__(self, dims: GQADims, max_num_seqs: int, max_model_len: int, block_size: int, device: str,
                 dtype, num_swa_heads: int = 0, window: int = 0, sink: int = 0, max_num_batched_tokens: int = 0,
                 swa_mask: bool = False, deterministic: bool = False):
        super().__init__(dims, max_num_seqs, max_model_len, block_size, device, dtype, num_swa_heads, window, sink,
                         max_num_batched_tokens, swa_mask)
        self.deterministic = deterministic   # every token through the prefill kernel (ops.append_attention)
        # ... in fixed key segments, so a one-token row splits over blocks (the split follows max_model_len;
        # none when one segment holds every row: there is nothing to split)
        split = deterministic_split_tokens(max_model_len)
        self.invariant_split = split if deterministic and max_model_len > split else 0
        on_gpu = not str(device).startswith("cpu")
        if op.implementation(on_gpu) != "custom_op":
            why = build.unavailable_reason() or "the custom ops were built without CUDA (nvcc not found)"
            raise RuntimeError(f"attention.backend 'append_attn' needs the compiled append_attention op: {why}; "
                               "use attention.backend 'native'")
        n = op.workspace_numel(max_num_seqs, dims.num_heads, dims.head_dim) if on_gpu else 0
        self.workspace = torch.empty(n, dtype=torch.float32, device=device)

    def forward(self, q, k, v, k_cache, v_cache, meta, layer_rope: LayerRope):
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return op.append_attention(
            q, k, v, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens_k_dev,
            meta.batch_id_per_token, meta.positions, layer_rope.cos_sin, out, softmax_scale=self.dims.softmax_scale,
            neox=layer_rope.neox, rot_dim=layer_rope.rot_dim, num_swa_heads=self.num_swa_heads, window=self.window,
            sink=self.sink, swa_mask=self.swa_mask, workspace=self.workspace, decode_only=bool(meta.is_decode_only),
            batch_invariant=self.deterministic, invariant_split=self.invariant_split)
