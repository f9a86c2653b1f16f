"""The native GQA backend: ``append_attention_reference`` in plain tensors. The oracle of append_attn.

Lengths come from the scheduler's host arrays (``meta.seq_lens_q`` / ``meta.seq_lens_k``), prepared
once per step, so nothing is read back from the device.
"""

from __future__ import annotations

import numpy as np
import torch

from paddle_mla.attention.backend import GQABackend, LayerRope, register_backend
from paddle_mla.attention.forward_meta import GQAStepPlan
from paddle_mla.attention.gqa_reference import append_attention_reference


@register_backend("native")
class NativeGQABackend(GQABackend):
    def prepare(self, meta) -> None:
        meta.attn = GQAStepPlan(np.concatenate([[0], np.cumsum(meta.seq_lens_q)]).astype(np.int64))

    def forward(self, q, k, v, k_cache, v_cache, meta, layer_rope: LayerRope):
        if not isinstance(meta.attn, GQAStepPlan):    # callers that skip prepare (tests): host math only
            self.prepare(meta)
        cu = meta.attn.cu_seqlens_q_host
        out = torch.empty_like(q)
        return append_attention_reference(
            q, k, v, k_cache, v_cache, meta.block_tables, cu, meta.seq_lens_k, meta.batch_id_per_token,
            meta.positions, layer_rope.cos_sin, out, softmax_scale=self.dims.softmax_scale, neox=layer_rope.neox,
            rot_dim=layer_rope.rot_dim, num_swa_heads=self.num_swa_heads, window=self.window, sink=self.sink)
