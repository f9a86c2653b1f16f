// append_attention, CUDA device helpers shared by the kernels of append_attention_kernels.cu:
// dtype conversion, RoPE of one element, the paged K/V tile copy (cp.async) and one warp's online-
// softmax step over a tile of 32 keys. Framework-neutral (nvcc alone compiles it).
//
// Layout of a K/V tile in shared memory: 32 key rows of `row_bytes` = D * sizeof(T) + pad, so that
// lane n reading its own row in VB-byte vectors meets no bank conflict. Lane n of a warp owns key n
// of the tile for QK^T (scores for every row of the warp), and dims lane + 32 i for PV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "append_attention_common.h"

namespace paddle_mla {
namespace attn {

constexpr int kTileKeys = 32;  // keys per tile: one per lane
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// Element d of one head's row, roped at position p (dims >= rot_dim pass through).
template <typename T>
__device__ __forceinline__ float roped(const AppendAttentionArgs& a, const T* row, int64_t d, int64_t p) {
  const float x = to_f(row[d]);
  if (d >= a.rot_dim) return x;
  const float* cs = a.cos_sin + p * a.rot_dim;
  const int64_t half = a.rot_dim / 2;
  if (a.neox) {
    if (d < half) return x * cs[d] - to_f(row[d + half]) * cs[half + d];
    return x * cs[d - half] + to_f(row[d - half]) * cs[d];  // cs[half + (d - half)] == cs[d]
  }
  const int64_t i = d / 2;
  if (d % 2 == 0) return x * cs[i] - to_f(row[d + 1]) * cs[half + i];
  return x * cs[i] + to_f(row[d - 1]) * cs[half + i];
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Copies the K and V rows of virtual key indices [first, first + 32) of `keys` (those < end, whose
// block exists) into one tile stage with cp.async, by `nthreads` threads numbered `tid`; other rows
// are zero-filled, so a masked key never multiplies garbage (or a poisoned NaN) into the output.
template <typename T, int VB>
__device__ __forceinline__ void load_tile(const AppendAttentionArgs& a, int64_t b, int64_t g, const KeyRanges& keys,
                                          int64_t first, int64_t end, uint8_t* ksm, uint8_t* vsm, int row_bytes,
                                          int tid, int nthreads) {
  const int per_row = static_cast<int>(a.head_dim * sizeof(T)) / VB;
  const uint8_t* kc = static_cast<const uint8_t*>(a.k_cache);
  const uint8_t* vc = static_cast<const uint8_t*>(a.v_cache);
  for (int c = tid; c < kTileKeys * per_row; c += nthreads) {
    const int n = c / per_row, part = c % per_row;
    uint8_t* kd = ksm + n * row_bytes + part * VB;
    uint8_t* vd = vsm + n * row_bytes + part * VB;
    const int64_t i = first + n;
    const int64_t j = i < end ? keys.position(i) : -1;
    const int64_t blk = j >= 0 ? block_of(a, b, g, j) : -1;
    if (blk >= 0) {
      const int64_t off = cache_offset(a, g, blk, j) * static_cast<int64_t>(sizeof(T)) + part * VB;
      __pipeline_memcpy_async(kd, kc + off, VB);
      __pipeline_memcpy_async(vd, vc + off, VB);
    } else {
      for (int x = 0; x < VB; x += 4) {
        *reinterpret_cast<uint32_t*>(kd + x) = 0u;
        *reinterpret_cast<uint32_t*>(vd + x) = 0u;
      }
    }
  }
}

// A planned key's offset: >= 0 a visible key at that element offset; -1 nothing to read (past the
// split, a missing block: the row is zero-filled); <= -2 a key read but masked, at -off - 2
// (swa_mask: the uniform-table baseline reads the keys it masks, as the seed's kernel does, so it
// moves the bytes head-wise tables save).
PMLA_HD inline int64_t masked_read(int64_t off) { return -off - 2; }
PMLA_HD inline int64_t read_offset(int64_t off) { return off >= -1 ? off : -off - 2; }

// 16-byte cp.async of `rows` planned K and V rows (offs[n]: a planned offset, see read_offset) into
// tiles of pitch `pitch` elements, by `nthreads` threads; rows with nothing to read are zero-filled,
// so a -1 block is never dereferenced and a NaN-poisoned slot never reaches an MMA. Commits one cp.async group. Shared by the tensor-core decode and prefill kernels;
// kD > 0 (a compile-time head_dim) turns the chunk indexing into shifts; with compile-time rows and
// thread count as well (kRows, kThreads > 0, which then replace `rows` and `nthreads`; kThreads a
// multiple of the chunks per row) the copy is straight-line code from per-thread bases: it is issued
// every tile, so its index arithmetic counts.
template <typename T, int kD = 0, int kRows = 0, int kThreads = 0>
__device__ __forceinline__ void copy_planned_rows(const AppendAttentionArgs& a, const int64_t* offs, int rows,
                                                  T* kd0, T* vd0, int pitch, int tid, int nthreads) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int per_row = kD > 0 ? kD / kVec : static_cast<int>(a.head_dim) / kVec;
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  auto chunk = [&](int c) {  // 16 bytes of one K row and one V row
    const int n = c / per_row, e = (c - n * per_row) * kVec;
    const int64_t off = read_offset(offs[n]);
    T* kd = kd0 + n * pitch + e;
    T* vd = vd0 + n * pitch + e;
    if (off >= 0) {
      __pipeline_memcpy_async(kd, kc + off + e, 16);
      __pipeline_memcpy_async(vd, vc + off + e, 16);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0u, 0u, 0u, 0u);
    }
  };
  if constexpr (kD > 0 && kRows > 0 && kThreads > 0 && kThreads % (kD > 0 ? kD / kVec : 1) == 0) {
    // tid < kThreads: thread tid copies chunk tid % per_row of rows tid / per_row + k * kStep, so its
    // source and destination bases are fixed and each row costs an offset read and two copies.
    constexpr int kPer = kD / kVec, kStep = kThreads / kPer, kSteps = (kRows + kStep - 1) / kStep;
    const int n0 = tid / kPer, e = (tid - n0 * kPer) * kVec;
    const T* kce = kc + e;
    const T* vce = vc + e;
    T* kd = kd0 + n0 * pitch + e;
    T* vd = vd0 + n0 * pitch + e;
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      if (kRows % kStep != 0 && n0 + k * kStep >= kRows) break;
      const int64_t off = read_offset(offs[n0 + k * kStep]);
      if (off >= 0) {
        __pipeline_memcpy_async(kd + k * kStep * pitch, kce + off, 16);
        __pipeline_memcpy_async(vd + k * kStep * pitch, vce + off, 16);
      } else {
        *reinterpret_cast<uint4*>(kd + k * kStep * pitch) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(vd + k * kStep * pitch) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  } else {
    for (int c = tid; c < rows * per_row; c += nthreads) chunk(c);
  }
  __pipeline_commit();
}

// 16-byte cp.async from global `src` to shared `dst` (cache-global: the tile is read once).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}

// 16-byte cp.async of kRows K and V rows that lie one after another in the caches from element offset
// `base` (the plan found key n of the tile at base + n * kD: a tile inside one cache block) into tiles
// of pitch `pitch` elements, by kThreads threads. Why a second copy: copy_planned_rows reads, checks
// and turns into an address each row's planned offset, about 25 instructions per row and thread; for
// every tile of the register-O decode that is a third of its instructions and 41% of its stall samples
// (ncu, H200, 3 rows of 32k), and that kernel is bound by instruction latency, not memory (with its
// loads removed it still takes two thirds of its time). Here the source is one linear range, so a
// chunk's address is a constant from the thread's base. Commits one cp.async group.
template <typename T, int kD, int kRows, int kThreads>
__device__ __forceinline__ void copy_contiguous_rows(const AppendAttentionArgs& a, int64_t base, T* kd0, T* vd0,
                                                     int pitch, int tid) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kPer = kD / kVec, kChunks = kRows * kPer;
  const T* ks = static_cast<const T*>(a.k_cache) + base;
  const T* vs = static_cast<const T*>(a.v_cache) + base;
  if constexpr (kThreads % kPer == 0) {  // a thread's rows step by kThreads / kPer, its dims stay
    constexpr int kStep = kThreads / kPer;
    const int n0 = tid / kPer, e = (tid - n0 * kPer) * kVec;
#pragma unroll
    for (int k = 0; k < (kRows + kStep - 1) / kStep; ++k) {
      if (kRows % kStep != 0 && n0 + k * kStep >= kRows) break;
      const int n = n0 + k * kStep;
      cp_async16(kd0 + n * pitch + e, ks + n * kD + e);
      cp_async16(vd0 + n * pitch + e, vs + n * kD + e);
    }
  } else {
#pragma unroll
    for (int k = 0; k < (kChunks + kThreads - 1) / kThreads; ++k) {
      const int c = tid + k * kThreads;
      if (kChunks % kThreads != 0 && c >= kChunks) break;
      const int n = c / kPer, e = (c - n * kPer) * kVec;
      cp_async16(kd0 + n * pitch + e, ks + c * kVec);
      cp_async16(vd0 + n * pitch + e, vs + c * kVec);
    }
  }
  __pipeline_commit();
}

// The key position lane `n` holds in a tile starting at virtual index `first`, or -1 (masked).
__device__ __forceinline__ int64_t lane_key(const AppendAttentionArgs& a, int64_t b, int64_t g,
                                            const KeyRanges& keys, int64_t first, int64_t end, int n) {
  const int64_t i = first + n;
  if (i >= end) return -1;
  const int64_t j = keys.position(i);
  return block_of(a, b, g, j) >= 0 ? j : -1;
}

// Running softmax state of up to R rows (query heads, or query x head pairs) in one warp.
template <int R, int DPL>
struct WarpState {
  float m[R], l[R], o[R][DPL];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) o[r][i] = 0.0f;
    }
  }
};

