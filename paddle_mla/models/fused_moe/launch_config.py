"""Launch configs of the fused MoE GEMMs: tuned JSON data in configs/, else a heuristic.

A file ``configs/E=<E>,N=<N>,K=<K>,dtype=<bf16|fp16|fp32|fp8_w8a8>,device=<GPU name>.json`` maps
token counts M (as strings) to {BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages} and, for
fp8_w8a8 only, an optional QUANT_GROUP (64 or 128, default 128: the width of the per-token groups in
which the gate+up GEMM quantizes its output, which is also that GEMM's BLOCK_N); the entry with the
nearest M is used (as vLLM's configs are). N is the intermediate size (per expert,
gate or up alone), K the hidden size. Written by benchmarks.kernels.tune_fused_moe.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

CONFIG_DIR = Path(__file__).with_name("configs")
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
OPTIONAL_KEYS = ("QUANT_GROUP",)


def config_file_name(E: int, N: int, K: int, dtype: str, device_name: str) -> str:
    return f"E={E},N={N},K={K},dtype={dtype},device={device_name.replace(' ', '_')}.json"


@functools.cache
def load_configs(E: int, N: int, K: int, dtype: str, device_name: str) -> dict[int, dict] | None:
    path = CONFIG_DIR / config_file_name(E, N, K, dtype, device_name)
    if not path.is_file():
        return None
    table = json.loads(path.read_text())
    return {int(m): {k: int(v[k]) for k in KEYS + OPTIONAL_KEYS if k in v} for m, v in table.items()}


def default_config(M: int, E: int, top_k: int, dtype: str) -> dict:
    """Heuristic: tiny tiles when each expert sees a few rows (decode: weight-bandwidth bound),
    bigger tiles as rows per expert grow (compute bound)."""
    rows_per_expert = M * top_k / E
    if dtype == "fp8_w8a8":
        if rows_per_expert <= 16:
            return dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)
        if rows_per_expert <= 128:
            return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3)
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)
    if rows_per_expert <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    if rows_per_expert <= 128:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


# ``deterministic: true``: a row's sums must follow no other row. bf16 / fp16: the config may still
# follow M where its tile runs on wgmma (BLOCK_M >= 64, whole warpgroups): the tile then places each
# output's K-ordered chain of k16 steps without changing it (as the dense GEMM's tiles,
# ops/batch_invariant_kernels.py; tests/kernels/test_determinism_gpu.py checks across the switch);
# smaller BLOCK_M (decode) would lower to another MMA instruction, so those M take the mid-size row
# below. fp8: that one row for every M (its BLOCK_K, 128, is the scale blocks').
BATCH_INVARIANT_CONFIGS = {
    "fp8_w8a8": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3),
    "any": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3),
}


def batch_invariant_config(dtype: str) -> dict:
    return dict(BATCH_INVARIANT_CONFIGS.get(dtype, BATCH_INVARIANT_CONFIGS["any"]))


def get_config(M: int, E: int, N: int, K: int, top_k: int, dtype: str, device_name: str,
               batch_invariant: bool = False) -> dict:
    table = load_configs(E, N, K, dtype, device_name)
    cfg = dict(table[min(table, key=lambda m: abs(m - M))]) if table else default_config(M, E, top_k, dtype)
    if batch_invariant and (dtype == "fp8_w8a8" or cfg["BLOCK_M"] < 64 or cfg["num_warps"] % 4):
        return batch_invariant_config(dtype)
    return cfg
