// mla_decode's narrow kernel (sm_90a: wgmma, TMA): programs of up to 16 heads, the transposed product.
//
// Why: at 16 heads (V3 at TP=8) the 64-head program (mla_wgmma_attend.cuh) pads Q to wgmma's M of 64
// and does four times the tensor work a key tile needs. Here the keys are M, so the tensor work is the
// real one:
// - S^T = K Q^T: 64 keys x 16 heads, 36 wgmma m64n16k16 (K and Q from shared memory, K-major);
// - O^T += V^T P^T: 512 value columns x 16 heads as 8 blocks of 64 columns x 4 k-steps of 16 keys,
//   the key tile's first 512 columns read MN-major as A, P^T from shared memory as B.
// The accumulator is 64 registers a thread. What it buys, measured on an H200 (BENCHMARKS.md): a
// tile's compute alone is 1.5 us against the 64-head program's 1.8, which shortens a small batch's
// splits (b=1: 5-6% less time); from b=64 both kernels wait on the tile loads (about 2.45 us a 72 KB
// tile an SM with two stages) and run within 1-2% of each other.
//
// The softmax runs down the accumulator's columns: a head's 64 scores are spread over the 4 warps, so
// a tile's per-head maximum is reduced over lanes by shuffles and over warps through shared memory
// in warp order (every thread gets the same bits). l stays the thread's partial sum over its keys
// and is reduced the same way at the end. The running max is online_softmax's lazy rule (a row's
// bits follow its own scores alone, as in the 64-head kernel).
//
// Shared memory: two key stages (the tiles and TMA loads of PagedKeys), Q (9 chunks of 16 rows by TMA,
// heads past H arrive as zeros), P^T (16 x 64 bf16: one 128-byte swizzled chunk), the warps' maxima
// for two tiles and the final sums, 6 mbarriers: 166 KB, one program an SM.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "append_attention_mma.cuh"
#include "cuda_launch.cuh"
#include "mla_decode_cuda.h"
#include "mla_decode_kernel.cuh"
#include "mla_paged_keys.cuh"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

constexpr int kNarrowHeads = 16;                        // heads a program: the MMAs' N
constexpr int kNarrowThreads = 128;                     // one warpgroup
constexpr uint32_t kNarrowQChunk = kNarrowHeads * 128;  // one 64-column chunk of Q: 16 rows of 128 bytes

// Byte offsets from the 1024-aligned base (the stages, Q's chunks and P^T on 1024-byte swizzle atoms);
// red: [3][4 warps][16 heads] floats (two tiles' maxima, by the stage's parity; the final sums).
struct NarrowLayout {
  static constexpr uint32_t kv = 0, q = 2 * kWgTile, p = q + kWgChunks * kNarrowQChunk;
  static constexpr uint32_t red = p + kNarrowHeads * 128, bars = red + 3 * 4 * kNarrowHeads * 4;
  static constexpr uint32_t total = bars + 48 + 1024;
};
static_assert(NarrowLayout::p % 1024 == 0 && NarrowLayout::total <= 227 * 1024, "the narrow layout");

// Accumulator slots of an m64n16 fragment (wgmma.cuh): register 4 j + 2 h + c is row lane / 4 + 8 h of
// the warp's 16, column 8 j + 2 (lane % 4) + c. A thread's 4 columns (heads) are slots hc = 2 j + c.
__device__ __forceinline__ int narrow_head(int hc, int lane) { return 8 * (hc >> 1) + 2 * (lane % 4) + (hc & 1); }
__host__ __device__ constexpr int narrow_reg(int h, int hc) { return 4 * (hc >> 1) + 2 * h + (hc & 1); }

__device__ __forceinline__ void narrow_sync() { row_block_barrier(1, kNarrowThreads); }

