"""Model dimensions the benchmarks run at: one dict per published model config (the keys the engine
reads), and the benchmark variants derived from them. Plain data: importing this selects no runtime."""

from __future__ import annotations

from dataclasses import dataclass

_YARN_V3 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

V3 = dict(   # DeepSeek-V3's published config.json
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168,
    intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
    num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
    moe_layer_freq=1, n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.5, max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0,
    rope_scaling=_YARN_V3, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16",
    hidden_act="silu", initializer_range=0.02, num_nextn_predict_layers=1,
    quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                         "weight_block_size": [128, 128]})

# The DSA indexer keys of DeepSeek-V3.2 (same attention and MLP dims as V3).
V32_INDEXER = dict(model_type="deepseek_v32", index_topk=2048, index_n_heads=64, index_head_dim=128)
V32 = dict(V3, architectures=["DeepseekV32ForCausalLM"], **V32_INDEXER)

# V3's attention and dense-MLP dims in bf16, every layer dense (no experts, no FP8): the decode-step
# benchmarks' model, built from random weights (``harness.models.random_v3_weights``).
_V3_DENSE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                  "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                  "qk_nope_head_dim", "v_head_dim", "rms_norm_eps", "max_position_embeddings", "rope_theta",
                  "rope_scaling", "bos_token_id", "eos_token_id", "tie_word_embeddings")
V3_DENSE = dict({k: V3[k] for k in _V3_DENSE_KEYS}, n_routed_experts=None, first_k_dense_replace=1000)

V2_LITE = dict(   # DeepSeek-V2-Lite's published config.json
    model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], vocab_size=102400, hidden_size=2048,
    intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=16, num_key_value_heads=16,
    kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1,
    n_group=1, topk_group=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
    routed_scaling_factor=1.0, max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000.0,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    bos_token_id=100000, eos_token_id=100001, tie_word_embeddings=False, torch_dtype="bfloat16",
    attention_bias=False, hidden_act="silu")

V2 = dict(   # DeepSeek-V2's published config.json (236B, bf16 as published)
    V2_LITE, vocab_size=102400, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
    num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, n_routed_experts=160,
    num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, n_group=8, topk_group=3,
    topk_method="group_limited_greedy", routed_scaling_factor=16.0)

QWEN3_8B = dict(   # Qwen3-8B's published config.json
    model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
    intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
    tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16")

ERNIE45_21B_A3B = dict(   # ERNIE-4.5-21B-A3B's published config.json (the -PT checkpoint)
    model_type="ernie4_5_moe", architectures=["Ernie4_5_MoeForCausalLM"], vocab_size=103424, hidden_size=2560,
    intermediate_size=12288, num_hidden_layers=28, num_attention_heads=20, num_key_value_heads=4, head_dim=128,
    moe_num_experts=64, moe_k=6, moe_num_shared_experts=2, moe_intermediate_size=1536, moe_layer_start_index=1,
    moe_layer_interval=1, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, use_bias=False,
    tie_word_embeddings=True, hidden_act="silu", bos_token_id=1, eos_token_id=2, pad_token_id=0,
    torch_dtype="bfloat16")

# CPU smoke dims (tiny, same structure): the MoE override applied on V2_LITE, the MLA one on V3_DENSE,
# the GQA one on QWEN3_8B.
SMOKE_MOE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16,
                 qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                 bos_token_id=0, eos_token_id=1)
SMOKE_MLA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                 v_head_dim=16)
SMOKE_GQA = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)
SMOKE_ERNIE_MOE = dict(SMOKE_GQA, num_hidden_layers=2, moe_num_experts=8, moe_k=2, moe_intermediate_size=32)


@dataclass(frozen=True)
class MoEShape:
    """The routed-expert GEMM shape of a model: what the fused MoE kernel sees."""
    name: str
    E: int          # routed experts
    top_k: int
    N: int          # intermediate size per expert
    K: int          # hidden size

    @classmethod
    def of(cls, name: str, cfg: dict) -> "MoEShape":
        return cls(name, cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
                   cfg["hidden_size"])


MOE_SHAPES = {"v2lite": MoEShape.of("V2-Lite", V2_LITE), "v3": MoEShape.of("V3", V3),
              "tiny": MoEShape("tiny", 8, 2, 128, 256)}
