// append_attention, the fixed key segments of batch_invariant (deterministic: true) with
// invariant_split > 0: every row's keys are cut at multiples of invariant_split (from key 0), each
// segment's online softmax starts fresh, and the segments are folded left to right with seg_fold. The
// tensor-core prefill kernel's row-split block folds at each boundary (SEG; the folded state in registers
// or local memory: FoldedSegments); the one-token requests of any step run one block a (request, KV
// head, segment) instead (DSPLIT + SEG), write each segment's (m, l, O), and segment_merge_kernel
// folds them. The two give a row the same bits: each segment is the same chain of
// tiles in both, and the fold is one function with its roundings spelled out (no contraction left to
// the compiler). Why segments: without them a decode row's keys stream through one block, so few long
// rows leave most SMs idle (4 rows of 16k at Qwen3-8B dims: 32 blocks, the decode step 2.05x default
// mode's; docs/determinism.md). Included by append_attention_kernels.cu.
#pragma once

#include <type_traits>

#include "append_attention_common.h"
#include "append_attention_device.cuh"
#include "append_attention_mma.cuh"

namespace paddle_mla {
namespace attn {

// Folding a segment's (m, l, o) into the running (M, L, A) of the segments before it (M, m: maxima in
// log2 units; L, l: row sums; A, o: unnormalised outputs). seg_scales gives the two weights and the new
// maximum, or false when neither side saw a key (then nothing changes); seg_fold_elem folds one value.
// The roundings are spelled out (no contraction left to the compiler), so every fold site agrees.
__device__ __forceinline__ bool seg_scales(float M, float m, float& wa, float& wb, float& mn) {
  mn = fmaxf(M, m);
  if (mn == -INFINITY) return false;
  wa = fast_exp2(M - mn), wb = fast_exp2(m - mn);
  return true;
}

__device__ __forceinline__ float seg_fold_elem(float A, float wa, float o, float wb) {
  return __fmaf_rn(A, wa, __fmul_rn(o, wb));
}

// (M, L, A[0..n)) += (m, l, o[0..n)). A segment that saw no key (m = -inf, l = 0, o = 0) leaves them
// exactly as they were.
template <int N>
__device__ __forceinline__ void seg_fold(float& M, float& L, float* A, float m, float l, const float* o) {
  float wa, wb, mn;
  if (!seg_scales(M, m, wa, wb, mn)) return;
  L = seg_fold_elem(L, wa, l, wb);
#pragma unroll
  for (int i = 0; i < N; ++i) A[i] = seg_fold_elem(A[i], wa, o[i], wb);
  M = mn;
}

__device__ __forceinline__ float seg_output(float A, float L) { return L > 0.0f ? __fdiv_rn(A, L) : 0.0f; }

// Segments of a row whose last key is at position p.
PMLA_HD inline int64_t row_segments(const AppendAttentionArgs& a, int64_t p) {
  return p < 0 ? 0 : p / a.invariant_split + 1;
}

// Workspace of the per-segment partials: O [rows x Hq, segs, D], then (m, l) [rows x Hq, segs, 2].
PMLA_HD inline int64_t segment_ws_floats(const AppendAttentionArgs& a, int64_t segs) {
  return a.batch * a.num_q_heads * segs * (a.head_dim + 2);
}

// The tensor-core prefill kernel's pieces (append_attention_prefill_tc.cuh): a thread's O fragments hold
// rows lane / 4 + 8 h of each 16-row fragment f, its 2 NDW columns of them starting at column `col`.
__device__ __forceinline__ float row_sum(float x) {  // over a row's 4 lanes, as the output's sum is
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The folded segments' running max, row sum and unnormalised output of a row-split thread (its rows
// lane / 4 + 8 h of fragment f, its O columns). SPILL keeps them out of registers (volatile: local
// memory, per thread and coalesced, in L1 / L2): at MF = 2 the warp's O already fills half the
// register file, and the state is touched once a segment (every 32 tiles at 2048 keys).
template <int MF, int NDW, bool SPILL>
struct FoldedSegments {
  using F = std::conditional_t<SPILL, volatile float, float>;
  F A[MF][NDW][4], M[MF][2], L[MF][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int f = 0; f < MF; ++f) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // one store a statement: C++20 deprecates chained volatile stores
        M[f][h] = -INFINITY;
        L[f][h] = 0.0f;
      }
#pragma unroll
      for (int nd = 0; nd < NDW; ++nd) {
#pragma unroll
        for (int x = 0; x < 4; ++x) A[f][nd][x] = 0.0f;
      }
    }
  }