template <int VE>
__device__ __forceinline__ void load_floats(const float* p, float (&x)[VE]) {
  if constexpr (VE % 4 == 0) {
#pragma unroll
    for (int e = 0; e < VE; e += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + e);
      x[e] = v.x;
      x[e + 1] = v.y;
      x[e + 2] = v.z;
      x[e + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VE; ++e) x[e] = p[e];
  }
}

// One tile for one warp: scores of its R rows (q rows in shared memory, fp32, pre-scaled by
// softmax_scale * log2 e, stride q_stride floats) against the lane's key, masked per row by the
// contract's rule (row_p[r] < 0: a padding row), online-softmax update, then P V.
// `psm` is the warp's own [32][R] float scratch.
template <typename T, int VB, int R, int DPL>
__device__ __forceinline__ void attend_tile(WarpState<R, DPL>& st, const uint8_t* ksm, const uint8_t* vsm,
                                            int row_bytes, const float* qsm, int q_stride, int D, int64_t key_j,
                                            const int64_t (&row_p)[R], bool swa, int64_t window, int64_t sink,
                                            float* psm) {
  constexpr int VE = VB / static_cast<int>(sizeof(T));
  const int lane = threadIdx.x & 31;
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = 0.0f;
  const uint8_t* krow = ksm + lane * row_bytes;
  for (int c = 0; c < D / VE; ++c) {
    alignas(VB) T kv[VE];
    if constexpr (VB == 16) {
      *reinterpret_cast<uint4*>(kv) = *reinterpret_cast<const uint4*>(krow + c * VB);
    } else {
      *reinterpret_cast<uint32_t*>(kv) = *reinterpret_cast<const uint32_t*>(krow + c * VB);
    }
    float kf[VE];
#pragma unroll
    for (int e = 0; e < VE; ++e) kf[e] = to_f(kv[e]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float qf[VE];
      load_floats<VE>(qsm + r * q_stride + c * VE, qf);
#pragma unroll
      for (int e = 0; e < VE; ++e) s[r] = fmaf(qf[e], kf[e], s[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t p = row_p[r];
    const bool vis = key_j >= 0 && p >= 0 && key_j <= p && (!swa || key_j < sink || key_j > p - window);
    const float sv = vis ? s[r] : -INFINITY;
    const float m_new = fmaxf(st.m[r], warp_max(sv));
    const float pr = vis ? exp2f(sv - m_new) : 0.0f;
    const float keep = st.m[r] == -INFINITY ? 0.0f : exp2f(st.m[r] - m_new);
    st.l[r] = st.l[r] * keep + warp_sum(pr);
    st.m[r] = m_new;
#pragma unroll
    for (int i = 0; i < DPL; ++i) st.o[r][i] *= keep;
    psm[lane * R + r] = pr;
  }
  __syncwarp();
  for (int n = 0; n < kTileKeys; ++n) {
    float pn[R];
    load_floats<R>(psm + n * R, pn);
    const T* vrow = reinterpret_cast<const T*>(vsm + n * row_bytes);
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < D) {
        const float vv = to_f(vrow[d]);
#pragma unroll
        for (int r = 0; r < R; ++r) st.o[r][i] = fmaf(pn[r], vv, st.o[r][i]);
      }
    }
  }
  __syncwarp();  // psm is rewritten by the next tile
}

// Roped, scaled (softmax_scale * log2 e) query rows into shared memory: row r of `rows` gets head
// heads[r] of token tokens[r] (token < 0: zeros).
template <typename T>
__device__ void load_q_rows(const AppendAttentionArgs& a, const int64_t* tokens, const int64_t* heads, int rows,
                            float* qsm, int q_stride) {
  const float scale = a.softmax_scale * kLog2e;
  for (int e = threadIdx.x; e < rows * a.head_dim; e += blockDim.x) {
    const int r = e / static_cast<int>(a.head_dim);
    const int64_t d = e % a.head_dim, t = tokens[r];
    float x = 0.0f;
    if (t >= 0) {
      const T* row = static_cast<const T*>(a.q) + t * a.q_stride + heads[r] * a.head_dim;
      x = roped(a, row, d, a.positions[t]) * scale;
    }
    qsm[r * q_stride + d] = x;
  }
}

// The shortest split of the by-length plan, in keys, from the keys to read and the plan's `target`
// splits: a split's fixed cost is worth several tiles, so a split takes up to 4x its share of two waves
// when that is short, but no more than kSplitFloorKeys (decode_plan says where these come from).
constexpr int64_t kSplitFloorKeys = 1024;
PMLA_HD inline int64_t split_floor_keys(int64_t total_keys, int64_t target) {
  const int64_t share4 = 4 * ((total_keys + target - 1) / target);
  return share4 < kSplitFloorKeys ? share4 : kSplitFloorKeys;
}

// Keys per split of one decode launch (the by-length plan), the same in every block of it: the decode
// rows' visible keys (each (row, KV head) by its own length: an SWA head counts only its sinks and
// window) spread over `target` splits, no shorter than split_floor_keys, so a full head's long row takes many splits and an SWA head's short row few, and
// every split streams about as many keys: a short row's finished split frees its SM for a long
// row's next one instead of leaving it idle while the full heads' few long splits run. At least
// enough that the longest (row, head) fits in the grid's `splits`; whole tiles of `tile` keys. Each
// block computes it from the batch's positions itself (no pre-pass launch, CUDA-graph replayable).
// Every thread of the block must call it (a block-wide reduction). `target` 0 (the equal plan,
// PADDLE_MLA_GQA_SPLITS=equal): this (row, head)'s `nvis` keys in `splits` equal parts instead.
__device__ inline int64_t decode_split_keys(const AppendAttentionArgs& a, int64_t splits, int64_t target,
                                           int64_t tile, int64_t nvis) {
  if (target <= 0) {
    const int64_t equal = ((nvis + splits - 1) / splits + tile - 1) / tile * tile;
    return equal > tile ? equal : tile;
  }
  __shared__ unsigned long long total_keys, longest;
  if (threadIdx.x == 0) total_keys = longest = 0;
  __syncthreads();
  unsigned long long mine = 0, most = 0;
  const int64_t swa_heads = a.num_swa_heads, full_heads = a.num_kv_heads - swa_heads;
  for (int64_t b = threadIdx.x; b < a.batch; b += blockDim.x) {
    const int32_t t0 = a.cu_seqlens_q[b];
    if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) continue;  // not a decode row
    const int64_t p = a.positions[t0];
    const int64_t full = p + 1, swa = swa_heads > 0 ? key_ranges(a, a.num_kv_heads - 1, p).count() : 0;
    mine += static_cast<unsigned long long>(full_heads * full + swa_heads * swa);
    const unsigned long long row_most = static_cast<unsigned long long>(full_heads > 0 ? (full > swa ? full : swa) : swa);
    most = most > row_most ? most : row_most;
  }
  if (mine) atomicAdd(&total_keys, mine);
  if (most) atomicMax(&longest, most);
  __syncthreads();
  const int64_t total = static_cast<int64_t>(total_keys), max_keys = static_cast<int64_t>(longest);
  int64_t chunk = split_floor_keys(total, target);
  const int64_t share = (total + target - 1) / target, fit = (max_keys + splits - 1) / splits;
  chunk = chunk > share ? chunk : share;
  chunk = chunk > fit ? chunk : fit;
  chunk = (chunk + tile - 1) / tile * tile;
  return chunk > tile ? chunk : tile;
}

}  // namespace attn
}  // namespace paddle_mla
