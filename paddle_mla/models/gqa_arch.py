"""config.json of a GQA family (qwen3, ernie4_5, llama, qwen3_moe, ernie4_5_moe) -> ModelArch with
``gqa`` dims, its rope and (the MoE ones) its routing as a ``MoESpec`` for ``models/moe.py``.

Per family: qwen3 has per-head q/k RMSNorm (found by its weights) and neox rope; llama has neox
rope, optionally llama3 scaling; ernie4_5 rotates interleaved pairs and ties its embeddings by
default. Any of them may carry linear / yarn scaling; rope covers the whole head.
Routing, as transformers computes it: qwen3_moe softmax -> top-k (-> renormalised when
norm_topk_prob); ernie4_5_moe softmax -> top-k of (probs + e_score_correction_bias) -> the chosen
probs divided by max(their sum, moe_norm_min), plus shared experts.
"""

from __future__ import annotations

from paddle_mla.attention.backend import GQADims
from paddle_mla.models.arch import ModelArch, MoESpec, activation, check_routing, eos_ids_of, rope_spec_from

INTERLEAVED_ROPE = ("ernie4_5", "ernie4_5_moe")   # GPT-J style pairs (x[2i], x[2i+1]); the others rotate halves
TIED_BY_DEFAULT = ("ernie4_5", "ernie4_5_moe")    # transformers' config default for tie_word_embeddings


def gqa_moe_spec(cfg: dict, model_type: str) -> MoESpec | None:
    n_layers = int(cfg["num_hidden_layers"])
    if model_type == "qwen3_moe":
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        layers = frozenset(i for i in range(n_layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
        top_k, shared, method = int(cfg["num_experts_per_tok"]), 0, "greedy"
        norm, norm_min = bool(cfg.get("norm_topk_prob", False)), 0.0
    elif model_type == "ernie4_5_moe":
        experts = int(cfg.get("moe_num_experts") or cfg.get("num_experts") or 0)
        step = int(cfg.get("moe_layer_interval") or 1)
        # transformers' defaults: MoE from layer 1; an end index of -1 is the last layer
        start, end = int(cfg.get("moe_layer_start_index", 1)), int(cfg.get("moe_layer_end_index", -1))
        end = n_layers - 1 if end < 0 else end
        layers = frozenset(i for i in range(n_layers) if (i + 1) % step == 0 and start <= i <= end)
        top_k, shared = int(cfg.get("moe_k") or cfg["num_experts_per_tok"]), int(cfg.get("moe_num_shared_experts") or 0)
        # top-k of probs + correction bias (noaux_tc with one group), weights from the probs divided by
        # max(their sum, moe_norm_min)
        method, norm, norm_min = "noaux_tc", True, float(cfg.get("moe_norm_min", 1e-12) or 0.0)
    else:
        return None
    if not experts:
        return None
    return check_routing(MoESpec(
        n_routed_experts=experts, num_experts_per_tok=top_k, n_shared_experts=shared, first_k_dense_replace=0,
        topk_method=method, scoring_func="softmax", n_group=1, topk_group=1, norm_topk_prob=norm,
        routed_scaling_factor=1.0, scale_after_norm=True, moe_layers=layers, norm_min=norm_min), model_type)


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
    act = activation(cfg, model_type)
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
        hidden_act=act, fp8_block_size=tuple(block) if block else None, moe=gqa_moe_spec(cfg, model_type), raw=cfg,
    )
