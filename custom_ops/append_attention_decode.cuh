// append_attention, CUDA-core decode kernel (step 2 of append_attention_kernels.cu for fp32 caches and
// the shapes the tensor-core decode kernels do not take): grid (request, KV head x head chunk, split);
// its warps stream 32-key tiles (cp.async, double buffered) with R of the group's query heads at once,
// merge in shared memory, and write either the output (one split) or a partial output and its
// log-sum-exp into the workspace for merge_kernel. Included by append_attention_kernels.cu.
#pragma once

#include "append_attention_device.cuh"
#include "append_attention_decode_plan.cuh"

namespace paddle_mla {
namespace attn {

struct DecodeGeometry {
  int row_bytes, q_stride, nwarps, hchunks, splits, target;
  size_t smem;
};

template <typename T, int VB, int R, int DPL>
__global__ void decode_kernel(AppendAttentionArgs a, DecodeGeometry geo, float* ws_o, float* ws_lse) {
  const int64_t b = blockIdx.x;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t g = blockIdx.y / geo.hchunks, h0 = (blockIdx.y % geo.hchunks) * R;
  const int hc = static_cast<int>(min(static_cast<int64_t>(R), group - h0));
  const int64_t p = a.positions[t0];
  const KeyRanges keys = key_ranges(a, g, p);
  const int64_t nvis = keys.count(), split = blockIdx.z;
  const int64_t chunk = geo.splits > 1 ? attn::decode_split_keys(a, geo.splits, geo.target, kTileKeys, nvis) : nvis;
  const SplitWindow win = split_window(nvis, chunk, split);
  const int64_t lo = win.lo, hi = win.hi;
  const int64_t head_row = b * a.num_q_heads + g * group + h0;  // first (request, query head) row
  if (lo >= hi) {  // nothing to see in this split (every split, when an SWA head has no window)
    if (geo.splits > 1) {
      if (threadIdx.x < hc) ws_lse[(head_row + threadIdx.x) * geo.splits + split] = -INFINITY;
    } else {
      T* out = static_cast<T*>(a.out) + (t0 * a.num_q_heads + g * group + h0) * a.head_dim;
      for (int64_t e = threadIdx.x; e < hc * a.head_dim; e += blockDim.x) out[e] = attn::from_f<T>(0.0f);
    }
    return;
  }
  extern __shared__ __align__(16) uint8_t smem[];
  float* qsm = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t stage = static_cast<size_t>(kTileKeys) * geo.row_bytes;
  uint8_t* mine = smem + R * geo.q_stride * sizeof(float) + warp * (4 * stage + kTileKeys * R * sizeof(float));
  float* psm = reinterpret_cast<float*>(mine + 4 * stage);
  __shared__ int64_t tokens[R], heads[R];
  if (threadIdx.x < R) {
    tokens[threadIdx.x] = threadIdx.x < hc ? t0 : -1;
    heads[threadIdx.x] = g * group + h0 + threadIdx.x;
  }
  __syncthreads();
  attn::load_q_rows<T>(a, tokens, heads, R, qsm, geo.q_stride);
  __syncthreads();
  int64_t row_p[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row_p[r] = r < hc ? p : -1;
  attn::WarpState<R, DPL> st;
  st.init();
  const int D = static_cast<int>(a.head_dim);
  const bool swa = is_swa_head(a, g);
  // Warp w takes tiles w, w + nwarps, ...: two stages, the next tile's copy overlaps this one's math.
  const int64_t step = static_cast<int64_t>(geo.nwarps) * kTileKeys;
  int64_t first = lo + warp * kTileKeys;
  if (first < hi) attn::load_tile<T, VB>(a, b, g, keys, first, hi, mine, mine + stage, geo.row_bytes, lane, 32);
  __pipeline_commit();
  for (int it = 0; first < hi; ++it, first += step) {
    uint8_t* cur = mine + (it % 2) * 2 * stage;
    uint8_t* nxt = mine + ((it + 1) % 2) * 2 * stage;
    if (first + step < hi)
      attn::load_tile<T, VB>(a, b, g, keys, first + step, hi, nxt, nxt + stage, geo.row_bytes, lane, 32);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncwarp();
    const int64_t kj = attn::lane_key(a, b, g, keys, first, hi, lane);
    attn::attend_tile<T, VB, R, DPL>(st, cur, cur + stage, geo.row_bytes, qsm, geo.q_stride, D, kj, row_p, swa,
                                     a.window, a.sink, psm);
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  // Merge the warps: each publishes (m, l, o) of its rows; then every thread combines some (row, dim).
  const int ostride = 32 * DPL + 2;
  float* merge = reinterpret_cast<float*>(smem + R * geo.q_stride * sizeof(float));  // stages are free now
  float* my = merge + warp * R * ostride;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (lane == 0) {
      my[r * ostride] = st.m[r];
      my[r * ostride + 1] = st.l[r];
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) my[r * ostride + 2 + lane + 32 * i] = st.o[r][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < hc * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    float mx = -INFINITY;
    for (int w = 0; w < geo.nwarps; ++w) mx = fmaxf(mx, merge[(w * R + r) * ostride]);
    float l = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < geo.nwarps; ++w) {
        const float* src = merge + (w * R + r) * ostride;
        const float f = src[0] == -INFINITY ? 0.0f : exp2f(src[0] - mx);
        l += f * src[1];
        o += f * src[2 + d];
      }
    }
    const float val = l > 0.0f ? o / l : 0.0f;
    if (geo.splits == 1) {
      static_cast<T*>(a.out)[(t0 * a.num_q_heads + g * group + h0 + r) * a.head_dim + d] = attn::from_f<T>(val);
    } else {
      ws_o[((head_row + r) * geo.splits + split) * a.head_dim + d] = val;
      if (d == 0) ws_lse[(head_row + r) * geo.splits + split] = l > 0.0f ? mx + log2f(l) : -INFINITY;
    }
  }
}

}  // namespace attn
}  // namespace paddle_mla
