"""Model architecture parsed from an HF ``config.json`` (plain data, no tensors).

Both spellings of the rope settings are accepted: ``rope_scaling`` + top-level ``rope_theta``
(the published DeepSeek checkpoints) and ``rope_parameters`` (what transformers 5 writes).
Two families: ``mla`` (DeepSeek; ``ModelArch.mla``) and ``gqa`` (qwen3, ernie4_5, llama;
``ModelArch.gqa``, parsed in ``models/gqa_arch.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from paddle_mla.attention.backend import GQADims, MLADims
from paddle_mla.config.backends import GQA_MODEL_TYPES

MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
SUPPORTED_MODEL_TYPES = MLA_MODEL_TYPES + GQA_MODEL_TYPES
ROPE_TYPES = ("default", "yarn", "linear", "llama3")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")   # in route_kernel's method-id order
SCORING_FUNCS = ("softmax", "sigmoid")


@dataclass
class RopeSpec:
    dim: int
    theta: float
    rope_type: str = "default"            # one of ROPE_TYPES
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    interleave: bool = True               # rope pairs are (x0, x1), (x2, x3), ... rather than halves
    low_freq_factor: float = 1.0          # llama3
    high_freq_factor: float = 4.0         # llama3


@dataclass(frozen=True)   # hashable: the routing kernel's arguments are cached per spec
class MoESpec:
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    # layers from this one on are MoE layers. moe_layer_freq is not read: transformers' DeepseekV2/V3
    # (the oracle) ignore it, and every published DeepSeek checkpoint has 1, where DeepSeek's own
    # code agrees; a checkpoint of another freq saved by that code fails the layout check at load
    first_k_dense_replace: int
    topk_method: str                      # greedy | group_limited_greedy | noaux_tc
    scoring_func: str                     # softmax | sigmoid
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    # DeepSeek-V2's own code scales by routed_scaling_factor only when it does NOT normalise;
    # V3 normalises and then always scales.
    scale_after_norm: bool = True
    # the MoE layers when a family lists them some other way (qwen3_moe, ernie4_5_moe)
    moe_layers: frozenset[int] | None = None
    # the least divisor of the normalisation (``weight_rule``): ernie4_5_moe's moe_norm_min
    norm_min: float = 0.0

    def is_moe_layer(self, i: int) -> bool:
        if self.moe_layers is not None:
            return i in self.moe_layers
        return i >= self.first_k_dense_replace

    def weight_rule(self) -> tuple[bool, bool]:
        """(normalise the top-k weights to sum 1, then multiply them by routed_scaling_factor): V3
        normalises where norm_topk_prob says and always scales; V2's own code normalises instead of
        scaling (a single expert's weight is never normalised there). Normalising divides by
        max(sum + 1e-20, norm_min)."""
        if self.scale_after_norm:
            return self.norm_topk_prob, True
        norm = self.norm_topk_prob and self.num_experts_per_tok > 1
        return norm, not norm


@dataclass
class IndexerSpec:
    """DeepSeek-V3.2 lightning indexer (DSA): which ``topk`` keys each query attends."""

    topk: int                             # index_topk
    n_heads: int                          # index_n_heads
    head_dim: int                         # index_head_dim (its first qk_rope_head_dim dims are roped)


@dataclass
class ModelArch:
    model_type: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: list[int]
    mla: MLADims | None                   # family "mla"
    # below: what the DeepSeek layers need beyond the contract
    rms_norm_eps: float = 1e-6
    q_lora_rank: int | None = None
    rope: RopeSpec | None = None
    moe: MoESpec | None = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    fp8_block_size: tuple[int, int] | None = None
    indexer: IndexerSpec | None = None    # deepseek_v32 only
    gqa: GQADims | None = None            # family "gqa"
    raw: dict = field(default_factory=dict, repr=False)


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_spec_from(cfg: dict, dim: int, interleave: bool) -> RopeSpec:
    """The rope of ``dim`` rotated dims from either spelling of the settings (any family)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")
    spec = RopeSpec(dim=dim, theta=float(theta), rope_type=rope_type, interleave=interleave)
    if rope_type in ("yarn", "llama3"):
        spec.original_max_position_embeddings = int(
            params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings",
                                                                   cfg["max_position_embeddings"])))
    if rope_type == "linear":
        spec.factor = float(params["factor"])
    if rope_type == "llama3":
        spec.factor = float(params["factor"])
        spec.low_freq_factor = float(params.get("low_freq_factor", 1.0))
        spec.high_freq_factor = float(params.get("high_freq_factor", 4.0))
    if rope_type == "yarn":
        factor = params.get("factor")
        spec.factor = float(factor) if factor is not None else (
            cfg["max_position_embeddings"] / spec.original_max_position_embeddings)
        spec.beta_fast = float(params.get("beta_fast") or 32)
        spec.beta_slow = float(params.get("beta_slow") or 1)
        spec.mscale = params.get("mscale")
        spec.mscale_all_dim = params.get("mscale_all_dim")
        spec.attention_factor = params.get("attention_factor")
        spec.truncate = bool(params.get("truncate", True))
    return spec


def _rope_spec(cfg: dict, model_type: str) -> RopeSpec:
    # HF DeepseekV2 and V3.2 always rotate interleaved pairs in MLA; V3 follows rope_interleave.
    interleave = True if model_type in ("deepseek_v2", "deepseek_v32") else bool(cfg.get("rope_interleave", True))
    spec = rope_spec_from(cfg, int(cfg["qk_rope_head_dim"]), interleave)
    if spec.rope_type not in ("default", "yarn"):
        raise ValueError(f"unsupported rope type {spec.rope_type!r} for {model_type} (supported: default, yarn)")
    return spec


