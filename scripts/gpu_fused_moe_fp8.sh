#!/usr/bin/env bash
# The fused MoE and FP8 targets in one GPU call (H100, ~8 min): the fused-MoE and FP8 GPU tests, the end-to-end V2-Lite-dims
# workload (LLM vs HF eager, decode b64 4k and prefill 64x512 vs their rooflines, probed breakdown),
# the kernel sequence of ours vs SGLang's fused MoE at V3 fp8 large M, the FP8 linear at decode sizes,
# then the fused MoE vs SGLang at every M, both shapes, bf16 and fp8 (its rows print as they finish,
# so it goes last). Needs third_party/sglang_fused_moe (scripts/fetch_sglang_fused_moe.sh, run where
# there is a network). Logs under $OUT. Each phase has a time cap; BUDGET (s) bounds the whole.
#   bash scripts/gpu_fused_moe_fp8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1        # 8 files come back at most: log + 7 below
export PYTHONPATH="$PWD" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/paddle_mla_cache}"
NX=""; python3 -c "import xdist" 2>/dev/null && NX="-n 6"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"
T0=$(date +%s); END=$((T0 + ${BUDGET:-500}))
el() { echo "# [$(( $(date +%s) - T0 )) s] $*"; }
cap() {   # min(cap $1, time left - reserve $2), at least 5 s
  local left=$((END - $(date +%s) - ${2:-0})); [ "$left" -lt 5 ] && left=5; [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
CKPT=/tmp/bench_e2e_moe_4L

el "phase 1: GPU tests (fused MoE, FP8) || custom-op build || the e2e checkpoint written (CPU)"
( timeout 130 python3 -m pytest -q -p no:cacheprovider $NX -m gpu tests/kernels/test_fused_moe_gpu.py tests/kernels/test_fp8_gpu.py \
    tests/kernels/test_moe_fp8.py > "$OUT/gpu_tests.txt" 2>&1; echo "GPU tests rc=$?" >> "$OUT/gpu_tests.txt" ) &
P1=$!
( timeout 130 python3 -c "
from paddle_mla.platform import runtime; runtime.select('torch')
from paddle_mla.ops.build import load_ops; print('ops:', load_ops())" 2>&1 | tail -n 2
  timeout 130 python3 -c "
from benchmarks.harness.checkpoints import moe_checkpoint
moe_checkpoint(4, folder='$CKPT'); print('checkpoint written')" ) &
P2=$!
wait "$P1" "$P2"     # by pid: a bare wait (bash >= 5.1) also waits for the tee above, which never ends
tail -n 12 "$OUT/gpu_tests.txt"

el "phase 2: end-to-end (LLM x3 incl. probed, decode b64 4k, prefill 64x512, HF eager)"
timeout "$(cap 200 100)" python3 -m benchmarks.e2e.moe --dir "$CKPT" --json "$OUT/e2e.json" > "$OUT/e2e.md" 2>&1
echo "e2e rc=$?"; grep -v 'Loading weights' "$OUT/e2e.md" | tail -n 30

el "phase 3: kernel sequences, ours vs SGLang, V3 fp8 M=4096/16384"
timeout "$(cap 60 90)" python3 -m benchmarks.profile.kernels --cases moe-large --iters 5 --json /tmp/moe_large.json \
  > "$OUT/moe_large.md" 2>&1; echo "moe-large rc=$?"; tail -n 12 "$OUT/moe_large.md" | cut -c1-1500

el "phase 4: FP8 linear vs bf16 at decode sizes"
timeout "$(cap 50 70)" python3 -m benchmarks.kernels.fp8_linear --m 1,16,32,64 --json /tmp/fp8_linear.json \
  > "$OUT/fp8_linear.md" 2>&1; echo "fp8 linear rc=$?"; tail -n 12 "$OUT/fp8_linear.md"

el "phase 5: fused MoE vs SGLang, every M, both shapes, bf16 + fp8"
timeout "$(cap 400 0)" python3 -m benchmarks.kernels.fused_moe --json "$OUT/fused_moe.json" > "$OUT/fused_moe.md" 2>&1
echo "fused moe rc=$?"; grep -v 'Using default' "$OUT/fused_moe.md" | tail -n 32
el "done"