  // Ends the current segment: folds its (m, l, o) in (seg_fold's arithmetic, a value at a time: no
  // second copy of O in registers) and starts the next one fresh. Every lane of the warp calls it (the
  // row sums shuffle).
  __device__ __forceinline__ void fold(float (&o)[MF][NDW][4], float (&m)[MF][2], float (&l)[MF][2]) {
#pragma unroll
    for (int f = 0; f < MF; ++f) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float lsum = row_sum(l[f][h]);
        float wa, wb, mn;
        if (seg_scales(M[f][h], m[f][h], wa, wb, mn)) {
          L[f][h] = seg_fold_elem(L[f][h], wa, lsum, wb);
#pragma unroll
          for (int nd = 0; nd < NDW; ++nd) {
#pragma unroll
            for (int x = 2 * h; x < 2 * h + 2; ++x) A[f][nd][x] = seg_fold_elem(A[f][nd][x], wa, o[f][nd][x], wb);
          }
          M[f][h] = mn;
        }
#pragma unroll
        for (int nd = 0; nd < NDW; ++nd) o[f][nd][2 * h] = o[f][nd][2 * h + 1] = 0.0f;
        m[f][h] = -INFINITY;
        l[f][h] = 0.0f;
      }
    }
  }
};

// Row-split block: each real row's outputs, `value(f, h, nd)` packing the thread's two columns of 8-dim
// block nd of row lane / 4 + 8 h of fragment f.
template <typename T, int MF, int NDW, typename Value>
__device__ __forceinline__ void store_rows_by(const AppendAttentionArgs& a, const int64_t* s_tok, int r0, int64_t g,
                                              int group, int lane, int col, Value value) {
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 16 * f + lane / 4 + 8 * h;
      const int64_t t = s_tok[r];
      if (t < 0) continue;
      T* dst = static_cast<T*>(a.out) + (t * a.num_q_heads + g * group + r % group) * a.head_dim + col;
#pragma unroll
      for (int nd = 0; nd < NDW; ++nd) *reinterpret_cast<uint32_t*>(dst + nd * 8) = value(f, h, nd);
    }
  }
}

// Without segments: O times 1 / the row sum (summed by every lane first: the shuffles need the warp).
template <typename T, int MF, int NDW>
__device__ __forceinline__ void store_row_outputs(const AppendAttentionArgs& a, const int64_t* s_tok, int r0,
                                                  int64_t g, int group, int lane, int col,
                                                  const float (&o)[MF][NDW][4], const float (&l)[MF][2]) {
  float inv[MF][2];
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = row_sum(l[f][h]);
      inv[f][h] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
  }
  store_rows_by<T, MF, NDW>(a, s_tok, r0, g, group, lane, col, [&](int f, int h, int nd) {
    return pack2<T>(o[f][nd][2 * h] * inv[f][h], o[f][nd][2 * h + 1] * inv[f][h]);
  });
}

