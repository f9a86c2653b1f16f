// append_attention, tensor-core decode kernel (bf16 / fp16 caches, head_dim % 16 == 0, <= 256, group <= 16).
//
// One block of 4 warps per (request, KV head, split), the same grid, split rule, workspace layout and
// merge_kernel as the CUDA-core decode_kernel. Why the group is the WMMA M dimension: a decode token has
// one query row per query head, and the `group` heads of one KV head read the same K/V rows, so the
// group (zero-padded to 16 rows) is the only M there is; every K/V tile then feeds one 16 x TK x D
// product and is read from memory once per (request, KV head, split). Per tile of TK keys:
//   S = Q K^T (WMMA 16x16x16, fp32 accumulate, one 16-key column block per warp) -> shared fp32;
//   online softmax in fp32 for the real rows only (warp w owns rows w, w + 4, ...), P in T -> shared;
//   O += P V (WMMA, one 16-dim column block per warp at a time), O kept in shared fp32 so that the
//   per-row rescale is a plain shared-memory multiply (WMMA fragments have no portable row mapping).
// K/V tiles stream in with 16-byte cp.async, double buffered; their source offsets (and the mask: -1 =
// past the split, or no block) are planned once per tile by one thread per key, so a -1 block id is
// never dereferenced and rows with nothing to read are zero-filled (a NaN-poisoned slot never reaches
// the MMA); swa_mask mode reads the keys it masks (read_offset).
// Which keys a head visits is key_ranges() (an SWA head walks only its sinks and window), exactly as
// in decode_kernel. Included by append_attention_kernels.cu.
#pragma once

#include <mma.h>

#include "append_attention_device.cuh"

