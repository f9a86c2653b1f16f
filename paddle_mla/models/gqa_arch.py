"""config.json of a GQA family (qwen3, ernie4_5, llama) -> ModelArch with ``gqa`` dims and its rope.

Per family: qwen3 has per-head q/k RMSNorm (found by its weights) and neox rope; llama has neox
rope, optionally llama3 scaling; ernie4_5 rotates interleaved pairs and ties its embeddings by
default. Any of them may carry linear / yarn scaling; rope covers the whole head.
"""

from __future__ import annotations

from paddle_mla.attention.backend import GQADims
from paddle_mla.models.arch import ModelArch, eos_ids_of, rope_spec_from

INTERLEAVED_ROPE = ("ernie4_5",)          # GPT-J style pairs (x[2i], x[2i+1]); the others rotate halves
TIED_BY_DEFAULT = ("ernie4_5",)           # transformers' config default for tie_word_embeddings


def parse_gqa_arch(cfg: dict, generation_cfg: dict | None = None) -> ModelArch:
    model_type = cfg["model_type"]
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    if heads % kv_heads:
        raise ValueError(f"{model_type}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv_heads}")
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{model_type}: sliding-window layers (use_sliding_window: true) are not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{model_type}: hidden_act {act!r} is not supported (silu only)")
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    # These families rotate the whole head (transformers' default rope ignores partial_rotary_factor).
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        raise ValueError(f"{model_type}: partial_rotary_factor {partial} is not supported (whole-head rope only)")
    if head_dim % 2:
        raise ValueError(f"{model_type}: head_dim {head_dim} must be even for rope")
    rope = rope_spec_from(cfg, head_dim, interleave=model_type in INTERLEAVED_ROPE)
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size")
    return ModelArch(
        model_type=model_type, family="gqa", vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]), max_position_embeddings=int(cfg["max_position_embeddings"]),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids_of(cfg, generation_cfg), mla=None,
        gqa=GQADims(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, softmax_scale=head_dim ** -0.5),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope=rope,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        hidden_act=act, fp8_block_size=tuple(block) if block else None, raw=cfg,
    )
