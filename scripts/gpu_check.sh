#!/usr/bin/env bash
# On the GPU machine (PyTorch runtime): build the CUDA custom ops, run every GPU test, then the
# quick benchmarks. Results land in $OUT (the device tool brings them back) or ./.bench_out.
#   bash scripts/gpu_check.sh [--quick]     (--quick: fewer FP8 shapes; LOADER_LAYERS=27 for the full 31 GB load)
set -uo pipefail
QUICK=""; [ "${1:-}" = "--quick" ] && QUICK="--quick"
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/paddle_mla_cache}"
export NCCL_NVLS_ENABLE=0    # no NVLink multicast (the GPU machines' rule); tensor-parallel ranks inherit it
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -n 2
echo "=== custom ops (CUDA build)"
python3 - <<'PY' 2>&1 | tee "$OUT/ops_build.txt" || status=1
import time
from paddle_mla.platform import runtime
runtime.select("torch")
from paddle_mla.ops.build import load_ops
t = time.time(); ops = load_ops(); print("ops:", ops, f"({time.time() - t:.1f} s)")
assert ops is not None, "custom ops did not build"
PY
echo "=== GPU tests"
# The GQA files compare against the single-threaded C++ op (most of their time): side by side in shards.
GQA_GPU_TESTS="tests/kernels/test_append_attention_gpu.py tests/kernels/test_append_attention_prefill_gpu.py tests/models/test_gqa_oracle.py tests/attention/test_append_attn_backend.py"
python3 -m pytest -q -p no:cacheprovider -m gpu tests $(printf -- '--ignore=%s ' $GQA_GPU_TESTS) 2>&1 | tee "$OUT/gpu_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 scripts/pytest_shards.py -n 14 --timeout 300 --log "$OUT/gqa_gpu_tests_full.txt" -- -m gpu $GQA_GPU_TESTS 2>&1 \
  | tee "$OUT/gqa_gpu_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== the fused norm/rope/latent/routing kernels and the batch-invariant ones against their plain forms, on the GPU"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_kernels.py tests/kernels/test_route_kernel.py \
  tests/kernels/test_batch_invariant.py 2>&1 | tee "$OUT/fused_kernel_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== decode kernel benchmark"
python3 -m benchmarks.kernels.mla_decode --json "$OUT/bench_mla_decode.json" 2>&1 | tee "$OUT/bench_mla_decode.md" || status=1
echo "=== decode kernel variants (dv_split / block_h vs today's config vs SGLang)"
python3 -m benchmarks.kernels.mla_decode --preset variants --json "$OUT/bench_mla_decode_variants.json" 2>&1 \
  | tee "$OUT/bench_mla_decode_variants.md" || status=1
echo "=== MLA extend (prefill) attention vs SDPA flash and SGLang's extend kernel (needs third_party/sglang_extend)"
python3 -m benchmarks.kernels.mla_prefill --json "$OUT/bench_mla_prefill.json" 2>&1 | tee "$OUT/bench_mla_prefill.md" || status=1
echo "=== metadata build time, batch 64"
python3 -m benchmarks.kernels.metadata --batch 64 --device gpu 2>&1 | tee "$OUT/bench_metadata_gpu.md" || status=1
echo "=== end-to-end decode benchmark"
python3 -m benchmarks.e2e.decode --layers 4 --batch 1,16,64 --context 4096 --json "$OUT/bench_e2e.json" 2>&1 \
  | tee "$OUT/bench_e2e.md" || status=1
echo "=== split mixed batches: kernel/backend/engine tests on the GPU, then mixed step vs decode-only + 1.2 x chunk-only"
TRITON_F32_DEFAULT=ieee python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_mixed_batch.py 2>&1 \
  | tee "$OUT/mixed_batch_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 -m benchmarks.e2e.mixed_step --json "$OUT/bench_mixed_step.json" 2>&1 | tee "$OUT/bench_mixed_step.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== whole engine step: decode at 4k, batch 1 and 64, host time at batch 256; overlap on and off"
python3 -m benchmarks.e2e.engine_step --layers 4 --batch 1,64 --context 4096 --host-batch 256 \
  --json "$OUT/bench_engine_step.json" 2>&1 | tee "$OUT/bench_engine_step.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== fused MoE vs SGLang (quick: M 16 and 4096, V2-Lite and V3, bf16 and fp8; needs third_party/sglang_fused_moe)"
python3 -m benchmarks.kernels.fused_moe --quick --json "$OUT/bench_fused_moe_quick.json" 2>&1 | tee "$OUT/bench_fused_moe_quick.md" \
  || status=1
