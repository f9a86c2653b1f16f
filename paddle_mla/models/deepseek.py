"""DeepSeek-V2 / V3 causal LM over the paged latent cache (MLA in absorbed form via a backend).

Plain classes holding tensors; the semantics follow transformers' DeepseekV2/V3 modeling code
(RMSNorm in fp32 then cast, router in fp32, logits in fp32).

Tensor parallel (``tp``, a ``paddle_mla.parallel.group.TPGroup``): the loader gives each rank its
shards (``paddle_mla.models.sharding``) and an ``arch`` with its share of the heads; here the
row-parallel outputs (o_proj, each MLP / MoE block) are all-reduced once, the embedding is looked
up vocab-parallel and the logits are gathered to the full vocabulary on every rank (the shared
parts: ``paddle_mla.models.causal_lm``).
"""

from __future__ import annotations

import math
from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import torch.nn.functional as F

from paddle_mla.models.arch import ModelArch, RopeSpec, yarn_get_mscale
from paddle_mla.models.causal_lm import CausalLMBase, DecoderLayerBase
from paddle_mla.models.moe import MoE, MoEExec
from paddle_mla.models.fp8 import dense, linear   # linear: dense or FP8 block-scaled weights
from paddle_mla.models.indexer import Indexer
from paddle_mla.models.fused_ops import mla_latent, rms_norm, rope_rotate

# q_a_layernorm and kv_a_layernorm: transformers' DeepseekV2/V3/V32 (and DeepSeek's own modeling
# code) build them with the RMSNorm default eps, whatever config.rms_norm_eps says; rms_norm_eps is
# the decoder layers' and the final norm's
LATENT_NORM_EPS = 1e-6