// From the folded segments' state.
template <typename T, int MF, int NDW, bool SPILL>
__device__ __forceinline__ void segment_store_rows(const AppendAttentionArgs& a, const int64_t* s_tok, int r0,
                                                   int64_t g, int group, int lane, int col,
                                                   const FoldedSegments<MF, NDW, SPILL>& st) {
  store_rows_by<T, MF, NDW>(a, s_tok, r0, g, group, lane, col, [&](int f, int h, int nd) {
    const float sum = st.L[f][h];
    return pack2<T>(seg_output(st.A[f][nd][2 * h], sum), seg_output(st.A[f][nd][2 * h + 1], sum));
  });
}

// Dims-split block of segment blockIdx.z (a one-token request, in any step): its (m, l, O) into the
// workspace for segment_merge_kernel, or, when the row has one segment, the output (the fold from
// nothing, as the row-split block's).
template <typename T, int MF, int NDW>
__device__ __forceinline__ void segment_store_block(const AppendAttentionArgs& a, const int64_t* s_tok, int64_t b,
                                                    int64_t g, int group, int64_t pmax, int warp, int lane, int col,
                                                    const float (&o)[MF][NDW][4], const float (&m)[MF][2],
                                                    const float (&l)[MF][2], float* ws, int segs) {
  const bool partial = row_segments(a, pmax) > 1;
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lr = row_sum(l[f][h]);
      const int r = 16 * f + lane / 4 + 8 * h;
      const int64_t t = s_tok[r];
      if (t < 0) continue;
      const int64_t head = g * group + r % group, row = b * a.num_q_heads + head;
      float ov[2 * NDW];
#pragma unroll
      for (int nd = 0; nd < NDW; ++nd) ov[2 * nd] = o[f][nd][2 * h], ov[2 * nd + 1] = o[f][nd][2 * h + 1];
      if (partial) {
        float* po = ws + (row * segs + blockIdx.z) * a.head_dim + col;
#pragma unroll
        for (int nd = 0; nd < NDW; ++nd) *reinterpret_cast<float2*>(po + nd * 8) = make_float2(ov[2 * nd], ov[2 * nd + 1]);
        if (warp == 0 && lane % 4 == 0) {
          float* ml = ws + a.batch * a.num_q_heads * segs * a.head_dim + (row * segs + blockIdx.z) * 2;
          ml[0] = m[f][h];
          ml[1] = lr;
        }
      } else {
        float Mx = -INFINITY, Lx = 0.0f, av[2 * NDW];
#pragma unroll
        for (int i = 0; i < 2 * NDW; ++i) av[i] = 0.0f;
        seg_fold<2 * NDW>(Mx, Lx, av, m[f][h], lr, ov);
        T* dst = static_cast<T*>(a.out) + (t * a.num_q_heads + head) * a.head_dim + col;
#pragma unroll
        for (int nd = 0; nd < NDW; ++nd)
          *reinterpret_cast<uint32_t*>(dst + nd * 8) = pack2<T>(seg_output(av[2 * nd], Lx), seg_output(av[2 * nd + 1], Lx));
      }
    }
  }
}

// One block per (decode row, query head): folds the row's segments in order, writes the output.
template <typename T>
__global__ void segment_merge_kernel(AppendAttentionArgs a, int segs, const float* ws) {
  const int64_t b = blockIdx.x, h = blockIdx.y;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;
  const int64_t n = row_segments(a, a.positions[t0]);
  if (n <= 1) return;  // the segment block wrote the output
  const int64_t row = b * a.num_q_heads + h;
  const float* po = ws + row * segs * a.head_dim;
  const float* ml = ws + a.batch * a.num_q_heads * segs * a.head_dim + row * segs * 2;
  for (int64_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int64_t z = 0; z < n; ++z) {
      const float o = po[z * a.head_dim + d];
      seg_fold<1>(M, L, &A, ml[2 * z], ml[2 * z + 1], &o);
    }
    static_cast<T*>(a.out)[(t0 * a.num_q_heads + h) * a.head_dim + d] = from_f<T>(seg_output(A, L));
  }
}

}  // namespace attn
}  // namespace paddle_mla
