// The SM90 warpgroup MLA program (sm_90a: wgmma), shared by the paged decode (mla_decode_wgmma.cuh)
// and the sparse kernel over selected cache slots (mla_sparse_wgmma.cuh): 64 query heads against a
// run of 64-key tiles, with the online softmax and the output in registers.
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
// stages of 64 x 576 (144 KB), P (8 KB), row scalars (1 KB), 3 mbarriers and the sparse kernel's key
// masks: 225 KB, one program an SM. Tile i + 1 streams in while tile i is computed (the first two
// tiles of a run are issued together with Q: both stages are free then). One block barrier a tile
// (and the FP8 key source's own, inside its in-place conversion).
//
// A key source (`Keys`) says how Q and the tiles arrive and which keys count:
//   producer(tid)           whether thread tid takes part in issuing tile loads;
//   issue_q(dst, bar)       thread 128 loads Q's 9 chunks into dst, completing on bar;
//   issue(i, st, dst, bar)  a producer's share of tile i of the run into stage st at dst;
//   landed(i, tile)         every thread, once tile i's barrier completed: make the tile ready for
//                           wgmma (rows that must read as zeros, an FP8 tile's conversion, the proxy fence);
//   mask(s, i, lane)        warpgroup 0's scores of tile i: -inf at the keys that do not count.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "append_attention_mma.cuh"
#include "mla_decode_kernel.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

constexpr int kWgHeads = 64;                  // rows of a program: wgmma's M
constexpr int kWgKeys = 64;                   // keys a tile
constexpr int kWgThreads = 256;               // two warpgroups
constexpr uint32_t kWgChunk = 64 * 128;       // one 64-column chunk of a 64-row tile (128-byte rows)
constexpr int kWgChunks = kKeyDim / 64;       // 64-column chunks of a 576-wide row (9)
constexpr uint32_t kWgTile = kWgChunks * kWgChunk;  // a 64 x 576 bf16 tile

