// mla_decode, the split kernel: one program = one block of 16 * RB query heads over the plan's windows
// of key tiles (pid, pid + grid, ...; mla_decode_cuda.h), tensor cores through mma.sync m16n8k16 (sm_80+; sized for
// the 227 KB of shared memory of an SM90 block).
//
// Warps: RB row blocks (16 heads each, the MMA's M) x CS column warps. The CS warps of a row block
// share one 576-deep QK^T: each takes 576 / CS of its depth, and the partial scores are summed
// through shared memory in a fixed order, so every warp of the block holds the same scores, runs the
// same online softmax and feeds P straight from its accumulators into P V for its own 512 / CS value
// columns. Splitting the 512-wide output is what keeps a warp's fp32 accumulator at 512 / CS columns
// (128 registers at CS = 2) instead of spilling a whole row; splitting the depth keeps QK^T computed
// once. The value operand is the first 512 columns of the key tile already in shared memory (the
// latent is read from memory once per head block).
//
// Key tiles of BN tokens stream in through the block table with 16-byte cp.async, NST stages deep
// (NST - 1 tiles in flight while one is computed); tokens past the row's length are zero-filled, so a
// masked key never multiplies garbage into the output. Q stays in shared memory for the request
// (ldmatrix per k-step) to leave the registers to the accumulator.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "append_attention_mma.cuh"
#include "mla_decode_cuda.h"

