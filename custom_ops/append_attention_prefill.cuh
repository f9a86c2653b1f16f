// append_attention, CUDA prefill / extend kernel (requests with >= 2 new tokens this step; under
// batch_invariant the requests a.rows names, every one by default).
// One block per (query tile, KV head): 4 warps x 8 rows, a row being one (query, query head) of the
// KV head's group, so the group's heads share every K/V tile in shared memory. Keys stream in
// 32-key tiles (cp.async, double buffered) over the union of the tile's visible ranges: [0, last]
// for a full head, the sinks and (first - window, last] for an SWA head. Each row keeps its own
// online softmax, masked per row by the contract's rule. Included by append_attention_kernels.cu.
#pragma once

#include "append_attention_device.cuh"

namespace paddle_mla {
namespace attn {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillRows = 8;  // rows per warp
constexpr int kPrefillBlockRows = kPrefillWarps * kPrefillRows;

struct PrefillGeometry {
  int row_bytes, q_stride, queries;  // queries per tile: kPrefillBlockRows / group (>= 1)
  size_t smem;
};

// The (request, first query) of tile `x` among the requests it takes (>= 2 new tokens; under
// batch_invariant those a.rows names), by a warp-wide scan of cu_seqlens_q; request -1 when x is past
// the last tile.
// Called by one whole warp.
__device__ __forceinline__ void find_tile(const AppendAttentionArgs& a, int64_t x, int queries, int64_t& req,
                                          int64_t& q0) {
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  // requests with n new tokens, min_n <= n <= max_n (default mode: one-token rows are the decode kernel's)
  const int64_t min_n = a.batch_invariant && a.rows != RequestRows::kSeveral ? 1 : 2;
  const int64_t max_n = a.rows == RequestRows::kOneToken ? 1 : INT64_MAX;
  int64_t base = 0;
  req = -1;
  q0 = 0;
  for (int64_t start = 0; start < a.batch; start += 32) {
    const int64_t bb = start + lane;
    const int64_t n = bb < a.batch ? a.cu_seqlens_q[bb + 1] - a.cu_seqlens_q[bb] : 0;
    const int64_t tiles = n >= min_n && n <= max_n ? (n + queries - 1) / queries : 0;
    int64_t incl = tiles;
    for (int o = 1; o < 32; o *= 2) {
      const int64_t y = __shfl_up_sync(full, incl, o);
      if (lane >= o) incl += y;
    }
    const int64_t total = __shfl_sync(full, incl, 31);
    if (x < base + total) {
      const bool mine = x >= base + incl - tiles && x < base + incl;
      const int src = __ffs(__ballot_sync(full, mine)) - 1;
      const int64_t before = __shfl_sync(full, incl - tiles, src);
      req = start + src;
      q0 = (x - base - before) * queries;
      return;
    }
    base += total;
  }
}

template <typename T, int VB, int DPL>
__global__ void prefill_kernel(AppendAttentionArgs a, PrefillGeometry geo) {
  constexpr int R = kPrefillRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ int64_t s_req, s_q0;
  __shared__ int64_t tokens[kPrefillBlockRows], heads[kPrefillBlockRows];
  if (warp == 0) {
    int64_t req, q0;
    find_tile(a, blockIdx.x, geo.queries, req, q0);
    if (lane == 0) {
      s_req = req;
      s_q0 = q0;
    }
  }
  __syncthreads();
  const int64_t b = s_req, q0 = s_q0, g = blockIdx.y;
  if (b < 0) return;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t t_begin = a.cu_seqlens_q[b], n = a.cu_seqlens_q[b + 1] - t_begin;
  if (threadIdx.x < kPrefillBlockRows) {
    const int64_t r = threadIdx.x, i = r / group, t = t_begin + q0 + i;
    const bool ok = i < geo.queries && q0 + i < n && token_request(a, t) == b;
    tokens[r] = ok ? t : -1;
    heads[r] = g * group + r % group;
  }
  __syncthreads();
  int64_t pmin = -1, pmax = -1;
  for (int r = 0; r < kPrefillBlockRows; ++r) {
    if (tokens[r] < 0) continue;
    const int64_t p = a.positions[tokens[r]];
    pmin = pmin < 0 ? p : min(pmin, p);
    pmax = max(pmax, p);
  }
  if (pmax < 0) return;  // no valid row (uniform over the block)
  KeyRanges keys{0, pmax + 1, 0, 0};
  if (is_swa_head(a, g) && !a.swa_mask) {  // swa_mask: walk [0, pmax], attend_tile masks
    const int64_t sinks = max(static_cast<int64_t>(0), min(a.sink, pmax + 1));
    const int64_t win_lo = max(sinks, pmin - a.window + 1);
    keys = KeyRanges{0, sinks, win_lo, max(win_lo, pmax + 1)};
  }
  const int64_t nvis = keys.count();
  extern __shared__ __align__(16) uint8_t smem[];
  float* qsm = reinterpret_cast<float*>(smem);
  const size_t stage = static_cast<size_t>(kTileKeys) * geo.row_bytes;
  uint8_t* stages = smem + kPrefillBlockRows * geo.q_stride * sizeof(float);
  float* psm = reinterpret_cast<float*>(stages + 4 * stage) + warp * kTileKeys * R;
  load_q_rows<T>(a, tokens, heads, kPrefillBlockRows, qsm, geo.q_stride);
  int64_t row_p[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = tokens[warp * R + r];
    row_p[r] = t >= 0 ? a.positions[t] : -1;
  }
  WarpState<R, DPL> st;
  st.init();
  const bool swa = is_swa_head(a, g);
  const int D = static_cast<int>(a.head_dim);
  if (nvis > 0) load_tile<T, VB>(a, b, g, keys, 0, nvis, stages, stages + stage, geo.row_bytes, threadIdx.x,
                                 blockDim.x);
  __pipeline_commit();
  for (int64_t it = 0, first = 0; first < nvis; ++it, first += kTileKeys) {
    uint8_t* cur = stages + (it % 2) * 2 * stage;
    uint8_t* nxt = stages + ((it + 1) % 2) * 2 * stage;
    if (first + kTileKeys < nvis)
      load_tile<T, VB>(a, b, g, keys, first + kTileKeys, nvis, nxt, nxt + stage, geo.row_bytes, threadIdx.x,
                       blockDim.x);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();  // this tile's copies (every thread's) and the q rows are visible
    const int64_t kj = lane_key(a, b, g, keys, first, nvis, lane);
    attend_tile<T, VB, R, DPL>(st, cur, cur + stage, geo.row_bytes, qsm + warp * R * geo.q_stride, geo.q_stride,
                               D, kj, row_p, swa, a.window, a.sink, psm);
    __syncthreads();  // every warp is done with `cur` before the next iteration refills it
  }
  __pipeline_wait_prior(0);
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = tokens[warp * R + r];
    if (t < 0) continue;
    const float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
    T* dst = out + (t * a.num_q_heads + heads[warp * R + r]) * a.head_dim;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dst[d] = from_f<T>(st.o[r][i] * inv);
    }
  }
}

}  // namespace attn
}  // namespace paddle_mla