echo "=== FP8 block-scaled linear vs bf16"
python3 -m benchmarks.kernels.fp8_linear $QUICK --json "$OUT/bench_fp8_linear.json" 2>&1 | tee "$OUT/bench_fp8_linear.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== streaming loader: V2-Lite dims, ${LOADER_LAYERS:-4} layers"
python3 -m benchmarks.e2e.loader --layers "${LOADER_LAYERS:-4}" --json "$OUT/bench_loader.json" 2>&1 \
  | tee "$OUT/bench_loader.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== end-to-end MoE (V2-Lite dims, 4 layers): LLM throughput vs HF eager, decode and prefill vs roofline"
python3 -m benchmarks.e2e.moe $QUICK --json "$OUT/bench_e2e_moe.json" 2>&1 | tee "$OUT/bench_e2e_moe.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== DSA (deepseek_v32): fp32 dsa vs native and kernels with ieee fp32 dots"
TRITON_F32_DEFAULT=ieee python3 -m pytest -q -p no:cacheprovider tests/attention/test_dsa_equivalence.py tests/kernels/test_dsa_kernels.py \
  tests/kernels/test_dsa_key_window.py 2>&1 | tee "$OUT/dsa_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== DSA benchmarks (quick: context 8k; full: python3 -m benchmarks.kernels.dsa --e2e)"
python3 -m benchmarks.kernels.dsa --quick --e2e --json "$OUT/bench_dsa.json" 2>&1 | tee "$OUT/bench_dsa.md" || status=1
echo "=== sparse MLA: the SM90 CUDA op beside the Triton kernel (decode b=1 and 64, 2048 prefill rows)"
python3 -m benchmarks.kernels.dsa_sparse_mla --batches 1,64 --prefill-rows 2048 --json "$OUT/bench_dsa_sparse_mla.json" 2>&1 \
  | tee "$OUT/bench_dsa_sparse_mla.md" || status=1
echo "=== chunked prefill on a shared-prefix 8k workload (paddle-mla bench): ITL p99/p50, throughput on/off"
python3 -m benchmarks.e2e.chunked_itl --json "$OUT/bench_chunked_itl.json" 2>&1 | tail -n 12 | tee "$OUT/bench_chunked_itl.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== GQA append_attention: decode vs copy bandwidth and SGLang (third_party/sglang_decode), prefill vs SDPA flash"
python3 -m benchmarks.kernels.gqa_attention --json "$OUT/bench_gqa_attention.json" 2>&1 | tee "$OUT/bench_gqa_attention.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "=== GQA end to end: Qwen3-8B dims, 4 layers, append_attn, decode step at batch 64 and 4k context vs roofline"
python3 -m benchmarks.e2e.decode --model qwen3 --layers 4 --batch 64 --context 4096 --json "$OUT/bench_e2e_qwen3.json" 2>&1 \
  | tee "$OUT/bench_e2e_qwen3.md" || status=1
if command -v compute-sanitizer >/dev/null; then
  echo "=== GQA append_attention under compute-sanitizer memcheck (small cases)"
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_append_attention_gpu.py tests/kernels/test_append_attention_prefill_gpu.py -k "reference or padding or splits or g2d64" \
    2>&1 | tail -n 30 | tee "$OUT/gqa_memcheck.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
NGPU="$(nvidia-smi -L 2>/dev/null | wc -l)"
if [ "$NGPU" -ge 2 ]; then
  echo "=== tensor parallel: TP=2 vs TP=1 decode step (V2-Lite dims, ${TP_LAYERS:-27} layers, batch 64, 4k context); memory: under the budget picked from this card (auto) TP=1 does not fit, TP=2 runs"
  python3 -m benchmarks.e2e.tensor_parallel --layers "${TP_LAYERS:-27}" --gpu-memory-utilization auto --json "$OUT/bench_tp.json" 2>&1 | tee "$OUT/bench_tp.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "=== tensor parallel: skipped (needs 2 GPUs, this machine has $NGPU; its GPU test skips too)"
fi
if [ "$NGPU" -ge 2 ]; then
  echo "=== data parallel: DP=2 vs DP=1 on the end-to-end MoE workload (V2-Lite dims, 4 layers, 256 x 512 in / 128 out)"
  python3 -m benchmarks.e2e.data_parallel --json "$OUT/bench_dp.json" 2>&1 | tee "$OUT/bench_dp.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "=== data parallel benchmark skipped: it needs 2 GPUs, this machine has $NGPU" | tee "$OUT/bench_dp.md"
fi
echo "=== head-wise SWA (ERNIE-4.5-21B-A3B dims, the seed's 24 GB of KV, 32k context, ratio 0.5): uniform mask vs head-wise, recycling off/on, one run"
python3 -m benchmarks.e2e.head_wise_swa --quick --json "$OUT/bench_swa.json" 2>&1 | tee "$OUT/bench_swa.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "gpu_check status: $status"
exit $status
