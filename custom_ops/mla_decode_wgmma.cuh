// mla_decode, the SM90 warpgroup kernel (sm_90a: wgmma): one program = 64 query heads over a range of
// 64-token key tiles of the plan (mla_decode_cuda.h), the same plan, partials and combine as the
// mma.sync kernel (mla_decode_kernel.cuh).
//
// Why two warpgroups and who does what: the 64 x 512 fp32 output accumulator is 128 KB, too much for
// one warpgroup's registers, so warpgroup 0 owns value columns 0..255 and warpgroup 1 columns
// 256..511 (128 fp32 registers a thread each). The 576-deep S = Q K^T is computed once, by warpgroup 0
// (36 wgmma m64n64k16, Q and the key tile both read from shared memory), which also runs the online
// softmax and hands P (bf16, in the m64k16 A-fragment order) and each row's rescale factor to
// warpgroup 1 through shared memory and a named barrier. Each warpgroup then rescales its half of O
// and adds P V (4 wgmma m64n256k16, P from registers, V = the first 512 columns of the key tile
// already in shared memory, read MN-major). The tensor cores are one pipe per SM either way; the
// split is about registers, and the second warpgroup's P V overlaps the first's.
//
// Shared memory (1024-byte aligned, 128-byte swizzle, wgmma.cuh): Q (64 x 576 bf16, 72 KB), 2 key
// stages of 64 x 576 (144 KB), P (8 KB), row scalars (1 KB), 3 mbarriers: 225 KB, one program an SM.
// Tile i + 1 streams in while tile i is computed (the first two tiles of a split are issued together
// with Q: both stages are free then; at b=1 it measured neutral), by TMA: one thread issues, per 64-column chunk, a
// box of R = gcd(page, 64) token rows per page run (tensor maps over the cache and Q, built by the
// launcher), completing on the stage's mbarrier. Why TMA: with 16-byte cp.async from every thread a
// 72 KB tile took about 5 µs to land (ncu: 30% tensor-pipe use, 21% of DRAM bandwidth, H200), the
// load path's own limit at one tile in flight an SM. Rows past the row's length (a page's stale or
// poisoned slots, or boxes not issued) are zeroed in shared memory before use, so a masked key never
// multiplies garbage into P V; heads past H come in as zeros (the map's out-of-bounds fill). One
// block barrier a tile.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "append_attention_mma.cuh"
#include "cuda_launch.cuh"
#include "mla_decode_cuda.h"
#include "mla_decode_kernel.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

constexpr int kWgHeads = 64;                  // rows of a program: wgmma's M
constexpr int kWgKeys = 64;                   // keys a tile
constexpr int kWgThreads = 256;               // two warpgroups
constexpr uint32_t kWgChunk = 64 * 128;       // one 64-column chunk of a 64-row tile (128-byte rows)
constexpr uint32_t kWgTile = 9 * kWgChunk;    // a 64 x 576 bf16 tile

// Byte offsets from the 1024-aligned base; `total` includes the slack to align the base.
struct WgLayout {
  static constexpr uint32_t q = 0, kv = kWgTile, p = kv + 2 * kWgTile, rows = p + 8192, bars = rows + 1024;
  static constexpr uint32_t total = bars + 64 + 1024;
};
static_assert(WgLayout::total <= 227 * 1024, "the layout must fit an SM90 block's 227 KB of shared memory");

// A wgmma accumulator (4 N registers) seen as mla_decode_kernel.cuh's [N][4] fragment: the same
// registers in the same order.
template <int N4>
__device__ __forceinline__ float (&frag4(float (&x)[N4]))[N4 / 4][4] {
  return *reinterpret_cast<float(*)[N4 / 4][4]>(&x);
}

// Offset of (row, 16-byte unit) in a swizzled 64-row tile (wgmma.cuh's SW128 layout).
__device__ __forceinline__ uint32_t swz(int row, int unit) {
  return (unit >> 3) * kWgChunk + row * 128 + (((unit & 7) ^ (row & 7)) << 4);
}

