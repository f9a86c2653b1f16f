"""What every causal LM here shares around attention: the token embedding, the final norm, the LM
head and the logits, the fused-MoE workspace and the attention backend (``CausalLMBase``), and a
decoder layer's norms, fused residual stream and MLP / MoE (``DecoderLayerBase``). The DeepSeek (MLA)
and GQA models subclass both with their own attention and rope.

Tensor parallel (``tp``, a ``paddle_mla.parallel.group.TPGroup``): the embedding is looked up
vocab-parallel and the logits are gathered to the full vocabulary on every rank.
"""

from __future__ import annotations

from typing import Any

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch
import torch.nn.functional as F

from paddle_mla.models.arch import ModelArch
from paddle_mla.models.fp8 import linear
from paddle_mla.models.fused_ops import add_rms_norm, rms_norm
from paddle_mla.models.moe import MoE, MoEExec


class DecoderLayerBase:
    def __init__(self, arch: ModelArch, w: dict[str, Any], i: int, tp=None):
        """Layer ``i``'s norms; subclasses add ``attn`` and ``mlp``."""
        p = f"model.layers.{i}."
        self.eps, self.tp = arch.rms_norm_eps, tp
        self.in_norm = w[p + "input_layernorm.weight"]
        self.post_norm = w[p + "post_attention_layernorm.weight"]

    def around(self, delta, residual, attend, *attend_args):
        """(this layer's MLP output, the residual stream before it), with ``attend(x, *attend_args)``
        the attention of the normed hidden state. The residual adds are fused into the next norm: ``residual +
        delta`` is the hidden state the layer starts from (the embedding when ``residual`` is None);
        the caller adds the returned pair the same way. Under TP the MLP / MoE partials are
        all-reduced once."""
        if residual is None:
            residual, x = delta, rms_norm(delta, self.in_norm, self.eps)
        else:
            residual, x = add_rms_norm(residual, delta, self.in_norm, self.eps)
        residual, x = add_rms_norm(residual, attend(x, *attend_args), self.post_norm, self.eps)
        out = self.mlp.forward(x)
        return (out if self.tp is None else self.tp.all_reduce(out)), residual


class CausalLMBase:
    def __init__(self, arch: ModelArch, weights: dict[str, Any], device: str, dtype: Any, tp=None):
        """``tp``: the tensor-parallel group; ``arch`` and ``weights`` are then this rank's (loader).
        Subclasses build ``self.layers`` (each with an ``mlp``) after this."""
        self.arch, self.device, self.dtype, self.tp = arch, device, dtype, tp
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights.get("lm_head.weight", self.embed if arch.tie_word_embeddings else None)
        if self.lm_head is None:
            raise ValueError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
        if tp is not None:   # this rank's first token id, and its LM-head rows padded for the gather
            self.vocab_start = tp.vocab_range(arch.vocab_size)[0]
            self.lm_head = tp.pad_vocab_rows(self.lm_head, arch.vocab_size)
        self.moe_exec = MoEExec(device, dtype)
        self.layers: list = []
        self.backend = None

    def set_backend(self, backend) -> None:
        self.backend = backend

    def embed_tokens(self, ids):
        """Token embeddings, looked up vocab-parallel under TP."""
        if self.tp is None:
            return F.embedding(ids, self.embed)
        return self.tp.embed(ids, self.embed, self.vocab_start)

    def final_norm(self, h, residual):
        """The last layer's output plus its residual (none when there are no layers), normalized."""
        if residual is None:
            return rms_norm(h, self.norm, self.arch.rms_norm_eps)
        return add_rms_norm(residual, h, self.norm, self.arch.rms_norm_eps)[1]

    def reserve_moe_workspace(self, max_num_tokens: int) -> None:
        """Size the fused MoE buffers for calls of up to ``max_num_tokens`` tokens (once, at start-up)."""
        moe = next((layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)), None)
        if moe is not None:
            # this rank's experts (all of them, unless expert parallel), with the shared ones folded in
            self.moe_exec.reserve(max_num_tokens, moe.pairs_per_token, moe.w_gate.shape[0], moe.inter_size,
                                  self.arch.hidden_size, fp8=moe.fp8)

    def compute_logits(self, hidden_rows):
        logits = linear(hidden_rows, self.lm_head)
        if self.tp is not None:   # gathered in the model dtype (half the bytes), cast once
            logits = self.tp.gather_vocab(logits, self.arch.vocab_size)
        return logits.to(torch.float32)

    def _require_backend(self) -> None:
        if self.backend is None:
            raise RuntimeError("call set_backend() before forward()")
