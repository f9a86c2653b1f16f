// mla_sparse, the SM90 warpgroup kernel (sm_90a: wgmma): one program = 64 query heads of one row over
// one chunk of its selected slots (mla_sparse_cuda.h), as 64-key tiles through mla_wgmma_attend.cuh,
// the paged decode's program. Only the key source differs.
//
// A tile's 64 keys are 64 scattered cache rows of 1152 bytes, so they come by 16-byte cp.async
// rather than TMA: a one-row box per key and 64-column chunk (576 TMA requests a tile) measured 0.71x
// of this on an H200. Warpgroup 1, idle while warpgroup 0 computes S, issues them (SlotKeys::issue).
// Each producer thread then arrives on the stage's mbarrier when its copies land
// (cp.async.mbarrier.arrive.noinc; the barrier takes 128 arrivals), and every thread fences the
// generic-proxy writes before wgmma reads them. Invalid slots (< 0) and keys past the chunk are
// zero-filled by the copy itself, so they never multiply garbage into P V, and their bits in the
// stage's key mask are clear: their scores are -inf.
//
// Q comes by TMA from q_lat (chunks 0..7) and q_pe (chunk 8): no packed copy of the query is made.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_launch.cuh"
#include "mla_decode_kernel.cuh"
#include "mla_sparse_cuda.h"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

// Row t's selected slots [0, nkeys) of one chunk, gathered by warpgroup 1 (mla_wgmma_attend.cuh's key
// source).
struct SlotKeys {
  const CUtensorMap* ql_map;
  const CUtensorMap* qp_map;
  const __nv_bfloat16* kv;
  int64_t kv_stride;
  const int64_t* slots;  // the chunk's first slot
  uint16_t* masks;       // the stages' key masks: 4 16-bit words a stage, one a producer warp
  int nkeys, hg, t;

  __device__ __forceinline__ bool producer(int tid) const { return tid >= 128; }
  __device__ __forceinline__ void issue_q(uint32_t dst, uint32_t bar) const {
    wg::mbar_expect_tx(bar, kWgChunks * kWgHeads * 128);
#pragma unroll
    for (int c = 0; c < 8; ++c) wg::tma_load_3d(dst + c * kWgChunk, ql_map, c * 64, hg * kWgHeads, t, bar);
    wg::tma_load_3d(dst + 8 * kWgChunk, qp_map, 0, hg * kWgHeads, t, bar);
  }
  // This warp's 16 rows of tile i: lane l copies units l, l + 32 and (l < 8) l + 64 of each, so a warp's
  // copy reads 512 contiguous bytes of one row. Those units share l's chunk-in-64 (l / 8, + 4 a step)
  // and its swizzle input l % 8, and a row's is its index mod 8 (the warp's rows start at a multiple of
  // 8), so the only per-row work is the row's address: the gather costs about 12 instructions a row
  // and warp (a per-copy address computation made the warpgroup's issue the tile's critical path).
  __device__ __forceinline__ void issue(int i, int st, uint32_t dst, uint32_t bar) const {
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) / 32) % 4;
    const int key = i * kWgKeys + warp * 16 + lane % 16;
    const int64_t mine = lane < 16 && key < nkeys ? slots[key] : -1;
    const unsigned ok = __ballot_sync(0xffffffffu, mine >= 0) & 0xffffu;
    if (lane == 0) masks[st * 4 + warp] = static_cast<uint16_t>(ok);
    const uint32_t lane_dst = dst + warp * 16 * 128 + (lane / 8) * kWgChunk;
    const int lo = lane % 8;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int64_t slot = __shfl_sync(0xffffffffu, mine, r);
      const bool valid = slot >= 0;
      const __nv_bfloat16* src = kv + (valid ? slot : 0) * kv_stride + lane * 8;
      const uint32_t to = lane_dst + r * 128 + ((lo ^ (r % 8)) << 4);
      cp_async16(to, src, valid);
      cp_async16(to + 4 * kWgChunk, src + 256, valid);
      if (lane < 8) cp_async16(to + 8 * kWgChunk, src + 512, valid);
    }
    wg::mbar_arrive_cp_async(bar);
  }
  __device__ __forceinline__ void landed(int, uint8_t*) const { wg::fence_proxy_async(); }
  __device__ __forceinline__ void mask(float (&s)[8][4], int i, int lane) const {
    const uint64_t bits = *reinterpret_cast<const uint64_t*>(masks + (i % 2) * 4);
    if (bits == ~0ull) return;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!((bits >> (nb * 8 + (lane % 4) * 2 + (e & 1))) & 1)) s[nb][e] = -INFINITY;
    }
  }
};

// Grid: (head groups x rows, splits); program (hg, t, sp) attends row t's heads 64 hg.. over the
// slots [sp * split_len, (sp + 1) * split_len) of its top-k.
__global__ void __launch_bounds__(kWgThreads, 1)
    mla_sparse_wgmma_kernel(MlaSparseArgs a, const __grid_constant__ CUtensorMap ql_map,
                            const __grid_constant__ CUtensorMap qp_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  WgProgram p = wg_program(smem_raw, 128);  // one arrival a producer thread
  if (p.tid == 0) {  // before the wait: nothing here reads what earlier kernels write
    wg::prefetch_tensor_map(&ql_map);
    wg::prefetch_tensor_map(&qp_map);
  }
  grid_dependency_wait();  // q and the slots come from the kernels before (PDL)
  launch_dependents();
  const int groups = static_cast<int>((a.num_heads + kWgHeads - 1) / kWgHeads);
  const int hg = static_cast<int>(blockIdx.x) % groups, t = static_cast<int>(blockIdx.x) / groups;
  const int sp = static_cast<int>(blockIdx.y);
  const int64_t start = sp * a.split_len, nkeys = min(a.split_len, a.topk - start);
  __syncthreads();  // the barriers' initialisation
  const SlotKeys keys{&ql_map, &qp_map, static_cast<const __nv_bfloat16*>(a.kv_cache), a.kv_stride_slot,
                      a.slots + t * a.slots_stride + start,
                      reinterpret_cast<uint16_t*>(p.smem + WgLayout::masks), static_cast<int>(nkeys), hg, t};
  float o[128], m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  if (nkeys > 0) {
    wg_attend(p, keys, static_cast<int>((nkeys + kWgKeys - 1) / kWgKeys), a.softmax_scale * kLog2e, o, m, sum);
  } else {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  }
  const RowSink sink =
      a.num_splits == 1
          ? RowSink{static_cast<__nv_bfloat16*>(a.out) + t * a.out_stride_t, a.out_stride_h, nullptr, 0, nullptr, 0}
          : RowSink{nullptr, 0, a.part_o + (t * a.num_heads * a.num_splits + sp) * kMlaLatentDim,
                    a.num_splits * kMlaLatentDim, a.part_lse + t * a.num_heads * a.num_splits + sp, a.num_splits};
  store_rows(sink, static_cast<int>(a.num_heads), frag4(o), hg * kWgHeads + p.warp * 16 + p.lane / 4,
             p.wgi * 256 + (p.lane % 4) * 2, sum, m, p.wgi == 0, p.lane);
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a (no wgmma / TMA): fail loudly instead of leaving out unwritten
#endif
}

}  // namespace mla
}  // namespace paddle_mla
