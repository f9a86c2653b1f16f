"""Bytes and FLOPs a DeepSeek-family (MLA + routed MoE) step must move or compute, from its config:
what the end-to-end figures are divided by to give a share of the roofline. Plain arithmetic."""

from __future__ import annotations


def weight_counts(cfg: dict) -> dict:
    """Parameters by role, per the checkpoint layout (``checkpoints.tensor_specs``)."""
    h, H = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    kvl, r, v = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    L, dense_layers = cfg["num_hidden_layers"], min(cfg["first_k_dense_replace"], cfg["num_hidden_layers"])
    attn = H * qk * h + (kvl + r) * h + H * (cfg["qk_nope_head_dim"] + v) * kvl + h * H * v + kvl + 2 * h
    inter = cfg["moe_intermediate_size"]
    return dict(attn_per_layer=attn, dense_mlp=3 * h * cfg["intermediate_size"], expert=3 * h * inter,
                shared=3 * h * inter * cfg["n_shared_experts"], router=cfg["n_routed_experts"] * h,
                lm_head=cfg["vocab_size"] * h, layers=L, dense_layers=dense_layers, moe_layers=L - dense_layers)


def decode_bytes(cfg: dict, routed_distinct: list[int], batch: int, context: int, elt: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step reads: every weight once, routed experts as selected."""
    c = weight_counts(cfg)
    params = (c["layers"] * c["attn_per_layer"] + c["dense_layers"] * c["dense_mlp"] + c["lm_head"]
              + c["moe_layers"] * c["shared"] + sum(routed_distinct) * c["expert"])
    router = c["moe_layers"] * c["router"] * 4                                  # fp32 router weights
    kv = batch * context * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * elt * c["layers"]
    return params * elt + router, kv


def prefill_flops(cfg: dict, batch: int, length: int) -> float:
    """Matmul FLOPs of one prefill step: every linear on every token (top-k experts + shared), causal
    attention (QK^T over qk dims, PV over v dims), lm_head on the one sampled row per sequence."""
    c = weight_counts(cfg)
    k = cfg["num_experts_per_tok"]
    tokens = batch * length
    per_token = (c["layers"] * c["attn_per_layer"] + c["dense_layers"] * c["dense_mlp"]
                 + c["moe_layers"] * (c["shared"] + k * c["expert"] + c["router"]))
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    attn = c["layers"] * batch * cfg["num_attention_heads"] * 2 * (qk + cfg["v_head_dim"]) * length * (length + 1) / 2
    return 2.0 * tokens * per_token + attn + 2.0 * batch * c["lm_head"]