// Rows of a TMA box: the largest power of two dividing both the page and a tile, so that a box never
// straddles a page (host and device compute it alike). Pages that are not a multiple of 8 are not
// served (cuda_decode.unavailable_reason): their boxes would start inside a 1024-byte swizzle atom.
__host__ __device__ __forceinline__ int tma_box_rows(int page) { return min(page & -page, kWgKeys); }

__global__ void __launch_bounds__(kWgThreads, 1)
    mla_decode_wgmma_kernel(MlaDecodeArgs a, const __grid_constant__ CUtensorMap kv_map,
                            const __grid_constant__ CUtensorMap q_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = __nv_bfloat16;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = attn::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const int tid = static_cast<int>(threadIdx.x), wgi = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int hg = static_cast<int>(blockIdx.x), pid = static_cast<int>(blockIdx.y);
  const int bs = static_cast<int>(a.batch);
  const uint32_t full0 = base + WgLayout::bars, qbar = full0 + 16;  // stage s's barrier: full0 + 8 s
  if (tid == 0) {  // before the wait: nothing here reads what earlier kernels write
    wg::mbar_init(full0, 1);
    wg::mbar_init(full0 + 8, 1);
    wg::mbar_init(qbar, 1);
    wg::mbar_init_fence();
    wg::prefetch_tensor_map(&kv_map);
    wg::prefetch_tensor_map(&q_map);
  }
  grid_dependency_wait();  // q, the plan and the lengths come from the kernels before (PDL)
  launch_dependents();     // the combine may take the SMs this grid leaves free and wait there
  const PlanWindows windows = plan_windows(a.tiles_per_prog, a.cu_tiles, bs);
  if (!windows.has(pid)) return;
  const int page = static_cast<int>(a.page_size);
  const int box_rows = tma_box_rows(page);
  const float qk_scale = a.softmax_scale * kLog2e;
  uint4* pfrag = reinterpret_cast<uint4*>(smem + WgLayout::p) + warp * 32 + lane;  // + k-step * 128
  float2* rowv = reinterpret_cast<float2*>(smem + WgLayout::rows) + warp * 32 + lane;
  // descriptors of Q and stage 0 at k-step 0 (K-major), and of stage 0's value columns (MN-major)
  const uint64_t dq = wg::desc_sw128(base + WgLayout::q, 16, 1024);
  const uint64_t dk = wg::desc_sw128(base + WgLayout::kv, 16, 1024);
  const uint64_t dv = wg::desc_sw128(base + WgLayout::kv + wgi * 4 * kWgChunk, kWgChunk, 1024);
  const bool producer = tid == 128;  // warpgroup 1 is idle while warpgroup 0 computes S
  __syncthreads();
  uint32_t phase = 0;  // bit s: parity of stage s's next completion; bit 2: Q's

  for_each_request(a, windows, bs, pid, kWgKeys, [&](int w, int b, int t0, int t1) {
    const int seq_len = a.seq_lens[b];
    const int32_t* bt = a.block_tables + b * a.bt_stride;
    auto issue = [&](int t, int st) {  // producer: key tile t of this request into stage st
      const int tok0 = t * kWgKeys, boxes = (min(kWgKeys, seq_len - tok0) + box_rows - 1) / box_rows;
      const uint32_t bar = full0 + 8 * st, dst = base + WgLayout::kv + st * kWgTile;
      wg::mbar_expect_tx(bar, static_cast<uint32_t>(boxes * box_rows * 128 * 9));
      for (int x = 0; x < boxes; ++x) {  // boxes holding a key of the row; the table is read for them only
        const int tok = tok0 + x * box_rows, blk = bt[tok / page];
#pragma unroll
        for (int c = 0; c < 9; ++c)
          wg::tma_load_3d(dst + c * kWgChunk + x * box_rows * 128, &kv_map, c * 64, tok % page, blk, bar);
      }
    };
    const int nt = t1 - t0;
    if (producer) {
      wg::mbar_expect_tx(qbar, 9 * kWgHeads * 128);
#pragma unroll
      for (int c = 0; c < 9; ++c) wg::tma_load_3d(base + WgLayout::q + c * kWgChunk, &q_map, c * 64, hg * kWgHeads, b, qbar);
      issue(t0, 0);
      if (nt > 1) issue(t0 + 1, 1);  // both stages are free: two tiles in flight from the start
    }
    __syncwarp();  // the producer's warp converges before the barrier waits and wgmma below
    wg::mbar_wait(qbar, (phase >> 2) & 1);
    phase ^= 4;

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // warpgroup 0: rows lane / 4 (+ 8), log2 units

    for (int i = 0; i < nt; ++i) {
      // tile i landed (its rows past the length zeroed, visible to wgmma); every thread is done with
      // tile i - 1, whose stage takes tile i + 1 now, and warpgroup 1 is done with the previous P
      const int st = i % 2, key0 = (t0 + i) * kWgKeys;
      wg::mbar_wait(full0 + 8 * st, (phase >> st) & 1);
      phase ^= 1u << st;
      const uint32_t stage = st * kWgTile;
      if (key0 + kWgKeys > seq_len) {
        const int nv = seq_len - key0;
        for (int c = tid; c < kWgKeys * 9 * 8; c += kWgThreads) {
          const int n = c / 72, u = c - n * 72;
          if (n >= nv) *reinterpret_cast<uint4*>(smem + WgLayout::kv + stage + swz(n, u)) = make_uint4(0, 0, 0, 0);
        }
        wg::fence_proxy_async();
      }
      __syncthreads();
      if (producer && i >= 1 && i + 1 < nt) issue(t0 + i + 1, (i + 1) % 2);  // into tile i - 1's stage
      __syncwarp();
      uint32_t pa[4][4];
      float keep[2];
      if (wgi == 0) {
        float s[32];
#pragma unroll
        for (int x = 0; x < 32; ++x) s[x] = 0.0f;
        wg::fence_regs(s);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < kKeyDim / 16; ++ks) {
          const uint32_t off = (ks / 4) * kWgChunk + (ks % 4) * 32;
          wg::wgmma_m64n64k16_ss(s, wg::desc_add(dq, off), wg::desc_add(dk, stage + off), ks > 0);
        }
        wg::commit();
        wg::wait<0>();
        wg::fence_regs(s);
        float(&sf)[8][4] = frag4(s);
        mask_past_length(sf, key0, seq_len, lane);
        online_softmax(sf, m, l, keep, qk_scale);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // keys 16 kk .. 16 kk + 15 as the m64k16 A fragment
#pragma unroll
          for (int r = 0; r < 4; ++r) pa[kk][r] = attn::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
          pfrag[kk * 128] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
        }
        *rowv = make_float2(keep[0], keep[1]);
        row_block_arrive(1, kWgThreads);
      } else {
        row_block_barrier(1, kWgThreads);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint4 v = pfrag[kk * 128];
          pa[kk][0] = v.x;
          pa[kk][1] = v.y;
          pa[kk][2] = v.z;
          pa[kk][3] = v.w;
        }
        const float2 kf = *rowv;
        keep[0] = kf.x;
        keep[1] = kf.y;
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= keep[0];
        o[4 * j + 1] *= keep[0];
        o[4 * j + 2] *= keep[1];
        o[4 * j + 3] *= keep[1];
      }
      wg::fence_regs(o);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg::wgmma_m64n256k16_rs_mn(o, pa[kk], wg::desc_add(dv, stage + kk * 2048));
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(o);
    }
    __syncthreads();  // Q, the stages and the row scalars are free
    if (wgi == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      }
      *rowv = make_float2(l[0], l[1]);
    }
    __syncthreads();
    const float2 sums = *rowv;
    const float sum[2] = {sums.x, sums.y};
    const int64_t prow = split_row(a, windows, w, b);
    store_rows(a, frag4(o), b, prow, hg * kWgHeads + warp * 16 + lane / 4, wgi * 256 + (lane % 4) * 2, sum, m,
               wgi == 0, lane);
  });
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a (no wgmma / TMA): fail loudly instead of leaving out unwritten
#endif
}

}  // namespace mla
}  // namespace paddle_mla
