"""GQA causal LMs (qwen3, ernie4_5, llama; qwen3_moe, ernie4_5_moe with the routed MoE of
``models/moe.py``) over head-major paged K/V caches, attention via a GQABackend.

Plain classes holding tensors; the semantics follow transformers' Qwen3 / Ernie4_5 / Llama modeling
code: RMSNorm in fp32 then cast, per-head q/k RMSNorm before rope (qwen3), rope from one
[max_position, rot_dim] cos||sin table built once (scaling folded in) and applied by the backend,
optional biases (ernie4_5 use_bias, llama attention_bias / mlp_bias), logits in fp32.

Tensor parallel (``tp``): the loader gives each rank its KV heads and their q heads, its MLP / expert
widths and vocabulary rows (``paddle_mla.models.sharding``) and an ``arch`` with its head counts;
the per-head q/k norms need no collective; o_proj and each MLP / MoE block are all-reduced once,
with their output biases added on rank 0 only; embedding and logits as in ``CausalLMBase``.
"""

from __future__ import annotations

from typing import Any

import torch

from paddle_mla.attention.backend import LayerRope
from paddle_mla.models.arch import ModelArch
from paddle_mla.models.causal_lm import CausalLMBase, DecoderLayerBase
from paddle_mla.models.deepseek import DenseMLP, Rope
from paddle_mla.models.fused_ops import rms_norm
from paddle_mla.models.fp8 import linear
from paddle_mla.models.moe import MoE, MoEExec

QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")


def rope_table(arch: ModelArch, device: str) -> LayerRope:
    """cos||sin of every position up to max_position_embeddings, as transformers computes them."""
    rope = Rope(arch.rope, device)
    positions = torch.arange(arch.max_position_embeddings, dtype=torch.int64, device=device)
    cos, sin = rope.cos_sin(positions)
    return LayerRope(cos_sin=torch.cat([cos, sin], -1).contiguous(), neox=not arch.rope.interleave,
                     rot_dim=arch.rope.dim)


def bias_once(tp, bias):
    """A row-parallel output's bias: every rank's partial output is summed, so one rank adds it."""
    return bias if tp is None or tp.rank == 0 else None


class GQAAttention:
    def __init__(self, arch: ModelArch, w: dict[str, Any], prefix: str, tp=None):
        self.dims, self.eps, self.tp = arch.gqa, arch.rms_norm_eps, tp
        a = prefix + "self_attn."
        self.q_proj, self.q_bias = w[a + "q_proj.weight"], w.get(a + "q_proj.bias")
        self.k_proj, self.k_bias = w[a + "k_proj.weight"], w.get(a + "k_proj.bias")
        self.v_proj, self.v_bias = w[a + "v_proj.weight"], w.get(a + "v_proj.bias")
        self.o_proj, self.o_bias = w[a + "o_proj.weight"], bias_once(tp, w.get(a + "o_proj.bias"))
        self.q_norm, self.k_norm = w.get(a + "q_norm.weight"), w.get(a + "k_norm.weight")
        if arch.model_type in QK_NORM_FAMILIES and (self.q_norm is None or self.k_norm is None):
            raise ValueError(f"{arch.model_type} checkpoint lacks {a}q_norm.weight / k_norm.weight")

    def forward(self, x, backend, k_cache, v_cache, meta, layer_rope: LayerRope):
        d = self.dims
        T = x.shape[0]
        q = linear(x, self.q_proj, self.q_bias).view(T, d.num_heads, d.head_dim)
        k = linear(x, self.k_proj, self.k_bias).view(T, d.num_kv_heads, d.head_dim)
        v = linear(x, self.v_proj, self.v_bias).view(T, d.num_kv_heads, d.head_dim)
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, self.eps)
            k = rms_norm(k, self.k_norm, self.eps)
        out = backend.forward(q.contiguous(), k.contiguous(), v.contiguous(), k_cache, v_cache, meta, layer_rope)
        out = linear(out.reshape(T, d.num_heads * d.head_dim).to(x.dtype), self.o_proj, self.o_bias)
        return out if self.tp is None else self.tp.all_reduce(out)


def _moe(arch: ModelArch, w: dict[str, Any], p: str, moe_exec: MoEExec) -> MoE:
    """The routed MoE; ernie4_5_moe's correction bias [1, E] (``moe_statics``) becomes the router's [E]."""
    bias = w.get(p + "moe_statics.e_score_correction_bias")
    if bias is not None:   # into the model's own dict: MoE lets go of the expert tensors it replaces
        w[p + "gate.e_score_correction_bias"] = bias.reshape(-1)
    return MoE(arch, w, p, moe_exec, DenseMLP)


class GQADecoderLayer(DecoderLayerBase):
    def __init__(self, arch: ModelArch, w: dict[str, Any], i: int, moe_exec: MoEExec, tp=None):
        super().__init__(arch, w, i, tp)
        p = f"model.layers.{i}."
        self.attn = GQAAttention(arch, w, p, tp)
        if arch.moe and arch.moe.is_moe_layer(i):
            self.mlp = _moe(arch, w, p + "mlp.", moe_exec)
            dense = self.mlp.shared
        else:
            self.mlp = dense = DenseMLP(w, p + "mlp.")
        if dense is not None:
            dense.down_b = bias_once(tp, dense.down_b)

    def forward(self, delta, residual, backend, kv, meta, layer_rope):
        """(MLP output, residual stream before it): ``DecoderLayerBase.around`` with GQA attention."""
        return self.around(delta, residual, self.attn.forward, backend, kv[0], kv[1], meta, layer_rope)


class GQACausalLM(CausalLMBase):
    """``forward(meta, kv_caches)`` with ``kv_caches`` a list of (k_cache, v_cache) per layer."""

    def __init__(self, arch: ModelArch, weights: dict[str, Any], device: str, dtype: Any, tp=None):
        """``tp``: the tensor-parallel group; ``arch`` and ``weights`` are then this rank's (loader)."""
        if arch.family != "gqa":
            raise ValueError(f"GQACausalLM got a {arch.family} arch ({arch.model_type})")
        super().__init__(arch, weights, device, dtype, tp)
        self.layers = [GQADecoderLayer(arch, weights, i, self.moe_exec, tp) for i in range(arch.num_layers)]
        self.rope = rope_table(arch, device)

    def forward(self, meta, kv_caches: list):
        self._require_backend()
        h, residual = self.embed_tokens(meta.input_ids), None
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = layer.forward(h, residual, self.backend, kv, meta, self.rope)
        return self.final_norm(h, residual)
