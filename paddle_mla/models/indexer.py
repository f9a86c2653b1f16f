"""DeepSeek-V3.2 lightning indexer: picks the ``index_topk`` keys each query attends (DSA).

Follows transformers' ``DeepseekV32Indexer`` (the oracle; it skips the reference kernels' Hadamard
rotation and FP8 scoring, which preserve the dot products):
- ``q = wq_b(q_resid)``: ``n_heads`` heads of ``head_dim``, ``q_resid`` the MLA q_lora residual;
- ``k = LayerNorm(wk(x))``: one head per token, kept in a paged key cache (same block ids as the
  latent cache, so prefix caching, chunked prefill and preemption carry over);
- RoPE on the first ``qk_rope_head_dim`` dims of both, always half-split (NOT interleaved, even
  when the MLA rope is);
- ``score[t, j] = sum_h relu(q_h . k_j) * head_dim**-0.5 * weights_proj(x)_h * n_heads**-0.5``.
The scoring + top-k run in the attention backend (``backend.index_topk``); this module owns the
projections. Ties at the k-th score go to the earlier position in every backend (docs/dsa.md).
"""

from __future__ import annotations

from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import torch.nn.functional as F

from paddle_mla.ops import batch_invariant
from paddle_mla.models.arch import ModelArch
from paddle_mla.models.fused_ops import indexer_rope_norm


def rope_half_split(x, cos, sin, rope_dim: int):
    """Half-split RoPE on the first ``rope_dim`` dims of x [T, (H,) D]; the rest passes through."""
    if x.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = rope_dim // 2
    x1, x2, rest = torch.split(x.to(torch.float32), [half, half, x.shape[-1] - rope_dim], -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1).to(x.dtype)


class Indexer:
    def __init__(self, arch: ModelArch, w: dict[str, Any], prefix: str):
        spec = arch.indexer
        self.spec, self.rope_dim = spec, arch.mla.qk_rope_head_dim
        self.wq_b = w[prefix + "wq_b.weight"]                     # [H * D, q_lora_rank]
        self.wk = w[prefix + "wk.weight"]                         # [D, hidden]
        self.k_norm_w, self.k_norm_b = w[prefix + "k_norm.weight"], w[prefix + "k_norm.bias"]
        self.weights_proj = w[prefix + "weights_proj.weight"].to(torch.float32)   # fp32, as in transformers
        # relu(a * s) = s * relu(a) for s > 0: both scales fold into the per-head weights
        self.weight_scale = spec.head_dim ** -0.5 * spec.n_heads ** -0.5
        self.cache = None                                         # [num_blocks, block_size, 1, D], attached

    def project(self, x, q_resid, cos, sin):
        """-> q [T, H, D], k [T, D] (roped, model dtype), w [T, H] float32 (scales folded in)."""
        s = self.spec
        T = x.shape[0]
        q = batch_invariant.linear_for_mode(q_resid, self.wq_b).view(T, s.n_heads, s.head_dim)
        k = batch_invariant.linear_for_mode(x, self.wk)
        fused = indexer_rope_norm(q, k, cos, sin, self.rope_dim, self.k_norm_w, self.k_norm_b, 1e-6)
        if fused is not None:
            q, k = fused
        else:
            k = F.layer_norm(k, [s.head_dim], self.k_norm_w, self.k_norm_b, 1e-6)
            q = rope_half_split(q, cos, sin, self.rope_dim)
            k = rope_half_split(k, cos, sin, self.rope_dim)
        w = batch_invariant.linear_for_mode(x.to(torch.float32), self.weights_proj) * self.weight_scale
        return q.contiguous(), k.contiguous(), w

    def select(self, x, q_resid, cos, sin, backend, meta):
        """Top-k key positions per new token, int64 [T, topk] (-1 padded), via the backend."""
        if self.cache is None:
            raise RuntimeError("deepseek_v32: no indexer key cache attached (CausalLM.attach_index_caches)")
        q, k, w = self.project(x, q_resid, cos, sin)
        return backend.index_topk(q, k, w, self.cache, meta, self.spec.topk)