namespace paddle_mla {
namespace mla {

constexpr int kKeyDim = static_cast<int>(kMlaKeyDim);
constexpr int kLatent = static_cast<int>(kMlaLatentDim);
// +8 elements a row: the 8 rows of an ldmatrix fall in distinct banks (1168-byte rows)
constexpr int kPitch = kKeyDim + 8;
constexpr int kChunks = kKeyDim / 8;  // 16-byte chunks a row
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory: Q rows, NST key tiles, the score-exchange buffer (host and device compute it alike).
struct SplitLayout {
  size_t kv, stage, red, total;
  __host__ __device__ static size_t up(size_t x) { return (x + 127) / 128 * 128; }
  __host__ __device__ SplitLayout(int rb, int cs, int bn, int nst) {
    kv = up(static_cast<size_t>(16) * rb * kPitch * 2);
    stage = up(static_cast<size_t>(bn) * kPitch * 2);
    red = kv + nst * stage;
    total = red + (cs > 1 ? up(static_cast<size_t>(cs) * 16 * rb * (bn + 4) * 4) : 0);
  }
};

// 16-byte async copy; `valid` false zero-fills the destination without reading `src`.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Named barrier `id` of `count` threads (ids 1.. : 0 is __syncthreads'): wait for all of them, or
// only signal this thread's arrival (a producer that does not wait for the consumers).
__device__ __forceinline__ void row_block_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void row_block_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The plan's windows: `q_tiles` consecutive tiles of the step's concatenated rows each, `total` tiles
// in all. The balanced plan has at most one window a program; the batch-invariant plan (fixed
// windows from each row's start, its span padded to whole windows) may have more, which a program
// takes in strides of the grid (`for_each_request`).
struct PlanWindows {
  int q_tiles, total;
  __device__ __forceinline__ bool has(int w) const { return w * q_tiles < total; }
  __device__ __forceinline__ int start(int w) const { return w * q_tiles; }
  __device__ __forceinline__ int end(int w) const { return min((w + 1) * q_tiles, total); }
};
__device__ __forceinline__ PlanWindows plan_windows(const int32_t* tiles_per_prog, const int32_t* cu_tiles, int bs) {
  return {tiles_per_prog[0], cu_tiles[bs]};
}

// The first request whose key tiles end after tile `p_start` of the plan (cu_tiles: [bs + 1]).
__device__ __forceinline__ int first_request(const int32_t* cu_tiles, int bs, int p_start) {
  int lo = 0, hi = bs;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (cu_tiles[mid + 1] <= p_start) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Request b's key tiles inside the window [p_start, p_end), as [t0, t1) counted from the request's
// first tile (empty for a zero-length row); false once the request starts past the window. A padded
// span (the batch-invariant plan) ends at the row's last real tile of `bn` keys.
__device__ __forceinline__ bool request_tiles(const int32_t* cu_tiles, const int32_t* seq_lens, int bn, int b,
                                              int p_start, int p_end, int& t0, int& t1) {
  const int c0 = cu_tiles[b];
  if (c0 >= p_end) return false;
  t0 = max(c0, p_start) - c0;
  t1 = min(min(cu_tiles[b + 1], p_end) - c0, (seq_lens[b] + bn - 1) / bn);
  return true;
}

// Each request piece of this program's windows (pid, pid + grid, ...), in order: body(w, b, t0, t1)
// with the window w and request b's key tiles [t0, t1) in it; zero-length rows are the combine's.
template <class Body>
__device__ __forceinline__ void for_each_request(const MlaDecodeArgs& a, const PlanWindows& windows, int bs, int pid,
                                                 int bn, Body&& body) {
  for (int w = pid; windows.has(w); w += static_cast<int>(gridDim.y)) {
    const int p_start = windows.start(w), p_end = windows.end(w);
    for (int b = first_request(a.cu_tiles, bs, p_start); b < bs; ++b) {
      int t0, t1;
      if (!request_tiles(a.cu_tiles, a.seq_lens, bn, b, p_start, p_end, t0, t1)) break;
      if (t1 > t0) body(w, b, t0, t1);
    }
  }
}

// The partial-output row of request b's split in window w.
__device__ __forceinline__ int64_t split_row(const MlaDecodeArgs& a, const PlanWindows& windows, int w, int b) {
  return a.split_start[b] + (w - a.cu_tiles[b] / windows.q_tiles);
}

// The fragments below are a warp's m16n8 accumulators, N 8-column blocks of 4 registers: register
// [n][2 h + c] is row lane / 4 + 8 h, column 8 n + 2 (lane % 4) + c (wgmma's m64nNk16 accumulator is
// the same per warp). Both MLA kernels keep scores and outputs in that form.

// Keys at or past the row's length get score -inf (only the row's last tile has any).
template <int NB>
__device__ __forceinline__ void mask_past_length(float (&s)[NB][4], int key0, int seq_len, int lane) {
  if (key0 + NB * 8 <= seq_len) return;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (key0 + nb * 8 + (lane % 4) * 2 + (e & 1) >= seq_len) s[nb][e] = -INFINITY;
  }
}

// How far (log2 units) a tile's score may pass the running max before the max moves, under kLazy: P
// then stays at most 2^8 (bf16 holds it to the same relative precision; fp32 O and l have the range),
// and the max settles after a row's first tiles, so the output's rescale is skipped where keep is 1.
constexpr float kLazyMaxLog2 = 8.0f;

// One tile of the online softmax, log2 units: the scores become P, (m, l) move on, `keep` is the
// factor the output accumulators are rescaled by. A quad of lanes shares a row; l stays this lane's
// partial sum (reduced over the quad once, at the end). kLazy: m moves only by more than kLazyMaxLog2
// (keep is exactly 1 otherwise, once a key of the row counted); a row's results still follow its own
// scores alone.
template <int NB, bool kLazy = false>
__device__ __forceinline__ void online_softmax(float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&keep)[2],
                                               float qk_scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * h], s[nb][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_tile = mx * qk_scale;
    // (-inf + 8 is -inf: a row's first key always moves the max)
    const float m_new = kLazy ? (m_tile > m[h] + kLazyMaxLog2 ? m_tile : m[h]) : fmaxf(m[h], m_tile);
    // -inf only while every key so far was masked (a sparse row's invalid slots; a paged row's tile
    // always holds a key): subtracting 0 then keeps P and the rescale at 0 instead of NaN
    const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
    keep[h] = attn::fast_exp2(m[h] - m_sub);
    m[h] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int x = 2 * h; x < 2 * h + 2; ++x) {
        s[nb][x] = attn::fast_exp2(fmaf(s[nb][x], qk_scale, -m_sub));
        sum += s[nb][x];
      }
    }
    l[h] = l[h] * keep[h] + sum;
  }
}

// Where a finished split's rows go, each pointer at head 0, column 0 of the row: the bf16 output
// itself (`out` set: the row's only split), else the fp32 partial and its log2-sum-exp.
struct RowSink {
  __nv_bfloat16* out;
  int64_t out_stride_h;
  float* po;
  int64_t po_stride_h;
  float* lse;
  int64_t lse_stride_h;
};

// The paged decode's sink for request b's split in partial row `prow`.
__device__ __forceinline__ RowSink decode_sink(const MlaDecodeArgs& a, int b, int64_t prow) {
  if (a.num_splits[b] == 1)
    return {static_cast<__nv_bfloat16*>(a.out) + b * a.out_stride_b, a.out_stride_h, nullptr, 0, nullptr, 0};
  return {nullptr, 0, a.partial_out + prow * a.po_stride_row, a.po_stride_head,
          a.partial_lse + prow * a.lse_stride_row, a.lse_stride_head};
}