def llama3_inv_freq(inv, spec: RopeSpec):
    """transformers' llama3 scaling: long wavelengths / factor, short ones kept, a smooth ramp between."""
    orig = spec.original_max_position_embeddings
    low_wavelen, high_wavelen = orig / spec.low_freq_factor, orig / spec.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / spec.factor, inv)
    smooth = (orig / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
    smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope:
    """cos/sin of the rope dims for given positions (default, yarn, linear or llama3), as transformers
    computes them."""

    def __init__(self, spec: RopeSpec, device: str):
        self.spec = spec
        dim = spec.dim
        pos_freqs = spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        inv_extra = 1.0 / pos_freqs
        scaling = 1.0
        if spec.rope_type == "yarn":
            inv_inter = 1.0 / (spec.factor * pos_freqs)
            low, high = self._correction_range(spec, dim)
            if low == high:
                high += 0.001
            ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
            extra_factor = 1 - ramp
            inv = inv_inter * (1 - extra_factor) + inv_extra * extra_factor
            if spec.attention_factor is not None:
                scaling = float(spec.attention_factor)
            elif spec.mscale and spec.mscale_all_dim:
                scaling = yarn_get_mscale(spec.factor, spec.mscale) / yarn_get_mscale(spec.factor, spec.mscale_all_dim)
            else:
                scaling = yarn_get_mscale(spec.factor)
        elif spec.rope_type == "linear":
            inv = inv_extra / spec.factor
        elif spec.rope_type == "llama3":
            inv = llama3_inv_freq(inv_extra, spec)
        else:
            inv = inv_extra
        self.inv_freq = inv.to(device)
        self.scaling = float(scaling)

    @staticmethod
    def _correction_range(spec: RopeSpec, dim: int):
        def corr_dim(rot):
            return (dim * math.log(spec.original_max_position_embeddings / (rot * 2 * math.pi))) / (
                2 * math.log(spec.theta))

        low, high = corr_dim(spec.beta_fast), corr_dim(spec.beta_slow)
        if spec.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def cos_sin(self, positions):
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq.unsqueeze(0)   # [T, dim/2]
        return freqs.cos() * self.scaling, freqs.sin() * self.scaling

    def apply(self, x, cos, sin):
        """x [T, (H,) dim] -> roped, laid out as (rotated firsts || rotated seconds).

        Interleaved models pair (x0, x1), (x2, x3)...; others pair (x_i, x_{i+dim/2}). The output
        layout is the same half-split in both cases; q and k share it, so scores are unchanged
        (transformers' V2 keeps pairs interleaved in its output: same dot products).
        """
        fused = rope_rotate(x, cos, sin, self.spec.interleave)
        if fused is not None:
            return fused
        if x.dim() == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        xf = x.to(torch.float32)
        if self.spec.interleave:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
        else:
            half = x.shape[-1] // 2
            x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def split_apply(self, x, nope: int, cos, sin):
        """x [T, H, nope + dim] (MLA's q) -> (x's first ``nope`` dims, contiguous; the rest roped)."""
        fused = rope_rotate(x, cos, sin, self.spec.interleave, nope)
        if fused is not None:
            return fused
        return x[..., :nope].contiguous(), self.apply(x[..., nope:], cos, sin)


class MLAAttention:
    def __init__(self, arch: ModelArch, w: dict[str, Any], prefix: str, tp=None):
        d = arch.mla
        self.tp = tp
        self.arch, self.dims, self.eps = arch, d, LATENT_NORM_EPS
        p = prefix + "self_attn."
        self.q_lora = arch.q_lora_rank is not None
        if self.q_lora:
            self.q_a_proj, self.q_a_bias = w[p + "q_a_proj.weight"], w.get(p + "q_a_proj.bias")
            self.q_a_norm = w[p + "q_a_layernorm.weight"]
            self.q_b_proj = w[p + "q_b_proj.weight"]
        else:
            self.q_proj = w[p + "q_proj.weight"]
        self.kv_a_proj, self.kv_a_bias = w[p + "kv_a_proj_with_mqa.weight"], w.get(p + "kv_a_proj_with_mqa.bias")
        self.kv_a_norm = w[p + "kv_a_layernorm.weight"]
        # kv_b is split into the absorbed per-head weights the attention backends take: always dense
        kv_b = dense(w[p + "kv_b_proj.weight"], self.kv_a_norm.dtype)
        kv_b = kv_b.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        self.w_kc = kv_b[:, :d.qk_nope_head_dim, :].contiguous()                     # [H, nope, C]
        self.w_vc = kv_b[:, d.qk_nope_head_dim:, :].transpose(1, 2).contiguous()     # [H, C, v]
        self.o_proj, self.o_bias = w[p + "o_proj.weight"], w.get(p + "o_proj.bias")
        self.indexer = Indexer(arch, w, p + "indexer.") if arch.indexer is not None else None

    def forward(self, x, cos, sin, rope: Rope, backend, kv_cache, meta):
        share = meta.share
        if share is None and self.tp is not None and self.tp.attention_rows:
            # the head path would all-reduce N whole outputs: N times the attention, silently
            raise RuntimeError("attention split by rows needs the step's row share (ModelRunner.run_model builds it)")
        if share is None:
            out = self._attend(x, self._latent(x, cos, sin, rope), cos, sin, rope, backend, kv_cache, meta)
            if self.tp is None:
                return linear(out, self.o_proj, self.o_bias)
            out = self.tp.all_reduce(linear(out, self.o_proj))   # row-parallel: partial sums; bias once
            return out if self.o_bias is None else out + self.o_bias
        # attention split by rows (attention.row_share): every token's latent into this rank's copy
        # of the cache (a later step may attend its request here), this rank's rows attended with
        # every head, the ranks' outputs gathered
        latent = self._latent(x, cos, sin, rope)
        backend.write_cache(latent, kv_cache, meta.slot_mapping)
        a, b = share.start, share.stop
        local = None
        if share.meta is not None:
            local = linear(self._attend(x[a:b], latent[a:b], cos[a:b], sin[a:b], rope, backend, kv_cache, share.meta),
                           self.o_proj, self.o_bias)
        if local is None or local.shape[0] < share.chunk:   # eager steps: the last ranks' shares padded
            padded = x.new_zeros(share.chunk, x.shape[1])
            if local is not None:
                padded[:local.shape[0]].copy_(local)
            local = padded
        return self.tp.gather_rows(local, share.num_tokens)

    def _latent(self, x, cos, sin, rope: Rope):
        """The latent cache rows of ``x``: normalized compressed kv || roped k_pe."""
        d = self.dims
        ckv = linear(x, self.kv_a_proj, self.kv_a_bias)
        fused = mla_latent(ckv, self.kv_a_norm, self.eps, cos, sin, rope.spec.interleave)
        if fused is not None:
            return fused
        c, k_pe = torch.split(ckv, [d.kv_lora_rank, d.qk_rope_head_dim], -1)
        return torch.cat([rms_norm(c, self.kv_a_norm, self.eps), rope.apply(k_pe, cos, sin)], -1)

    def _attend(self, x, latent, cos, sin, rope: Rope, backend, kv_cache, meta):
        """The attention of the tokens ``x`` with their ``latent`` rows (written into the cache on
        the way) -> [T, heads * v_head_dim], before o_proj."""
        d = self.dims
        T = x.shape[0]
        if self.q_lora:
            q_resid = rms_norm(linear(x, self.q_a_proj, self.q_a_bias), self.q_a_norm, self.eps)
            q = linear(q_resid, self.q_b_proj)
        else:
            q = linear(x, self.q_proj)
        q = q.view(T, d.num_heads, d.qk_nope_head_dim + d.qk_rope_head_dim)
        q_nope, q_pe = rope.split_apply(q, d.qk_nope_head_dim, cos, sin)
        sparse = {}
        if self.indexer is not None:   # DSA: attend only the indexer's top-k keys
            sparse["topk_pos"] = self.indexer.select(x, q_resid, cos, sin, backend, meta)
        out = backend.forward(q_nope, q_pe, latent.contiguous(), self.w_kc, self.w_vc,
                              kv_cache, meta, **sparse)
        return out.reshape(T, d.num_heads * d.v_head_dim).to(x.dtype)


class DenseMLP:
    """SwiGLU MLP; biases where the checkpoint has them (ernie4_5 use_bias, llama mlp_bias)."""

    def __init__(self, w: dict[str, Any], p: str):
        self.gate, self.up, self.down = w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"]
        self.gate_b, self.up_b, self.down_b = (w.get(p + n + ".bias") for n in ("gate_proj", "up_proj", "down_proj"))

    def forward(self, x):
        return linear(F.silu(linear(x, self.gate, self.gate_b)) * linear(x, self.up, self.up_b), self.down, self.down_b)


class DecoderLayer(DecoderLayerBase):
    def __init__(self, arch: ModelArch, w: dict[str, Any], i: int, moe_exec: MoEExec, tp=None):
        super().__init__(arch, w, i, tp)
        p = f"model.layers.{i}."
        self.attn = MLAAttention(arch, w, p, tp)
        if arch.moe and arch.moe.is_moe_layer(i):
            self.mlp = MoE(arch, w, p + "mlp.", moe_exec, DenseMLP)
        else:
            self.mlp = DenseMLP(w, p + "mlp.")

    def forward(self, delta, residual, cos, sin, rope, backend, kv_cache, meta):
        """(MLP output, residual stream before it): ``DecoderLayerBase.around`` with MLA attention."""
        return self.around(delta, residual, self.attn.forward, cos, sin, rope, backend, kv_cache, meta)


class CausalLM(CausalLMBase):
    def __init__(self, arch: ModelArch, weights: dict[str, Any], device: str, dtype: Any, tp=None):
        """``tp``: the tensor-parallel group; ``arch`` and ``weights`` are then this rank's (loader)."""
        super().__init__(arch, weights, device, dtype, tp)
        self.layers = [DecoderLayer(arch, weights, i, self.moe_exec, tp) for i in range(arch.num_layers)]
        self.rope = Rope(arch.rope, device)

    def attach_index_caches(self, caches: list) -> None:
        """deepseek_v32: the per-layer indexer key caches (paged like the latent caches)."""
        for layer, cache in zip(self.layers, caches):
            layer.attn.indexer.cache = cache

    def forward(self, meta, kv_caches: list):
        self._require_backend()
        h = self.embed_tokens(meta.input_ids)
        cos, sin = self.rope.cos_sin(meta.positions)
        residual = None
        for layer, cache in zip(self.layers, kv_caches):
            h, residual = layer.forward(h, residual, cos, sin, self.rope, self.backend, cache, meta)
        return self.final_norm(h, residual)
