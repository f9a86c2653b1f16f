// mla_decode, the SM90 warpgroup kernel (sm_90a: wgmma): one program = 64 query heads over a range of
// 64-token key tiles of the plan (mla_decode_cuda.h), the same plan, partials and combine as the
// mma.sync kernel (mla_decode_kernel.cuh). The warpgroups' work on a run of tiles is
// mla_wgmma_attend.cuh's; how a request's tiles arrive is the key sources' (mla_paged_keys.cuh for
// bf16 rows, mla_decode_fp8.cuh for FP8 rows).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "append_attention_mma.cuh"
#include "cuda_launch.cuh"
#include "mla_decode_cuda.h"
#include "mla_decode_fp8.cuh"
#include "mla_decode_kernel.cuh"
#include "mla_paged_keys.cuh"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

// kFp8: the cache holds FP8 rows (mla_decode_fp8.cuh; scale_map: their scale units), else bf16 rows
// (scale_map unused).
template <bool kFp8>
__global__ void __launch_bounds__(kWgThreads, 1)
    mla_decode_wgmma_kernel(MlaDecodeArgs a, const __grid_constant__ CUtensorMap kv_map,
                            const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap scale_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  WgProgram p = wg_program(smem_raw, 1);
  if (p.tid == 0) {  // before the wait: nothing here reads what earlier kernels write
    wg::prefetch_tensor_map(&kv_map);
    wg::prefetch_tensor_map(&q_map);
    if (kFp8) wg::prefetch_tensor_map(&scale_map);
  }
  const PagedPlace at = paged_place_after_wait(a);
  if (at.idle()) return;
  const int hg = at.hg, pid = at.pid, bs = at.bs;
  const PlanWindows windows = at.windows;
  const int page = static_cast<int>(a.page_size);
  const float qk_scale = a.softmax_scale * kLog2e;
  __syncthreads();  // the barriers' initialisation

  for_each_request(a, windows, bs, pid, kWgKeys, [&](int w, int b, int t0, int t1) {
    float o[128], m[2], sum[2];
    const PagedKeys keys = PagedKeys::of(a, &kv_map, &q_map, page, hg, b, t0);
    if constexpr (kFp8) {
      wg_attend(p, Fp8PagedKeys{keys, &scale_map}, t1 - t0, qk_scale, o, m, sum);
    } else {
      wg_attend(p, keys, t1 - t0, qk_scale, o, m, sum);
    }
    store_rows(decode_sink(a, b, split_row(a, windows, w, b)), static_cast<int>(a.num_heads), frag4(o),
               hg * kWgHeads + p.warp * 16 + p.lane / 4, p.wgi * 256 + (p.lane % 4) * 2, sum, m, p.wgi == 0, p.lane);
  });
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a (no wgmma / TMA): fail loudly instead of leaving out unwritten
#endif
}

}  // namespace mla
}  // namespace paddle_mla
