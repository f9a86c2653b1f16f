#!/usr/bin/env bash
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
export PYTHONPATH=$PWD PADDLE_MLA_RUNTIME=torch PADDLE_MLA_CACHE=/tmp/paddle_mla_cache PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -n 2
python3 -c "
from paddle_mla.platform import runtime
runtime.select('torch')
from paddle_mla.ops.build import load_ops
print('ops:', load_ops() is not None)" 2>&1 | tail -n 2
echo "=== $(date +%T) bench"
timeout 300 python3 -m benchmarks.e2e.tensor_parallel --tp 2 --rows --iters 5 --prefill-requests 16 --e2e 0 --engine-steps 0 --profile --profile-steps 3 --profile-prefill 2 --profile-traces $OUT/tr > $OUT/tp.md 2> $OUT/tp.err
rm -rf $OUT/tr
grep -v "^|.*\` *|$" $OUT/tp.md | head -n 80 | cut -c1-220; awk '/Top 15 kernels, rank 0/{c++} c>=1' $OUT/tp.md | grep "^|" | cut -c1-200 | head -70; tail -n 3 $OUT/tp.err
echo "=== $(date +%T) done"