// x[hc] reduced by `op` over the warpgroup's 64 rows for each of the thread's 4 heads: over the 8 row
// lanes by an xor butterfly (every lane gets the same bits), then over the 4 warps in warp order
// through red ([4][16] floats). Every thread ends with the result; one warpgroup barrier.
template <class Op>
__device__ __forceinline__ void narrow_reduce(float (&x)[4], float* red, int warp, int lane, Op op) {
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
#pragma unroll
    for (int d = 4; d < 32; d *= 2) x[hc] = op(x[hc], __shfl_xor_sync(0xffffffffu, x[hc], d));
    if (lane < 4) red[warp * kNarrowHeads + narrow_head(hc, lane)] = x[hc];
  }
  narrow_sync();
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
    const int head = narrow_head(hc, lane);
    float r = red[head];
#pragma unroll
    for (int w = 1; w < 4; ++w) r = op(r, red[w * kNarrowHeads + head]);
    x[hc] = r;
  }
}

// One tile's softmax over the scores s (keys past the length already -inf): the heads' maxima move
// by the lazy rule, s becomes P, l (the thread's partial sums) and keep (o's rescale) follow.
__device__ __forceinline__ void narrow_softmax(float (&s)[8], float (&m)[4], float (&l)[4], float (&keep)[4],
                                               float* red, int warp, int lane, float qk_scale) {
  float mx[4];
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) mx[hc] = fmaxf(s[narrow_reg(0, hc)], s[narrow_reg(1, hc)]);
  narrow_reduce(mx, red, warp, lane, [](float x, float y) { return fmaxf(x, y); });
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
    const float m_tile = mx[hc] * qk_scale;
    const float m_new = m_tile > m[hc] + kLazyMaxLog2 ? m_tile : m[hc];  // online_softmax's kLazy rule
    const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
    keep[hc] = attn::fast_exp2(m[hc] - m_sub);
    m[hc] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& x = s[narrow_reg(h, hc)];
      x = attn::fast_exp2(fmaf(x, qk_scale, -m_sub));
      sum += x;
    }
    l[hc] = l[hc] * keep[hc] + sum;
  }
}

// P^T (bf16) into the swizzled chunk at p: (head, key) at row head, 16-byte unit key / 8.
__device__ __forceinline__ void narrow_put_p(uint8_t* p, const float (&s)[8], int warp, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) {
      const int head = narrow_head(hc, lane);
      *reinterpret_cast<__nv_bfloat16*>(p + head * 128 + (((key >> 3) ^ (head & 7)) << 4) + (key & 7) * 2) =
          __float2bfloat16(s[narrow_reg(h, hc)]);
    }
  }
}

// o = o * keep (per head) + V^T P^T over the tile at byte offset `stage`, waited. The rescale is skipped
// by a warp whose heads all keep their max (a multiply by 1 changes no bit).
__device__ __forceinline__ void narrow_rescale_pv(float (&o)[8][8], const float (&keep)[4], uint64_t dv, uint64_t dp,
                                                  uint32_t stage) {
  if (__any_sync(0xffffffffu, keep[0] != 1.0f || keep[1] != 1.0f || keep[2] != 1.0f || keep[3] != 1.0f)) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int hc = 0; hc < 4; ++hc) o[mb][narrow_reg(h, hc)] *= keep[hc];
  }
  float(&of)[64] = *reinterpret_cast<float(*)[64]>(&o);
  wg::fence_regs(of);
  wg::fence();
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wg::wgmma_m64n16k16_ss<1>(o[mb], wg::desc_add(dv, stage + mb * kWgChunk + kk * 2048), wg::desc_add(dp, kk * 32),
                                1);
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(of);
}