def activation(cfg: dict, model_type: str) -> str:
    """config.json's ``hidden_act``, which must be silu: the MLPs and experts are SwiGLU, and another
    activation would run silently as SiLU."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{model_type}: hidden_act {act!r} is not supported (silu only)")
    return act


def check_routing(spec: MoESpec, model_type: str) -> MoESpec:
    """``spec`` when its routing can run; a ValueError naming the config.json key otherwise, where
    the router would fail at the first MoE layer or route past the experts."""
    k, E, G = spec.num_experts_per_tok, spec.n_routed_experts, spec.n_group
    if spec.topk_method not in TOPK_METHODS:
        raise ValueError(f"{model_type}: topk_method {spec.topk_method!r} is not supported "
                         f"(supported: {', '.join(TOPK_METHODS)})")
    if spec.scoring_func not in SCORING_FUNCS:
        raise ValueError(f"{model_type}: scoring_func {spec.scoring_func!r} is not supported "
                         f"(supported: {', '.join(SCORING_FUNCS)})")
    if not 0 < k <= E:
        raise ValueError(f"{model_type}: num_experts_per_tok {k} must be 1 to the number of routed experts ({E})")
    if spec.topk_method != "greedy":   # greedy ignores the groups
        if G < 1 or E % G:
            raise ValueError(f"{model_type}: n_group {G} does not divide the {E} routed experts into equal groups")
        if not 0 < spec.topk_group <= G:
            raise ValueError(f"{model_type}: topk_group {spec.topk_group} must be 1 to n_group ({G})")
        if spec.topk_method == "noaux_tc" and E // G < 2:   # a group scores as the sum of its two best
            raise ValueError(f"{model_type}: noaux_tc needs groups of 2 or more experts; n_group {G} makes groups of "
                             f"{E // G}")
    return spec


def _moe_spec(cfg: dict, model_type: str) -> MoESpec | None:
    n_routed = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if not n_routed:
        return None
    v3 = model_type in ("deepseek_v3", "deepseek_v32")
    return check_routing(MoESpec(
        n_routed_experts=int(n_routed),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        n_shared_experts=int(cfg.get("n_shared_experts") or 0),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        # transformers' DeepseekV3 router is always sigmoid + noaux_tc; V2 always softmax.
        topk_method=cfg.get("topk_method") or ("noaux_tc" if v3 else "greedy"),
        scoring_func=cfg.get("scoring_func") or ("sigmoid" if v3 else "softmax"),
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", v3)),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        scale_after_norm=v3,
    ), model_type)


def _indexer_spec(cfg: dict, model_type: str) -> IndexerSpec | None:
    if model_type != "deepseek_v32":
        return None
    if not cfg.get("q_lora_rank"):
        raise ValueError("deepseek_v32 needs q_lora_rank: the indexer's wq_b reads the q_lora residual")
    spec = IndexerSpec(topk=int(cfg.get("index_topk", 2048)), n_heads=int(cfg.get("index_n_heads", 64)),
                       head_dim=int(cfg.get("index_head_dim", 128)))
    if spec.head_dim < int(cfg["qk_rope_head_dim"]) or spec.topk < 1:
        raise ValueError(f"bad indexer dims {spec} for qk_rope_head_dim {cfg['qk_rope_head_dim']}")
    return spec


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def eos_ids_of(cfg: dict, generation_cfg: dict | None) -> list[int]:
    """config.json's eos ids, then generation_config.json's that are not among them."""
    eos = _eos_ids(cfg.get("eos_token_id"))
    for e in _eos_ids((generation_cfg or {}).get("eos_token_id")):
        if e not in eos:
            eos.append(e)
    return eos


def parse_arch(cfg: dict, generation_cfg: dict | None = None) -> ModelArch:
    model_type = cfg.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if model_type in GQA_MODEL_TYPES:
        from paddle_mla.models.gqa_arch import parse_gqa_arch

        return parse_gqa_arch(cfg, generation_cfg)
    rope = _rope_spec(cfg, model_type)
    nope, rope_dim, v = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
    scale = (nope + rope_dim) ** -0.5
    if rope.rope_type == "yarn" and rope.mscale_all_dim:
        m = yarn_get_mscale(rope.factor, float(rope.mscale_all_dim))
        scale = scale * m * m
    mla = MLADims(num_heads=int(cfg["num_attention_heads"]), kv_lora_rank=int(cfg["kv_lora_rank"]),
                  qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=v, softmax_scale=scale)
    act = activation(cfg, model_type)
    eos = eos_ids_of(cfg, generation_cfg)
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size")
    return ModelArch(
        model_type=model_type, family="mla", vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]), max_position_embeddings=int(cfg["max_position_embeddings"]),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos, mla=mla,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), q_lora_rank=cfg.get("q_lora_rank"), rope=rope,
        moe=_moe_spec(cfg, model_type), tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=act,
        fp8_block_size=tuple(block) if block else None, indexer=_indexer_spec(cfg, model_type), raw=cfg,
    )


def load_arch(model_dir: str | Path) -> ModelArch:
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    if not isinstance(cfg, dict):
        raise TypeError(f"its top level is a JSON {type(cfg).__name__}, not an object")
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else None
    return parse_arch(cfg, gen)
