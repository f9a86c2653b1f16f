#!/usr/bin/env bash
# Tensor parallel, data parallel and full size on a machine of 2 or 4 GPUs (nvidia-h200-x2, -x4), the steps
# named in STEPS (default "tp dp test"):
#   full    benchmarks.e2e.fullsize: DeepSeek-V3 dims, FP8, load_format dummy, TP=2, 19 layers
#           (BENCHMARKS.md, "Full size");
#   v2full  benchmarks.e2e.fullsize --arch v2: the whole DeepSeek-V2 (236B, 60 layers) on every visible GPU,
#           TP, then TP + expert parallel; bf16 as published where a rank's share fits, else FP8;
#   tp      benchmarks.e2e.tensor_parallel --gpu-memory-utilization auto --ep at TP_SIZES (default 1,2; 1,2,4 on
#           4 GPUs): both TP targets (step ratio, memory), prefill and a 1k/1k run, and TP with expert parallelism;
#   dp      benchmarks.e2e.data_parallel at DP_SIZES (default 2; 2,4 on 4 GPUs) vs DP=1 at 256 (the MoE workload)
#           and 2048 requests;
#   test    the multi-GPU tests: TP=2 (and TP=4 on 4 GPUs) fp32 == TP=1 (MLA and GQA), TP shutdown (exit within
#           5 s, Ctrl-C, a killed worker), expert parallelism, data parallelism.
# The CUDA custom ops are built first (nvcc, ~55 s on a bare machine). Each step runs under its own
# time limit (T_FULL / T_V2 / T_TP / T_DP / T_TEST seconds; T_V2 for each of v2full's two runs), so one that
# overruns leaves the others' results. Exits 1 when a test step failed.
#   bash scripts/gpu_scale_out.sh     STEPS="test" bash scripts/gpu_scale_out.sh     SMOKE=1 bash scripts/gpu_scale_out.sh (CPU)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/pm_cache}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # no NVLink multicast
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
[ -n "${SMOKE:-}" ] && NGPU=2
if [ "$NGPU" -ge 4 ]; then DEF_TP=1,2,4 DEF_DP=2,4; else DEF_TP=1,2 DEF_DP=2; fi
if [ -n "${SMOKE:-}" ]; then
  V2FULL=(--smoke --layers 3 --batches 1,4 --contexts 128,512 --prefills 2x64 --e2e-shapes 32x32 --iters 2); V2_E2E=${V2_E2E:-4}
  FULL=(--smoke --layers 3 --batches 1,4 --contexts 128,512 --prefills 2x64,1x256 --e2e 4 --e2e-shapes 32x32,64x16 --iters 2)
  TP=(--smoke --layers 3 --batch 4 --context 256 --iters 2)
  DP=(--smoke)
else
  FULL=(--layers 19 --batches 1,16,64 --contexts 1024,8192 --prefills 8x1024,1x8192 --e2e 32 --iters 10)
  TP=(--iters 20 --ep)
  DP=()
  V2FULL=(--batches 1,16,64 --contexts 1024,8192 --prefills 8x1024,1x8192 --iters 10)
fi
read -r -a TP_EXTRA <<< "${TP_ARGS:-}"   # e.g. TP_ARGS="--prefill-requests 0 --e2e 0"
TP+=(--tp "${TP_SIZES:-$DEF_TP}" "${TP_EXTRA[@]}"); DP+=(--dp "${DP_SIZES:-$DEF_DP}")
STEPS="${STEPS:-tp dp test}"
status=0   # the tests' verdict (the benchmarks report, they do not fail the script)
stamp() { echo "=== $(date +%T) $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"; } \
  2>&1 | tee "$OUT/gpu.txt"
if [ -z "${SMOKE:-}" ]; then
  stamp "custom ops build"
  python3 -c "
from paddle_mla.platform import runtime
runtime.select('torch')
from paddle_mla.ops.build import load_ops
print('ops:', load_ops())" 2>&1 | tail -n 2 | tee "$OUT/ops_build.txt"
fi
if has full; then
  stamp "bench_fullsize"
  timeout "${T_FULL:-180}" python3 -m benchmarks.e2e.fullsize "${FULL[@]}" --json "$OUT/fullsize.json" 2>&1 | tee "$OUT/fullsize.md"
fi
if has v2full; then
  stamp "bench_fullsize --arch v2: the whole DeepSeek-V2 on $NGPU GPUs, TP, then TP + EP"
  timeout "${T_V2:-300}" python3 -m benchmarks.e2e.fullsize --arch v2 --tp "$NGPU" "${V2FULL[@]}" --e2e "${V2_E2E:-32}" \
    --json "$OUT/v2full_tp.json" 2>&1 | tee "$OUT/v2full_tp.md"
  timeout "${T_V2:-300}" python3 -m benchmarks.e2e.fullsize --arch v2 --tp "$NGPU" --ep "${V2FULL[@]}" --e2e 0 \
    --json "$OUT/v2full_ep.json" 2>&1 | tee "$OUT/v2full_ep.md"
fi
if has tp; then
  stamp "bench_tp: ${TP[*]} (and EP), gpu_memory_utilization auto"
  timeout "${T_TP:-480}" python3 -m benchmarks.e2e.tensor_parallel "${TP[@]}" --gpu-memory-utilization auto --json "$OUT/tp.json" 2>&1 \
    | tee "$OUT/tp.md"
fi
if has dp; then
  for n in ${DP_REQUESTS:-256 2048}; do
    stamp "bench_dp --requests $n"
    timeout "${T_DP:-120}" python3 -m benchmarks.e2e.data_parallel "${DP[@]}" --requests "$n" --json "$OUT/dp_$n.json" 2>&1 | tee "$OUT/dp_$n.md"
  done
fi
if has test; then
  stamp "tests/parallel/*_gpu.py"
  TESTS=(tests/parallel/test_tensor_parallel_gpu.py tests/parallel/test_tp_shutdown_gpu.py
         tests/parallel/test_expert_parallel_gpu.py tests/parallel/test_data_parallel_gpu.py)
  PYTEST=(python3 -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}")
  if [ "$NGPU" -ge 4 ]; then
    # the 2-GPU cases on GPUs 0,1 beside the 4-GPU cases on all four, at once: the models are tiny
    CUDA_VISIBLE_DEVICES=0,1 TRITON_F32_DEFAULT=ieee timeout "${T_TEST:-420}" "${PYTEST[@]}" -k "not tp4 and not dp4" \
      --basetemp "$OUT/pytest_2gpu" > "$OUT/tp_test_2gpu.txt" 2>&1 &
    two=$!
    TRITON_F32_DEFAULT=ieee timeout "${T_TEST:-420}" "${PYTEST[@]}" -k "tp4 or dp4" --basetemp "$OUT/pytest_4gpu" \
      > "$OUT/tp_test_4gpu.txt" 2>&1 &
    four=$!
    wait "$two" || status=1
    wait "$four" || status=1
    tail -n 30 "$OUT/tp_test_2gpu.txt" "$OUT/tp_test_4gpu.txt"
  else
    TRITON_F32_DEFAULT=ieee timeout "${T_TEST:-420}" "${PYTEST[@]}" 2>&1 | tee "$OUT/tp_test.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
stamp "done"
exit "$status"
