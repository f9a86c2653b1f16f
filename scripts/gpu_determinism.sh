#!/usr/bin/env bash
# On the GPU machine: the determinism check's table (benchmarks/e2e/determinism.py): bf16, random
# V2-Lite-dims weights, default and deterministic mode side by side, batch 1 / 256 / chunked /
# prefix-cached, and the DP=2 row when 2 GPUs are visible (skipped on one). Extra arguments go to
# the check (e.g. --requests 64 --layers 2, --dims qwen3). Logs land in $OUT (or ./.bench_out).
#   bash scripts/gpu_determinism.sh [check arguments...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # no NVLink multicast
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m benchmarks.e2e.determinism --json "$OUT/determinism.json" "$@" 2>&1 | tee "$OUT/determinism.txt"
