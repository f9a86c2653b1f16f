"""The head-wise SWA benchmark's modes and model presets (its GPU run and the host-side profile of the
same schedule), and the bytes a decode step reads in each mode (the physics line). Plain data and
arithmetic: importing this selects no runtime."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.harness.dims import ERNIE45_21B_A3B, QWEN3_8B, SMOKE_ERNIE_MOE, SMOKE_GQA

MODES = {   # attention keys (ratio, swa_mode) and cache.swa_recycle of each mode
    "uniform_mask": {"head_wise_swa_ratio": 0.5, "swa_mode": "mask", "recycle": False},
    "headwise": {"head_wise_swa_ratio": 0.5, "swa_mode": "skip", "recycle": False},
    "headwise_recycle": {"head_wise_swa_ratio": 0.5, "swa_mode": "skip", "recycle": True},
    "full": {"head_wise_swa_ratio": 0.0, "recycle": False},
}
DEFAULT_MODES = "uniform_mask,headwise,headwise_recycle"


@dataclass(frozen=True)
class SwaPreset:
    """A model the benchmark runs: its config.json, whether weights are dummy (config.json alone) or
    random files written once, and the CPU smoke override of the same structure."""
    name: str
    config: dict
    dummy: bool
    smoke: dict


PRESETS = {
    # The seed's geometry: a MoE with about 3B active parameters, so a decode step's weight reads are
    # small beside 32k-token KV rows and the KV bytes SWA heads skip show in the step time.
    "ernie45_21b": SwaPreset("ERNIE-4.5-21B-A3B", ERNIE45_21B_A3B, True, SMOKE_ERNIE_MOE),
    # A dense 8B: its weights dominate a small batch's step (so skipped KV bytes barely show in the step).
    "qwen3_8b": SwaPreset("Qwen3-8B", dict(QWEN3_8B, num_hidden_layers=4), False, SMOKE_GQA),
}


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step of ``rows`` rows at ``context`` tokens reads (bf16 weights and KV)."""
    weights: float
    kv_uniform: float      # every head reads the whole row (uniform_mask reads, then masks, the SWA heads' rest)
    kv_skipped: float      # what the SWA heads no longer read when they take only sinks + window

    @property
    def skipped_fraction(self) -> float:
        return self.kv_skipped / (self.weights + self.kv_uniform)


# The seed's KV memory: kv_cache_ratio 0.30 on an A800-80GB, "about 24 GB of KV"
# (eb45-21b-a3b-32k-bf16-kv50-512s.yaml). ERNIE-4.5-21B-A3B's bf16 K/V is 56 KiB a token, so that is
# about 12 rows of 32k with uniform tables.
SEED_KV_GB = 24.0


def head_kv_bytes_per_token(cfg: dict, elt: int = 2) -> int:
    """K and V of one token on one KV head, every layer."""
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * d * elt


def blocks_for_kv_bytes(cfg: dict, kv_bytes: float, block_size: int, elt: int = 2) -> int:
    """``cache.num_blocks`` (blocks of ``block_size`` tokens per KV head, every layer, K and V) that
    ``kv_bytes`` of cache hold."""
    return int(kv_bytes // (block_size * cfg["num_key_value_heads"] * head_kv_bytes_per_token(cfg, elt)))


def decode_step_bytes(cfg: dict, rows: int, context: int, window: int, sink: int, ratio: float,
                      elt: int = 2) -> StepBytes:
    """Weights: every dense tensor once, the lm_head (tied or not) once, and per MoE layer the experts
    ``rows`` rows route to (expected distinct experts under uniform routing, E (1 - (1 - k/E)^rows));
    embedding rows read are negligible. KV: K and V of every (row, layer, KV head)."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hq, hk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    attn = h * (hq + 2 * hk) * d + hq * d * h
    experts = cfg.get("moe_num_experts") or 0
    moe_layers = layers - cfg.get("moe_layer_start_index", 0) if experts else 0
    dense_mlp = 3 * h * cfg["intermediate_size"] * (layers - moe_layers)
    per_expert = 3 * h * cfg.get("moe_intermediate_size", 0)
    shared = per_expert * cfg.get("moe_num_shared_experts", 0) + h * experts
    touched = experts * (1 - (1 - cfg.get("moe_k", 0) / experts) ** rows) if experts else 0.0
    weights = (layers * attn + dense_mlp + moe_layers * (shared + touched * per_expert) + vocab * h) * elt
    per_token = head_kv_bytes_per_token(cfg, elt)
    swa_heads = int(round(ratio * hk))
    kv_uniform = rows * context * hk * per_token
    kv_skipped = rows * max(0, context - min(context, window + sink)) * swa_heads * per_token
    return StepBytes(float(weights), float(kv_uniform), float(kv_skipped))