// A finished split's heads into the sink: o / l (value column 64 mb + 16 warp + lane / 4 + 8 h of head
// narrow_head(hc)), and the log2-sum-exp m + log2 l for a partial (one writer a head).
__device__ __forceinline__ void narrow_store(const RowSink& sink, int num_heads, int head0, const float (&o)[8][8],
                                             const float (&m)[4], const float (&l)[4], int warp, int lane) {
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
    const int head = head0 + narrow_head(hc, lane);
    if (head >= num_heads) continue;
    const float inv = l[hc] > 0.0f ? 1.0f / l[hc] : 0.0f;
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = mb * 64 + warp * 16 + lane / 4 + 8 * h;
        const float v = o[mb][narrow_reg(h, hc)] * inv;
        if (sink.out != nullptr) sink.out[head * sink.out_stride_h + col] = __float2bfloat16(v);
        else sink.po[head * sink.po_stride_h + col] = v;
      }
    if (sink.out == nullptr && warp == 0 && lane < 4)
      sink.lse[head * sink.lse_stride_h] = l[hc] > 0.0f ? m[hc] + log2f(l[hc]) : -INFINITY;
  }
}

// Grid (head groups of 16, programs): program (hg, pid) takes the plan's windows pid, pid + grid, ...
// (mla_decode_cuda.h) for heads 16 hg ..; bf16 rows only (FP8 rows take the 64-head config:
// ops.mla_decode.launch_config).
//
// Warps 0..3 (the warpgroup) compute; warp 4 is the producer. Its lane 0 walks the same request
// pieces and issues every TMA load as soon as its buffer is free: tile n of the program's sequence
// into stage n % 2 once the warpgroup released tile n - 2 there (`empty`, 128 arrivals), a request's
// Q once the warpgroup's last S^T of the previous request read the old one (`qempty`). A stage goes
// back to the producer the moment its last P V is done, and the block-table read of each issue stays
// off the warpgroup's path. Why a warp of its own: the load bookkeeping stays out of the compute loop
// (its time is that of issuing from thread 0 between tiles, BENCHMARKS.md).
__global__ void __launch_bounds__(kNarrowThreads + 32, 1)
    mla_decode_narrow_kernel(MlaDecodeArgs a, const __grid_constant__ CUtensorMap kv_map,
                             const __grid_constant__ CUtensorMap q_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = attn::smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  // stage s: full0 + 8 s (its tile landed), empty0 + 8 s (the warpgroup is done with it); Q's pair
  const uint32_t full0 = base + NarrowLayout::bars, empty0 = full0 + 16, qfull = full0 + 32, qempty = full0 + 40;
  if (tid == 0) {  // before the wait: nothing here reads what earlier kernels write
    for (int st = 0; st < 2; ++st) {
      wg::mbar_init(full0 + 8 * st, 1);
      wg::mbar_init(empty0 + 8 * st, kNarrowThreads);
    }
    wg::mbar_init(qfull, 1);
    wg::mbar_init(qempty, kNarrowThreads);
    wg::mbar_init_fence();
    wg::prefetch_tensor_map(&kv_map);
    wg::prefetch_tensor_map(&q_map);
  }
  const PagedPlace at = paged_place_after_wait(a);
  if (at.idle()) return;
  const int hg = at.hg, pid = at.pid, bs = at.bs;
  const PlanWindows windows = at.windows;
  const int page = static_cast<int>(a.page_size);
  __syncthreads();  // the barriers' initialisation (the last block-wide barrier: the producer leaves early)

  if (warp == kNarrowThreads / 32) {  // the producer
    if (lane == 0) {
      uint32_t n = 0, qn = 0;  // tiles and requests issued so far
      for_each_request(a, windows, bs, pid, kWgKeys, [&](int, int b, int t0, int t1) {
        const PagedKeys keys = PagedKeys::of(a, &kv_map, &q_map, page, hg, b, t0);
        for (int i = 0; i < t1 - t0; ++i, ++n) {
          const uint32_t st = n & 1;
          if (n >= 2) wg::mbar_wait(empty0 + 8 * st, ((n >> 1) - 1) & 1);
          keys.issue(i, st, base + NarrowLayout::kv + st * kWgTile, full0 + 8 * st);
          if (i == 0) {  // Q after the request's first tile: the old Q is read until the last tile's S^T
            if (qn > 0) wg::mbar_wait(qempty, (qn - 1) & 1);
            load_packed_q<kNarrowHeads>(&q_map, hg, b, base + NarrowLayout::q, qfull);
          }
        }
        ++qn;
      });
    }
    return;
  }

  const float qk_scale = a.softmax_scale * kLog2e;
  float* red = reinterpret_cast<float*>(smem + NarrowLayout::red);
  // K (S^T's A) and Q (its B), K-major; the value columns (O^T's A) MN-major; P^T (O^T's B), K-major
  const uint64_t dk = wg::desc_sw128(base + NarrowLayout::kv, 16, 1024);
  const uint64_t dq = wg::desc_sw128(base + NarrowLayout::q, 16, 1024);
  const uint64_t dv = wg::desc_sw128(base + NarrowLayout::kv, kWgChunk, 1024);
  const uint64_t dp = wg::desc_sw128(base + NarrowLayout::p, 16, 1024);
  uint32_t n = 0, qn = 0;  // tiles and requests consumed so far (the producer's sequence)

  for_each_request(a, windows, bs, pid, kWgKeys, [&](int w, int b, int t0, int t1) {
    const PagedKeys keys = PagedKeys::of(a, &kv_map, &q_map, page, hg, b, t0);
    const int nt = t1 - t0;
    wg::mbar_wait(qfull, qn & 1);
    float o[8][8], m[4], l[4];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int r = 0; r < 8; ++r) o[mb][r] = 0.0f;
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) m[hc] = -INFINITY, l[hc] = 0.0f;

    for (int i = 0; i < nt; ++i, ++n) {
      const uint32_t st = n & 1, stage = st * kWgTile;
      wg::mbar_wait(full0 + 8 * st, (n >> 1) & 1);
      const int key0 = (t0 + i) * kWgKeys;
      if (key0 + kWgKeys > keys.seq_len) {  // the row's last tile: rows past the length read as zeros
        keys.landed(i, smem + NarrowLayout::kv + stage, kNarrowThreads);
        narrow_sync();
      }
      float s[8];
      wg::start_chain(s);
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) {
        const uint32_t k_off = (ks / 4) * kWgChunk + (ks % 4) * 32, q_off = (ks / 4) * kNarrowQChunk + (ks % 4) * 32;
        wg::wgmma_m64n16k16_ss<0>(s, wg::desc_add(dk, stage + k_off), wg::desc_add(dq, q_off), ks > 0);
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(s);
      if (i == nt - 1) wg::mbar_arrive(qempty);  // this thread's last read of the request's Q
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (key0 + warp * 16 + lane / 4 + 8 * h >= keys.seq_len)
#pragma unroll
          for (int hc = 0; hc < 4; ++hc) s[narrow_reg(h, hc)] = -INFINITY;
      float keep[4];
      // the barrier in narrow_softmax's reduction is what frees the old P^T (every warp waited for its
      // previous P V before it)
      narrow_softmax(s, m, l, keep, red + st * 4 * kNarrowHeads, warp, lane, qk_scale);
      narrow_put_p(smem + NarrowLayout::p, s, warp, lane);
      wg::fence_proxy_async();
      narrow_sync();  // P^T complete
      narrow_rescale_pv(o, keep, dv, dp, stage);
      wg::mbar_arrive(empty0 + 8 * st);  // this thread is done with the stage
    }
    ++qn;
    // past this reduction's barrier every warp is past its last P V: P^T is free for the next request
    narrow_reduce(l, red + 8 * kNarrowHeads, warp, lane, [](float x, float y) { return x + y; });
    narrow_store(decode_sink(a, b, split_row(a, windows, w, b)), static_cast<int>(a.num_heads), hg * kNarrowHeads,
                 o, m, l, warp, lane);
  });
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a (no wgmma / TMA): fail loudly instead of leaving out unwritten
#endif
}

}  // namespace mla
}  // namespace paddle_mla