// A finished split's rows (heads head0 and head0 + 8 of the H, columns col .. col + 8 ND of the value)
// into `sink`; the log2-sum-exp from `lse_writer` warps. sum: the rows' softmax denominators, m: the
// maxima they are relative to (log2 units; in the warpgroup kernel up to kLazyMaxLog2 below the true
// ones). A row that saw no valid key (sum 0: a sparse row's invalid slots) gets zeros and a
// log2-sum-exp of -inf, which the merges weigh 0.
template <int ND>
__device__ __forceinline__ void store_rows(const RowSink& sink, int num_heads, const float (&acc)[ND][4], int head0,
                                           int col, const float (&sum)[2], const float (&m)[2], bool lse_writer,
                                           int lane) {
  using T = __nv_bfloat16;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
    const int head = head0 + 8 * h;
    if (head >= num_heads) continue;
    if (sink.out != nullptr) {
      T* o = sink.out + head * sink.out_stride_h + col;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd)
        *reinterpret_cast<uint32_t*>(o + nd * 8) = attn::pack2<T>(acc[nd][2 * h] * inv, acc[nd][2 * h + 1] * inv);
    } else {
      float* po = sink.po + head * sink.po_stride_h + col;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd)
        *reinterpret_cast<float2*>(po + nd * 8) = make_float2(acc[nd][2 * h] * inv, acc[nd][2 * h + 1] * inv);
      if (lse_writer && lane % 4 == 0)
        sink.lse[head * sink.lse_stride_h] = sum[h] > 0.0f ? m[h] + log2f(sum[h]) : -INFINITY;
    }
  }
}