// Byte offsets from the 1024-aligned base; `total` includes the slack to align the base. bars: the
// two stages' barriers, Q's, then (at `masks`) one 64-bit key mask a stage.
struct WgLayout {
  static constexpr uint32_t q = 0, kv = kWgTile, p = kv + 2 * kWgTile, rows = p + 8192, bars = rows + 1024;
  static constexpr uint32_t masks = bars + 32;
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

// Q packed [rows, H, 576] (the paged decode's query): head group hg (kHeads heads: the map's box) of row
// b into dst by TMA, 9 boxes of kHeads heads x 64 columns, a chunk of kHeads 128-byte rows each,
// completing on bar (heads past H arrive as zeros, the map's out-of-bounds fill).
template <int kHeads = kWgHeads>
__device__ __forceinline__ void load_packed_q(const CUtensorMap* q_map, int hg, int b, uint32_t dst, uint32_t bar) {
  constexpr uint32_t chunk = kHeads * 128;
  wg::mbar_expect_tx(bar, kWgChunks * chunk);
#pragma unroll
  for (int c = 0; c < kWgChunks; ++c) wg::tma_load_3d(dst + c * chunk, q_map, c * 64, hg * kHeads, b, bar);
}

// A program's shared memory, its threads' roles and the pipeline's barrier parities across its runs.
struct WgProgram {
  uint32_t base;  // 1024-aligned shared address
  uint8_t* smem;  // the same, generic
  int tid, wgi, warp, lane;
  uint32_t phase;  // bit s: parity of stage s's next completion; bit 2: Q's
  __device__ __forceinline__ uint32_t full(int st) const { return base + WgLayout::bars + 8 * st; }
  __device__ __forceinline__ uint32_t qbar() const { return base + WgLayout::bars + 16; }
  __device__ __forceinline__ uint32_t stage(int st) const { return base + WgLayout::kv + st * kWgTile; }
};

// The program's setup: each stage barrier completes after `stage_arrivals` arrivals (with the bytes
// announced), Q's after one. Reads nothing that earlier kernels write (it may run before the PDL
// wait); the caller's block barrier publishes the initialisation.
__device__ __forceinline__ WgProgram wg_program(uint8_t* smem_raw, int stage_arrivals) {
  WgProgram p{};
  const uint32_t raw = attn::smem_u32(smem_raw);
  p.base = (raw + 1023) & ~1023u;
  p.smem = smem_raw + (p.base - raw);
  p.tid = static_cast<int>(threadIdx.x);
  p.wgi = p.tid / 128;
  p.warp = (p.tid / 32) % 4;
  p.lane = p.tid % 32;
  if (p.tid == 0) {
    wg::mbar_init(p.full(0), stage_arrivals);
    wg::mbar_init(p.full(1), stage_arrivals);
    wg::mbar_init(p.qbar(), 1);
    wg::mbar_init_fence();
  }
  return p;
}

// Waits for bar's completion with parity bit `bit` of the thread's phase, and flips the bit.
__device__ __forceinline__ void wg_wait(WgProgram& p, uint32_t bar, int bit) {
  wg::mbar_wait(bar, (p.phase >> bit) & 1);
  p.phase ^= 1u << bit;
}

// Warpgroup 0's S += Q K^T over k-steps ks of the tile at byte offset `stage` from stage 0 (16 columns
// a step; a step's 64 x 16 slices of Q and K sit at the same offset in their 64-column chunks).
__device__ __forceinline__ void wg_scores_step(float (&s)[32], uint64_t dq, uint64_t dk, uint32_t stage, int ks) {
  const uint32_t off = (ks / 4) * kWgChunk + (ks % 4) * 32;
  wg::wgmma_m64n64k16_ss(s, wg::desc_add(dq, off), wg::desc_add(dk, stage + off), ks > 0);
}

// P (warpgroup 0's softmaxed scores) as bf16 m64k16 A fragments, keys 16 kk .. 16 kk + 15 in pa[kk].
__device__ __forceinline__ void wg_pack_p(const float (&s)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = attn::pack2<__nv_bfloat16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// P and the rows' rescale factors handed from warpgroup 0 (`put`) to warpgroup 1 (`take`) through
// shared memory, each lane's fragments at the same place for both; the rows' sums go the same way at
// the end of a run (wg_finish_sums).
struct WgHandoff {
  uint4* pfrag;  // + k-step * 128
  float2* rowv;
  __device__ __forceinline__ explicit WgHandoff(const WgProgram& p)
      : pfrag(reinterpret_cast<uint4*>(p.smem + WgLayout::p) + p.warp * 32 + p.lane),
        rowv(reinterpret_cast<float2*>(p.smem + WgLayout::rows) + p.warp * 32 + p.lane) {}
  __device__ __forceinline__ void put(const uint32_t (&pa)[4][4], const float (&keep)[2]) const {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) pfrag[kk * 128] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
    *rowv = make_float2(keep[0], keep[1]);
  }
  __device__ __forceinline__ void take(uint32_t (&pa)[4][4], float (&keep)[2]) const {
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
};

// o = o * keep (per row) + P V over this warpgroup's 256 value columns of the tile at `stage`, waited.
// The rescale (128 multiplies a thread) is skipped by a warp whose 16 rows all keep their max (the
// lazy online softmax makes that the common case): a multiply by 1 changes no bit.
__device__ __forceinline__ void wg_rescale_pv(float (&o)[128], const uint32_t (&pa)[4][4], const float (&keep)[2],
                                              uint64_t dv, uint32_t stage) {
  if (__any_sync(0xffffffffu, keep[0] != 1.0f || keep[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= keep[0];
      o[4 * j + 1] *= keep[0];
      o[4 * j + 2] *= keep[1];
      o[4 * j + 3] *= keep[1];
    }
  }
  wg::fence_regs(o);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::wgmma_m64n256k16_rs_mn(o, pa[kk], wg::desc_add(dv, stage + kk * 2048));
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(o);
}

// The end of a run (every thread, after both warpgroups' last P V): the rows' softmax sums from
// warpgroup 0's lanes into every warpgroup, through the row scalars.
__device__ __forceinline__ void wg_finish_sums(const WgProgram& p, const WgHandoff& handoff, float (&l)[2],
                                               float (&sum)[2]) {
  __syncthreads();  // Q, the stages and the row scalars are free
  if (p.wgi == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    *handoff.rowv = make_float2(l[0], l[1]);
  }
  __syncthreads();
  const float2 sums = *handoff.rowv;
  sum[0] = sums.x;
  sum[1] = sums.y;
}

// benchmarks/profile/wgmma_rates.cu (attend_cut) copies this loop to price its parts: change both.
// One run of nt >= 1 key tiles against the Q that `keys` loads: o (this warpgroup's 256 value
// columns, not yet divided by the sums), m (warpgroup 0's rows' reference maxima, log2 units: up to
// kLazyMaxLog2 below the true ones, online_softmax's kLazy) and sum (the rows' softmax denominators
// relative to m, in every warpgroup). Every thread of the block calls it.
template <class Keys>
__device__ __forceinline__ void wg_attend(WgProgram& p, const Keys& keys, int nt, float qk_scale, float (&o)[128],
                                          float (&m)[2], float (&sum)[2]) {
  const WgHandoff handoff(p);
  // descriptors of Q and stage 0 at k-step 0 (K-major), and of stage 0's value columns (MN-major)
  const uint64_t dq = wg::desc_sw128(p.base + WgLayout::q, 16, 1024);
  const uint64_t dk = wg::desc_sw128(p.base + WgLayout::kv, 16, 1024);
  const uint64_t dv = wg::desc_sw128(p.base + WgLayout::kv + p.wgi * 4 * kWgChunk, kWgChunk, 1024);
  const bool producer = keys.producer(p.tid);  // warpgroup 1 is idle while warpgroup 0 computes S
  if (p.tid == 128) keys.issue_q(p.base + WgLayout::q, p.qbar());
  if (producer) {
    keys.issue(0, 0, p.stage(0), p.full(0));
    if (nt > 1) keys.issue(1, 1, p.stage(1), p.full(1));  // both stages are free: two tiles in flight
  }
  __syncwarp();  // the producers' warps converge before the barrier waits and wgmma below
  wg_wait(p, p.qbar(), 2);

#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float l[2] = {0.0f, 0.0f};  // warpgroup 0: rows lane / 4 (+ 8); this lane's partial sums
  m[0] = m[1] = -INFINITY;

  for (int i = 0; i < nt; ++i) {
    // tile i landed (made ready for wgmma); every thread is done with tile i - 1, whose stage takes
    // tile i + 1 now, and warpgroup 1 is done with the previous P
    const int st = i % 2;
    wg_wait(p, p.full(st), st);
    const uint32_t stage = st * kWgTile;
    keys.landed(i, p.smem + WgLayout::kv + stage);
    __syncthreads();
    if (producer && i >= 1 && i + 1 < nt) keys.issue(i + 1, (i + 1) % 2, p.stage((i + 1) % 2), p.full((i + 1) % 2));
    __syncwarp();
    uint32_t pa[4][4];
    float keep[2];
    if (p.wgi == 0) {
      float s[32];
      wg::start_chain(s);
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) wg_scores_step(s, dq, dk, stage, ks);
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(s);
      float(&sf)[8][4] = frag4(s);
      keys.mask(sf, i, p.lane);
      online_softmax<8, true>(sf, m, l, keep, qk_scale);
      wg_pack_p(s, pa);
      handoff.put(pa, keep);
      row_block_arrive(1, kWgThreads);
    } else {
      row_block_barrier(1, kWgThreads);
      handoff.take(pa, keep);
    }
    wg_rescale_pv(o, pa, keep, dv, stage);
  }
  wg_finish_sums(p, handoff, l, sum);
}

}  // namespace mla
}  // namespace paddle_mla
