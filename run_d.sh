export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH
export PYTHONPATH=$PWD PADDLE_MLA_RUNTIME=torch PADDLE_MLA_CACHE=/tmp/paddle_mla_cache PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
python3 -c "
from paddle_mla.platform import runtime; runtime.select('torch')
from paddle_mla.ops.build import load_ops; print(load_ops() is not None)"
timeout 150 python3 -m benchmarks.kernels.mla_decode --h 64,128 --b 64,128 --s 4096,16384 --no-sglang 2>&1 | grep -A8 "^CUDA op"
M=lts__t_sectors_op_read.sum,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum.per_second
for h in 128 64; do
timeout 100 ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:mla_decode_wgmma --metrics $M python3 -m benchmarks.profile.decode_ncu --b 64 --h $h --s 4096 --cuda bf16 --flashinfer 2>&1 | grep -E "mla_decode_wgmma|Batch|lts__|dram__|gpu__time|sm__pipe|xbar|==PROF==" | head -30
done