template <int RB, int CS, int BN, int NST>
__global__ void __launch_bounds__(32 * RB * CS, 1) mla_decode_split_kernel(MlaDecodeArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = __nv_bfloat16;
  constexpr int NT = 32 * RB * CS, HB = 16 * RB, E = 2;
  constexpr int KPW = kKeyDim / 16 / CS;  // QK^T k-steps of one warp
  constexpr int NV = kLatent / CS;        // value columns of one warp
  constexpr int NB = BN / 8;              // n8 blocks of scores
  constexpr int RP = BN + 4;              // score-exchange row pitch (floats)
  static_assert((kKeyDim / 16) % CS == 0 && NV % 16 == 0 && BN % 16 == 0 && NST >= 2, "unsupported config");
  extern __shared__ __align__(128) uint8_t smem[];
  const SplitLayout L(RB, CS, BN, NST);
  float* red = reinterpret_cast<float*>(smem + L.red);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int rb = warp / CS, cs = warp % CS;
  const int hg = static_cast<int>(blockIdx.x), pid = static_cast<int>(blockIdx.y);
  const int bs = static_cast<int>(a.batch), H = static_cast<int>(a.num_heads);
  const PlanWindows windows = plan_windows(a.tiles_per_prog, a.cu_tiles, bs);
  if (!windows.has(pid)) return;
  const T* kv = static_cast<const T*>(a.kv_cache);
  const int page = static_cast<int>(a.page_size);
  const bool tile_in_page = page % BN == 0;  // a tile's rows are consecutive rows of one page
  const float qk_scale = a.softmax_scale * kLog2e;
  const uint32_t q_smem = attn::smem_u32(smem), kv_smem = attn::smem_u32(smem + L.kv);
  // ldmatrix lane addresses (bytes): Q as the A operand; keys as QK's B operand (rows are its
  // columns: no transpose); the same rows as P V's B operand (ldmatrix.trans)
  const uint32_t q_lane = q_smem + ((rb * 16 + lane % 16) * kPitch + (lane / 16) * 8) * E;
  const uint32_t k_lane = ((lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8) * E;
  const uint32_t v_lane = ((lane % 8 + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8 + cs * NV) * E;
  const int col0 = (lane % 4) * 2;

  for_each_request(a, windows, bs, pid, BN, [&](int w, int b, int t0, int t1) {
    const int seq_len = a.seq_lens[b];
    const int32_t* bt = a.block_tables + b * a.bt_stride;
    const T* qrow = static_cast<const T*>(a.q) + b * a.q_stride_b;
    for (int c = tid; c < HB * kChunks; c += NT) {  // Q rows; heads past H are zeros
      const int r = c / kChunks, part = c - r * kChunks, head = hg * HB + r;
      const bool ok = head < H;
      cp_async16(q_smem + (r * kPitch + part * 8) * E, qrow + (ok ? head * a.q_stride_h + part * 8 : 0), ok);
    }
    auto issue = [&](int t, int st) {  // key tile t of this request into stage st
      const uint32_t dst = kv_smem + st * static_cast<uint32_t>(L.stage);
      const int tok0 = t * BN;
      const T* tile = kv;
      if (tile_in_page && tok0 < seq_len)
        tile = kv + bt[tok0 / page] * a.kv_stride_block + (tok0 % page) * a.kv_stride_token;
      for (int c = tid; c < BN * kChunks; c += NT) {
        const int n = c / kChunks, part = c - n * kChunks, tok = tok0 + n;
        const bool ok = tok < seq_len;
        const T* src = kv;
        if (ok) {
          src = tile_in_page ? tile + n * a.kv_stride_token
                             : kv + bt[tok / page] * a.kv_stride_block + (tok % page) * a.kv_stride_token;
          src += part * 8;
        }
        cp_async16(dst + (n * kPitch + part * 8) * E, src, ok);
      }
    };
    const int nt = t1 - t0;
#pragma unroll
    for (int s = 0; s < NST - 1; ++s) {  // the first group carries Q too
      if (s < nt) issue(t0 + s, s);
      cp_async_commit();
    }
    float acc[NV / 8][4];
#pragma unroll
    for (int nd = 0; nd < NV / 8; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lane / 4 and lane / 4 + 8 (log2 units)

    for (int i = 0; i < nt; ++i) {
      // tile i landed for every thread, and every warp is done with tile i - 1, whose stage
      // (and the score-exchange buffer) may be overwritten now
      cp_async_wait<NST - 2>();
      __syncthreads();
      if (i + NST - 1 < nt) issue(t0 + i + NST - 1, (i + NST - 1) % NST);
      cp_async_commit();
      const uint32_t kt = kv_smem + (i % NST) * static_cast<uint32_t>(L.stage);
      float s[NB][4];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
      for (int j = 0; j < KPW; ++j) {  // this warp's share of the depth of S = Q K^T
        const int ks = cs * KPW + j;
        uint32_t qa[4];
        attn::ldsm_x4(qa, q_lane + ks * 16 * E);
#pragma unroll
        for (int n2 = 0; n2 < NB / 2; ++n2) {
          uint32_t kb[4];
          attn::ldsm_x4(kb, kt + k_lane + (n2 * 16 * kPitch + ks * 16) * E);
          attn::mma16816_x2<T>(s[2 * n2], s[2 * n2 + 1], qa, kb);
        }
      }
      if constexpr (CS > 1) {  // sum the CS partial scores, in warp order, in every warp of the row block
        float* mine = red + (cs * HB + rb * 16) * RP;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(mine + (lane / 4 + 8 * h) * RP + nb * 8 + col0) =
                make_float2(s[nb][2 * h], s[nb][2 * h + 1]);
        }
        row_block_barrier(1 + rb, 32 * CS);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float x = 0.0f, y = 0.0f;
#pragma unroll
            for (int c = 0; c < CS; ++c) {
              const float2 v = *reinterpret_cast<const float2*>(red + (c * HB + rb * 16 + lane / 4 + 8 * h) * RP +
                                                                nb * 8 + col0);
              x += v.x;
              y += v.y;
            }
            s[nb][2 * h] = x;
            s[nb][2 * h + 1] = y;
          }
        }
      }
      mask_past_length(s, (t0 + i) * BN, seq_len, lane);
      float keep[2];
      online_softmax(s, m, l, keep, qk_scale);
#pragma unroll
      for (int nd = 0; nd < NV / 8; ++nd) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nd][e] *= keep[e / 2];
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {  // O += P V over this warp's value columns
        uint32_t pa[4];
        pa[0] = attn::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = attn::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = attn::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = attn::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < NV / 16; ++dp) {
          uint32_t vb[4];
          attn::ldsm_x4_trans(vb, kt + v_lane + (kk * 16 * kPitch + dp * 16) * E);
          attn::mma16816_x2<T>(acc[2 * dp], acc[2 * dp + 1], pa, vb);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // Q and the stages are free for the next request

    float sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    }
    const int64_t prow = split_row(a, windows, w, b);
    store_rows(decode_sink(a, b, prow), H, acc, hg * HB + rb * 16 + lane / 4, cs * NV + col0, sum, m, cs == 0, lane);
  });
#endif
}

}  // namespace mla
}  // namespace paddle_mla
