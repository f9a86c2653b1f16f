#!/usr/bin/env bash
# The SM90 MLA CUDA ops in one GPU call (after pip install -e .): the mla_decode and mla_sparse kernel
# tests, the sparse MLA beside Triton's (benchmarks.kernels.dsa_sparse_mla), the decode
# target points beside ours-Triton, SGLang's Triton kernel and FlashInfer's MLA decode
# (benchmarks.kernels.mla_decode --preset cuda; SGLang from third_party/sglang_decode,
# scripts/fetch_sglang_kernel.sh; FlashInfer from third_party/flashinfer, scripts/fetch_flashinfer.sh), then the engine tests
# that run triton_mla decode steps (graphs, prefix cache, chunked prefill, preemption) on the CUDA path.
# Logs under $OUT. Usage: bash scripts/gpu_mla_cuda.sh [engine test files...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - <<'PY' 2>&1 | tail -n 3   # the ops pip install -e . built (same cache folder)
from paddle_mla.platform import runtime
runtime.select("torch")
from paddle_mla.ops import mla_decode
print("mla_decode op:", mla_decode.available() or "available")
PY
grep -l "error" "${PADDLE_MLA_CACHE:-$HOME/.cache/paddle_mla/ops}"/*/build.log 2>/dev/null | head -1 | xargs -r grep -m 20 -B2 "error"
T0=$(date +%s); el() { echo "# [$(( $(date +%s) - T0 )) s] $*"; }
el "kernel tests"
timeout "${KERNEL_LIMIT:-150}" python3 -m pytest -q --tb=line -p no:cacheprovider tests/kernels/test_mla_decode_cuda_gpu.py \
  tests/kernels/test_mla_sparse_cuda_gpu.py > "$OUT/tests_cuda_kernel.txt" 2>&1
rc=$?; tail -n 30 "$OUT/tests_cuda_kernel.txt"; echo "kernel tests rc=$rc"
el "bench"
timeout "${BENCH_LIMIT:-150}" python3 -m benchmarks.kernels.mla_decode --preset cuda --json "$OUT/bench_cuda.json" ${BENCH_ARGS:-} \
  > "$OUT/bench_cuda.md" 2>&1; echo "bench rc=$?"; grep -v '^{' "$OUT/bench_cuda.md" | head -40
el "sparse bench"
timeout "${BENCH_LIMIT:-150}" python3 -m benchmarks.kernels.dsa_sparse_mla --json "$OUT/bench_sparse.json" \
  > "$OUT/bench_sparse.md" 2>&1; echo "sparse bench rc=$?"; tail -n 8 "$OUT/bench_sparse.md"
if [ $# -gt 0 ] && [ $rc -eq 0 ]; then   # the engine runs only a kernel that passed its tests
  el "engine tests: $*"
  timeout "${ENGINE_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > "$OUT/tests_engine.txt" 2>&1
  echo "engine tests rc=$?"; tail -n 15 "$OUT/tests_engine.txt"
fi
el "done"
