// The paged decode's key sources (mla_wgmma_attend.cuh's interface) through a request's block table:
// PagedKeys here reads bf16 rows; Fp8PagedKeys (mla_decode_fp8.cuh) extends it for FP8 rows.
//
// Tiles come by TMA: one thread issues, per 64-column chunk, a box of R = gcd(page, 64) token rows per
// page run (tensor maps over the cache and Q, built by the launcher), completing on the stage's
// mbarrier. Why TMA: with 16-byte cp.async from every thread a 72 KB tile took about 5 µs to land
// (ncu: 30% tensor-pipe use, 21% of DRAM bandwidth, H200), the load path's own limit at one tile in
// flight an SM. Rows past the row's length (a page's stale or poisoned slots, or boxes not issued)
// are zeroed in shared memory before use, so a masked key never multiplies garbage into P V; heads
// past H come in as zeros (the map's out-of-bounds fill).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_launch.cuh"
#include "mla_decode_kernel.cuh"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

// A paged decode program's place in the grid and the plan: head group hg (blockIdx.x), program pid
// (blockIdx.y) of the plan's windows over the step's bs rows.
struct PagedPlace {
  int hg, pid, bs;
  PlanWindows windows;
  __device__ __forceinline__ bool idle() const { return !windows.has(pid); }
};

// The SM90 paged kernels' start after their setup: the wait for the kernels before (PDL: q, the plan
// and the lengths), the combine let in (it may take the SMs this grid leaves free and wait there),
// and the program's place. Nothing before it may read what earlier kernels write.
__device__ __forceinline__ PagedPlace paged_place_after_wait(const MlaDecodeArgs& a) {
  grid_dependency_wait();
  launch_dependents();
  const int bs = static_cast<int>(a.batch);
  const PlanWindows windows = plan_windows(a.tiles_per_prog, a.cu_tiles, bs);
  return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), bs, windows};
}

// Rows of a TMA box: the largest power of two dividing both the page and a tile, so that a box never
// straddles a page (host and device compute it alike). Pages that are not a multiple of 8 are not
// served (cuda_decode.unavailable_reason): their boxes would start inside a 1024-byte swizzle atom.
__host__ __device__ __forceinline__ int tma_box_rows(int page) { return min(page & -page, kWgKeys); }

// A request's key tiles [t0, t0 + nt) of bf16 rows through its block table, by TMA from thread 128.
struct PagedKeys {
  const CUtensorMap* kv_map;
  const CUtensorMap* q_map;
  const int32_t* bt;  // the request's block table row
  int t0, seq_len, page, box_rows, hg, b;

  // Request b's tiles from t0 on, for head group hg (page: a.page_size).
  __device__ __forceinline__ static PagedKeys of(const MlaDecodeArgs& a, const CUtensorMap* kv_map,
                                                 const CUtensorMap* q_map, int page, int hg, int b, int t0) {
    const int32_t* bt = a.block_tables + b * a.bt_stride;
    return {kv_map, q_map, bt, t0, a.seq_lens[b], page, tma_box_rows(page), hg, b};
  }

  __device__ __forceinline__ bool producer(int tid) const { return tid == 128; }
  __device__ __forceinline__ void issue_q(uint32_t dst, uint32_t bar) const { load_packed_q(q_map, hg, b, dst, bar); }
  __device__ __forceinline__ void issue(int i, int, uint32_t dst, uint32_t bar) const {
    const int tok0 = (t0 + i) * kWgKeys, boxes = (min(kWgKeys, seq_len - tok0) + box_rows - 1) / box_rows;
    wg::mbar_expect_tx(bar, static_cast<uint32_t>(boxes * box_rows * 128 * kWgChunks));
    for (int x = 0; x < boxes; ++x) {  // boxes holding a key of the row; the table is read for them only
      const int tok = tok0 + x * box_rows, blk = bt[tok / page];
#pragma unroll
      for (int c = 0; c < kWgChunks; ++c)
        wg::tma_load_3d(dst + c * kWgChunk + x * box_rows * 128, kv_map, c * 64, tok % page, blk, bar);
    }
  }
  // rows past the length: zeros, made visible to wgmma (the barrier after it publishes them); by the
  // first `threads` threads of the block
  __device__ __forceinline__ void landed(int i, uint8_t* tile, int threads = kWgThreads) const {
    const int key0 = (t0 + i) * kWgKeys;
    if (key0 + kWgKeys <= seq_len) return;
    const int nv = seq_len - key0;
    for (int c = static_cast<int>(threadIdx.x); c < kWgKeys * kWgChunks * 8; c += threads) {
      const int n = c / (kWgChunks * 8), u = c - n * (kWgChunks * 8);  // row, 16-byte unit
      if (n >= nv) *reinterpret_cast<uint4*>(tile + swz(n, u)) = make_uint4(0, 0, 0, 0);
    }
    wg::fence_proxy_async();
  }
  __device__ __forceinline__ void mask(float (&s)[8][4], int i, int lane) const {
    mask_past_length(s, (t0 + i) * kWgKeys, seq_len, lane);
  }
};

}  // namespace mla
}  // namespace paddle_mla
