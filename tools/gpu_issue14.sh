#!/usr/bin/env bash
# Issue 14 in one GPU call (H100): MLA kernel tests (bf16 decode incl. determinism and graph replay;
# fp32 with TRITON_F32_DEFAULT=ieee), the decode workspace's start-up log at 128 seqs x 128 heads, the
# issue's target points (bench_mla_decode --preset targets, SGLang from third_party/), and ncu of
# today's stage-1 config and each variant at b=128, s=4k, h=128 and h=16. Logs under $OUT.
#   bash tools/gpu_issue14.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/paddle_mla_cache}"
V128="dv_split=2;dv_split=4;block_h=32;block_h=32,dv_split=2;dv_split=4,block_n=32,num_stages=3;block_h=32,block_n=32,num_stages=3"
V16="dv_split=2;dv_split=4,waves=3;num_warps=8;num_stages=5"
NX=""; python3 -c "import xdist" 2>/dev/null && NX="-n 6"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
T0=$(date +%s); el() { echo "# [$(( $(date +%s) - T0 )) s] $*"; }

el "phase 1: tests (bf16 GPU file; fp32 kernel files with ieee dots) + start-up log + ncu compile warm-up, in parallel"
( timeout 200 python3 -m pytest -q -p no:cacheprovider $NX tests/test_triton_kernels_gpu.py > "$OUT/tests_bf16.txt" 2>&1
  echo "bf16 GPU tests rc=$?" >> "$OUT/tests_bf16.txt" ) &
( TRITON_F32_DEFAULT=ieee timeout 200 python3 -m pytest -q -p no:cacheprovider -n 3 tests/test_triton_kernels.py \
    tests/test_triton_mixed_batch.py > "$OUT/tests_fp32.txt" 2>&1
  echo "fp32 tests rc=$?" >> "$OUT/tests_fp32.txt" ) &
( timeout 120 python3 - <<'PY' 2>&1
from paddle_mla import runtime
runtime.select("torch")
import torch
from paddle_mla.attention.backend import MLADims
from paddle_mla.attention.triton_mla.backend import TritonMLABackend
# DeepSeek-V3 attention dims, 128 sequences (the issue's workspace point)
dims = MLADims(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
               softmax_scale=192 ** -0.5)
be = TritonMLABackend(dims, 128, 4096, 64, "cuda", torch.bfloat16, max_num_batched_tokens=8192)
print(f"split workspace {be.ws.nbytes} B = {be.ws.nbytes / 1e6:.1f} MB, partial_out {tuple(be.ws.partial_out.shape)}, "
      f"max_kv_splits {be.ws.max_kv_splits}")
PY
  timeout 100 python3 tools/profile_decode_ncu.py --b 128 --h 128 --s 4096 --cfg "$V128" >/dev/null 2>&1
  timeout 60 python3 tools/profile_decode_ncu.py --b 128 --h 16 --s 4096 --cfg "$V16" >/dev/null 2>&1
  echo "ncu warm-up done" ) &
wait
tail -n 15 "$OUT/tests_bf16.txt"; tail -n 15 "$OUT/tests_fp32.txt"

el "phase 2: the issue's target points (today's config, old split caps at b=1/4, SGLang)"
timeout 150 python3 tools/bench_mla_decode.py --preset targets --json "$OUT/targets.json" 2>&1 | tee "$OUT/targets.md"

el "phase 3: ncu, b=128 s=4k, today's config then each variant"
NCU="ncu --kernel-name regex:_decode_stage1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
timeout 110 $NCU --launch-skip 7 --launch-count 7 python3 tools/profile_decode_ncu.py --b 128 --h 128 --s 4096 \
  --cfg "$V128" > "$OUT/ncu_h128.txt" 2>&1; echo "ncu h128 rc=$?"
timeout 70 $NCU --launch-skip 5 --launch-count 5 python3 tools/profile_decode_ncu.py --b 128 --h 16 --s 4096 \
  --cfg "$V16" > "$OUT/ncu_h16.txt" 2>&1; echo "ncu h16 rc=$?"
grep -iE "config [0-9]|_decode_stage1|Duration|DRAM Throughput|^ +Memory Throughput|Compute \(SM\) Throughput|Registers Per|Theoretical Occupancy|Achieved Occupancy|Block Limit|Dynamic Shared|Spill|Gbyte/s" "$OUT/ncu_h128.txt" "$OUT/ncu_h16.txt" | cut -c1-150
el "done"
