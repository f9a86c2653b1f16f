#!/usr/bin/env bash
# The MLA kernel targets in one GPU call (H100, about 7 min): MLA kernel tests (bf16 decode incl. determinism and
# graph replay; fp32 with TRITON_F32_DEFAULT=ieee), the decode workspace at 128 seqs x 128 heads,
# the decode target points (benchmarks.kernels.mla_decode --preset targets, SGLang from third_party/), the
# prefill kernel vs SDPA flash and SGLang's extend kernel, and ncu of today's stage-1 config and the
# variants at b=128 (s=4k at h=128 and h=16; s=16k at h=16 if time is left). Logs under $OUT.
#   bash scripts/gpu_mla_kernels.sh        (needs third_party/sglang_decode and third_party/sglang_extend)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/.bench_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PADDLE_MLA_RUNTIME=torch PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PADDLE_MLA_CACHE="${PADDLE_MLA_CACHE:-/tmp/paddle_mla_cache}"
# the spill-free / fewer-spill h=128 variants and the h=16 pipeline/warp variants (docs/triton_decode_notes.md)
V128="dv_split=2;block_h=32,dv_split=2;dv_split=4,block_n=32,num_stages=3"
V16="num_stages=5;num_warps=8;dv_split=2"
NX=""; python3 -c "import xdist" 2>/dev/null && NX="-n 6"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
T0=$(date +%s); el() { echo "# [$(( $(date +%s) - T0 )) s] $*"; }

el "phase 1: tests (bf16 GPU file; fp32 kernel files with ieee dots) + workspace + compile warm-ups, in parallel (no timing)"
( timeout 170 python3 -m pytest -q -p no:cacheprovider $NX tests/kernels/test_triton_kernels_gpu.py > "$OUT/tests_bf16.txt" 2>&1
  echo "bf16 GPU tests rc=$?" >> "$OUT/tests_bf16.txt" ) &
( TRITON_F32_DEFAULT=ieee timeout 170 python3 -m pytest -q -p no:cacheprovider -n 3 tests/kernels/test_triton_kernels.py \
    tests/kernels/test_triton_mixed_batch.py > "$OUT/tests_fp32.txt" 2>&1
  echo "fp32 tests rc=$?" >> "$OUT/tests_fp32.txt" ) &
( timeout 100 python3 - <<'PY' 2>&1
from paddle_mla.platform import runtime
runtime.select("torch")
import torch
from paddle_mla.attention.backend import MLADims
from paddle_mla.attention.triton_mla.backend import TritonMLABackend
# DeepSeek-V3 attention dims, 128 sequences (the workspace target's point)
dims = MLADims(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
               softmax_scale=192 ** -0.5)
be = TritonMLABackend(dims, 128, 4096, 64, "cuda", torch.bfloat16, max_num_batched_tokens=8192)
print(f"split workspace {be.ws.nbytes} B = {be.ws.nbytes / 1e6:.1f} MB = {be.ws.nbytes / 2**20:.1f} MiB, "
      f"partial_out {tuple(be.ws.partial_out.shape)}, max_kv_splits {be.ws.max_kv_splits}")
PY
  # SGLang's decode kernel compiles once per split count: warm the cache for h=16 and h=128
  timeout 100 python3 - <<'PY' 2>&1 | tail -n 2
from benchmarks.kernels.mla_decode import run_sglang
from benchmarks.harness import anchors
from benchmarks.harness.mla_cases import make_decode_case
fwd, src = anchors.load(anchors.SGLANG_DECODE)
for h in (16, 128):
    print("sglang warm-up h", h, run_sglang(fwd, make_decode_case(2, h, 4096), h)[:2] if fwd else src)
PY
  echo "workspace + sglang warm-up done" ) > "$OUT/workspace.txt" 2>&1 &
( timeout 100 python3 -m benchmarks.profile.decode_ncu --b 128 --h 128 --s 4096 --cfg "$V128" >/dev/null 2>&1
  timeout 60 python3 -m benchmarks.profile.decode_ncu --b 128 --h 16 --s 4096 --cfg "$V16" >/dev/null 2>&1
  timeout 60 python3 -m benchmarks.profile.decode_ncu --b 1 --h 16 --s 4096 \
    --cfg "small_batch=1;small_batch=1,min_tiles=2" >/dev/null 2>&1
  timeout 60 python3 -m benchmarks.profile.decode_ncu --b 1 --h 128 --s 4096 >/dev/null 2>&1
  echo "ncu/bench compile warm-up done" ) &
wait
cat "$OUT/workspace.txt"; tail -n 12 "$OUT/tests_bf16.txt"; tail -n 12 "$OUT/tests_fp32.txt"

el "phase 2a: the decode target points (today's config, old split caps at b=1/4, SGLang)"
timeout 150 python3 -m benchmarks.kernels.mla_decode --preset targets --json "$OUT/targets.json" > "$OUT/targets.md" 2>&1
echo "targets rc=$?"; grep -v '^{' "$OUT/targets.md"
el "phase 2b: prefill vs SDPA flash and SGLang (default, and the natural block order)"
timeout 75 python3 -m benchmarks.kernels.mla_prefill --variants "reverse_m=0" --no-prefix --json "$OUT/prefill.json" \
  > "$OUT/prefill.md" 2>&1; echo "prefill rc=$?"; cat "$OUT/prefill.md" | cut -c1-400

el "phase 3: ncu, b=128, today's config then each variant"
NCU="ncu --clock-control none --kernel-name regex:_decode_stage1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
timeout 60 $NCU --launch-skip 4 --launch-count 4 python3 -m benchmarks.profile.decode_ncu --b 128 --h 128 --s 4096 \
  --cfg "$V128" > "$OUT/ncu_h128.txt" 2>&1; echo "ncu h128 rc=$?"
timeout 45 $NCU --launch-skip 4 --launch-count 4 python3 -m benchmarks.profile.decode_ncu --b 128 --h 16 --s 4096 \
  --cfg "$V16" > "$OUT/ncu_h16.txt" 2>&1; echo "ncu h16 rc=$?"
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  timeout 40 $NCU --launch-skip 2 --launch-count 2 python3 -m benchmarks.profile.decode_ncu --b 128 --h 16 --s 16384 \
    --cfg "num_stages=5" > "$OUT/ncu_h16_16k.txt" 2>&1; echo "ncu h16 16k rc=$?"
fi
grep -iE "config [0-9]|_decode_stage1|Duration|DRAM Throughput|^ +Memory Throughput|Compute \(SM\) Throughput|Registers Per|Theoretical Occupancy|Achieved Occupancy|Block Limit|Dynamic Shared|Spill|Gbyte/s|==ERROR|==WARNING" \
  "$OUT"/ncu_h*.txt | cut -c1-150
el "done"
