#!/usr/bin/env bash
# On the GPU machine: install, build the CUDA custom ops, then run the GPU tests of the given files
# (default: every GPU test file but the tensor-/data-parallel ones) as SHARDS pytest processes side
# by side under one time limit (LIMIT seconds), then the memory-profile test alone (it reads the
# GPU's free memory, which the shards beside it would change), and, by default, the Triton kernels'
# tests against their plain forms (marked triton, not gpu: on CPU they run under the interpreter,
# here on the GPU, bf16 included; the fused MoE's align among them). Logs land in $OUT (or ./.bench_out).
#   SHARDS=4 LIMIT=500 bash scripts/gpu_tests.sh [test files...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/paddle_mla_cache}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # no NVLink multicast
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -n 2
python3 - <<'PY' 2>&1 | tee "$OUT/ops_build.txt" || exit 1
import time
from paddle_mla.platform import runtime
runtime.select("torch")
from paddle_mla.ops.build import load_ops
t = time.time(); ops = load_ops(); print("ops:", ops, f"({time.time() - t:.1f} s)")
assert ops is not None, "custom ops did not build"
PY
ALONE=tests/engine/test_memory_profile_gpu.py
files=("$@")
alone=()
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(grep -rlE "mark\.gpu|pytestmark.*gpu" tests --include='test_*.py' | grep -v '^tests/parallel/' \
    | grep -vx "$ALONE" | sort)
  alone=("$ALONE")
fi
python3 scripts/pytest_shards.py -n "${SHARDS:-4}" --timeout "${LIMIT:-500}" --log "$OUT/gpu_tests_full.txt" \
  -- -m gpu "${files[@]}" 2>&1 | tee "$OUT/gpu_tests.txt"
status=${PIPESTATUS[0]}
if [ ${#alone[@]} -gt 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu "${alone[@]}" 2>&1 | tee -a "$OUT/gpu_tests.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_kernels.py tests/kernels/test_route_kernel.py \
    tests/kernels/test_batch_invariant.py tests/kernels/test_fused_moe.py 2>&1 | tee -a "$OUT/gpu_tests.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit "$status"