namespace paddle_mla {
namespace attn {

constexpr int kTcRows = 16;  // WMMA M: the group's query heads, zero-padded
constexpr int kTcWarps = 4;

// Keys per tile (TK): 64 for head_dim <= 128 (two 34 KB stages, ~90 KB a block, two blocks an SM), 32
// above (a block stays under ~100 KB). head_dim 128 also has a 32-key variant (~52 KB, four blocks an
// SM), chosen by PADDLE_MLA_GQA_TC_TILE=32 to measure which hides memory latency better.
template <int DMAX>
struct TcTile {
  static constexpr int keys = DMAX <= 128 ? 64 : 32;
};

// Shared-memory layout of one block, byte offsets (host and device compute it alike).
// Row pitches: Q/K/V rows of D + 8 elements (16 bytes of pad: the 8 rows of an ldmatrix fall in
// distinct banks; WMMA wants ldm % 8 == 0 for 16-bit types, % 4 for fp32 and 32-byte aligned pointers).
template <int TK>
struct TcLayout {
  int kp, sp, pp, op;  // pitches (elements) of Q/K/V, S (fp32), P, O (fp32) rows
  size_t q, kv, stage, s, p, o, offs, ml, total;
  PMLA_HD static size_t up(size_t x) { return (x + 127) / 128 * 128; }
  PMLA_HD TcLayout(int D, int elem) {
    kp = D + 8;
    sp = TK + 4;
    pp = TK + 8;
    op = D + 4;
    q = 0;
    kv = up(q + static_cast<size_t>(kTcRows) * kp * elem);
    stage = up(static_cast<size_t>(TK) * kp * elem);  // one K (or V) tile
    s = kv + 4 * stage;                               // 2 stages x (K, V)
    p = up(s + static_cast<size_t>(kTcRows) * sp * 4);
    o = up(p + static_cast<size_t>(kTcRows) * pp * elem);
    offs = up(o + static_cast<size_t>(kTcRows) * op * 4);
    ml = up(offs + 2 * static_cast<size_t>(TK) * 8);
    total = up(ml + 2 * kTcRows * 4);
  }
};

template <typename T, int DMAX, int TK>
__global__ void __launch_bounds__(32 * kTcWarps) decode_tc_kernel(AppendAttentionArgs a, int splits, int target,
                                                                  float* ws_o, float* ws_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  static_assert(TK == 32 || TK == 64, "the softmax step gives each lane TK / 32 keys");
  constexpr int kRowsPerWarp = kTcRows / kTcWarps;
  const int64_t b = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;  // not a decode row, or padding
  const int group = static_cast<int>(a.num_q_heads / a.num_kv_heads);
  const int D = static_cast<int>(a.head_dim);
  const int64_t p = a.positions[t0];
  const KeyRanges keys = key_ranges(a, g, p);
  const int64_t nvis = keys.count();
  const int64_t chunk = splits > 1 ? decode_split_keys(a, splits, target, TK, nvis) : nvis;
  const SplitWindow win = split_window(nvis, chunk, split);
  const int64_t lo = win.lo, hi = win.hi;
  const int64_t head_row = b * a.num_q_heads + g * group;  // first (request, query head) row
  T* out = static_cast<T*>(a.out) + (t0 * a.num_q_heads + g * group) * a.head_dim;
  if (lo >= hi) {  // nothing to see in this split (every split, when an SWA head has no window)
    if (splits > 1) {
      if (static_cast<int>(threadIdx.x) < group) ws_lse[(head_row + threadIdx.x) * splits + split] = -INFINITY;
    } else {
      for (int e = static_cast<int>(threadIdx.x); e < group * D; e += blockDim.x) out[e] = from_f<T>(0.0f);
    }
    return;
  }
  extern __shared__ __align__(128) uint8_t tc_smem[];
  uint8_t* smem = tc_smem;
  const TcLayout<TK> L(D, static_cast<int>(sizeof(T)));
  T* qs = reinterpret_cast<T*>(smem + L.q);
  float* ss = reinterpret_cast<float*>(smem + L.s);
  T* ps = reinterpret_cast<T*>(smem + L.p);
  float* os = reinterpret_cast<float*>(smem + L.o);
  int64_t* offs = reinterpret_cast<int64_t*>(smem + L.offs);
  float* ml = reinterpret_cast<float*>(smem + L.ml);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  auto k_stage = [&](int st) { return reinterpret_cast<T*>(smem + L.kv + 2 * st * L.stage); };
  auto v_stage = [&](int st) { return reinterpret_cast<T*>(smem + L.kv + (2 * st + 1) * L.stage); };

  // Q rows roped and stored in T, unscaled (the scale goes onto the fp32 scores); padding rows, P and O
  // start at zero (P rows >= group are never written again, so they contribute nothing).
  const T* qrow0 = static_cast<const T*>(a.q) + t0 * a.q_stride + g * group * a.head_dim;
  for (int e = tid; e < kTcRows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    qs[r * L.kp + d] = from_f<T>(r < group ? roped(a, qrow0 + r * a.head_dim, d, p) : 0.0f);
    os[r * L.op + d] = 0.0f;
  }
  for (int e = tid; e < kTcRows * L.pp; e += blockDim.x) ps[e] = from_f<T>(0.0f);

  // Planned offset of each key of the tile at virtual index `first` (read_offset: -1 past the split or
  // no block, <= -2 read but masked).
  auto plan = [&](int64_t first, int st) {
    if (tid < TK) {
      const int64_t i = first + tid;
      int64_t off = -1;
      if (i < hi) {
        const int64_t j = keys.position(i);
        const int64_t blk = block_of(a, b, g, j);
        // swa_mask (the uniform-table baseline) walks every key of an SWA head and reads it: those
        // outside its sinks and window are masked here (always visible in skip mode)
        if (blk >= 0) off = cache_offset(a, g, blk, j);
        if (off >= 0 && !key_visible(a, g, p, j)) off = masked_read(off);
      }
      offs[st * TK + tid] = off;
    }
  };
  // 16-byte cp.async of the planned K and V rows into stage `st`; masked rows are zero-filled.
  auto issue = [&](int st) { copy_planned_rows<T>(a, offs + st * TK, TK, k_stage(st), v_stage(st), L.kp, tid, blockDim.x); };

  const float qk_scale = a.softmax_scale * kLog2e;  // scores in log2 units, as decode_kernel's
  float m_r[kRowsPerWarp], l_r[kRowsPerWarp];       // rows warp + kTcWarps * i, replicated over lanes
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m_r[i] = -INFINITY;
    l_r[i] = 0.0f;
  }
  plan(lo, 0);
  __syncthreads();
  issue(0);
  // The Q operand stays in registers for the whole split (D / 16 fragments, 4 registers each).
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[DMAX / 16];
#pragma unroll
  for (int kk = 0; kk < DMAX / 16; ++kk) {
    if (kk * 16 < D) wmma::load_matrix_sync(qf[kk], qs + kk * 16, L.kp);
  }
  int it = 0;
  for (int64_t first = lo; first < hi; first += TK, ++it) {
    const int cur = it & 1, nxt = cur ^ 1;
    const bool more = first + TK < hi;
    if (more) plan(first + TK, nxt);  // offs[nxt] was last read by the previous tile's issue
    __syncthreads();                  // (A) plan visible; the previous tile's S, P, O and stage nxt are free
    if (more) {
      issue(nxt);
    } else {
      __pipeline_commit();  // an empty group keeps wait_prior(1) meaning "the current tile has landed"
    }
    __pipeline_wait_prior(1);
    __syncthreads();  // (B) every thread's copies of the current tile are visible
    const T* kt = k_stage(cur);
    const T* vt = v_stage(cur);
    for (int nt = warp; nt < TK / 16; nt += kTcWarps) {  // S[:, 16 nt .. 16 nt + 15] = Q K^T
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < DMAX / 16; ++kk) {
        if (kk * 16 < D) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;  // K rows are K^T's columns
          wmma::load_matrix_sync(fb, kt + nt * 16 * L.kp + kk * 16, L.kp);
          wmma::mma_sync(acc, qf[kk], fb, acc);
        }
      }
      wmma::store_matrix_sync(ss + nt * 16, acc, L.sp, wmma::mem_row_major);
    }
    __syncthreads();  // (C) S complete
    const int64_t* toff = offs + cur * TK;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {  // online softmax of the warp's real rows
      const int r = warp + kTcWarps * i;
      if (r >= group) break;  // uniform over the warp
      float sv[TK / 32];
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < TK / 32; ++c) {
        const int n = lane + 32 * c;
        sv[c] = toff[n] >= 0 ? ss[r * L.sp + n] * qk_scale : -INFINITY;
        mx = fmaxf(mx, sv[c]);
      }
      const float m_new = fmaxf(m_r[i], warp_max(mx));
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < TK / 32; ++c) {
        const float pr = sv[c] == -INFINITY ? 0.0f : exp2f(sv[c] - m_new);
        sum += pr;
        ps[r * L.pp + lane + 32 * c] = from_f<T>(pr);
      }
      const float keep = m_r[i] == -INFINITY ? 0.0f : exp2f(m_r[i] - m_new);
      l_r[i] = l_r[i] * keep + warp_sum(sum);
      m_r[i] = m_new;
      if (keep != 1.0f) {
        for (int d = lane; d < D; d += 32) os[r * L.op + d] *= keep;
      }
    }
    __syncthreads();  // (D) P and the rescaled O complete
    for (int nt = warp; nt < D / 16; nt += kTcWarps) {  // O[:, 16 nt ..] += P V
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, os + nt * 16, L.op, wmma::mem_row_major);
#pragma unroll
      for (int k0 = 0; k0 < TK; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, ps + k0, L.pp);
        wmma::load_matrix_sync(fb, vt + k0 * L.kp + nt * 16, L.kp);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(os + nt * 16, acc, L.op, wmma::mem_row_major);
    }
  }
  __pipeline_wait_prior(0);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kTcWarps * i;
      if (r < group) {
        ml[r] = m_r[i];
        ml[kTcRows + r] = l_r[i];
      }
    }
  }
  __syncthreads();  // the last P V and the row states are visible
  for (int e = tid; e < group * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    const float l = ml[kTcRows + r];
    const float val = l > 0.0f ? os[r * L.op + d] / l : 0.0f;
    if (splits == 1) {
      out[r * D + d] = from_f<T>(val);
    } else {
      ws_o[((head_row + r) * splits + split) * a.head_dim + d] = val;
      if (d == 0) ws_lse[(head_row + r) * splits + split] = l > 0.0f ? ml[r] + log2f(l) : -INFINITY;
    }
  }
#endif
}

}  // namespace attn
}  // namespace paddle_mla
