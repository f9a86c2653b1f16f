// append_attention, CUDA kernels and launcher. Framework-neutral: nvcc compiles this file alone
// (scripts/check_cuda_compile.sh). Semantics: append_attention_common.h; CPU twin: append_attention_cpu.h.
//
// Three steps on one stream, every launch sized from shapes only (CUDA-graph replayable):
// 1. rope_write_kernel, one block per token: ropes k into the paged caches, copies v, and zeroes the
//    output rows of padding tokens.
// 2. decode_kernel (append_attention_decode.cuh) for requests with exactly one new token: grid (batch,
//    KV head x head chunk, split);
//    split s owns keys [s c, (s + 1) c) of the (request, KV head)'s visible keys (for an SWA head only
//    its sinks and window): one c for the whole launch by default (decode_split_keys), or that count / z
//    with PADDLE_MLA_GQA_SPLITS=equal (decode_plan says why by length is the default); its warps stream 32-key tiles (cp.async, double buffered) with all the group's
//    query heads at once, merge in shared memory, and write either the output (one split) or a
//    partial output and its log-sum-exp into the preallocated workspace; merge_kernel combines.
//    bf16 / fp16 caches with head_dim % 16 == 0 (<= 256) and group <= 16 take decode_tc_kernel instead
//    (append_attention_decode_tc.cuh: the group as the WMMA M dimension; same grid, splits, merge).
// Under batch_invariant (deterministic: true) step 2 is skipped and step 3 takes every request
// (launch_invariant).
// 3. prefill_kernel for requests with >= 2 new tokens: one block per (query tile, KV head); the tile
//    holds 32 (query, head) rows of one request, so a group's heads share every K/V tile load. The
//    block finds its (request, tile) from cu_seqlens_q itself (grid: ceil(T / queries) + batch).
//    bf16 / fp16 caches with head_dim 64, 80, 96 or 128 take prefill_tc_kernel instead
//    (append_attention_prefill_tc.cuh: mma.sync flash-attention-2 tiles of 128 (query, head) rows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "append_attention_cuda.h"
#include "append_attention_decode.cuh"
#include "append_attention_decode_plan.cuh"
#include "append_attention_decode_mma.cuh"
#include "append_attention_decode_tc.cuh"
#include "append_attention_device.cuh"
#include "append_attention_prefill.cuh"
#include "append_attention_prefill_tc.cuh"

namespace paddle_mla {
namespace {

using attn::kTileKeys;

constexpr int kMaxSmem = 160 * 1024;  // dynamic shared memory a decode block may take

template <typename T>
__global__ void rope_write_kernel(AppendAttentionArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t b = token_request(a, t);
  if (b < 0) {
    T* out = static_cast<T*>(a.out) + t * a.num_q_heads * a.head_dim;
    for (int64_t e = threadIdx.x; e < a.num_q_heads * a.head_dim; e += blockDim.x) out[e] = attn::from_f<T>(0.0f);
    return;
  }
  const int64_t p = a.positions[t];
  const T* k = static_cast<const T*>(a.k) + t * a.k_stride;
  const T* v = static_cast<const T*>(a.v) + t * a.v_stride;
  T* kc = static_cast<T*>(a.k_cache);
  T* vc = static_cast<T*>(a.v_cache);
  for (int64_t e = threadIdx.x; e < a.num_kv_heads * a.head_dim; e += blockDim.x) {
    const int64_t g = e / a.head_dim, d = e % a.head_dim;
    const int64_t blk = block_of(a, b, g, p);
    if (blk < 0) continue;
    const int64_t off = cache_offset(a, g, blk, p) + d;
    kc[off] = attn::from_f<T>(attn::roped(a, k + g * a.head_dim, d, p));
    vc[off] = v[g * a.head_dim + d];
  }
}

template <typename T, int VB, int R, int DPL>
const char* launch_decode(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, cudaStream_t stream) {
  attn::DecodeGeometry geo{};
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  geo.row_bytes = tile_row_bytes<T, VB>(a.head_dim);
  geo.q_stride = static_cast<int>((a.head_dim + 3) / 4 * 4);
  geo.hchunks = static_cast<int>((group + R - 1) / R);
  const size_t base = static_cast<size_t>(R) * geo.q_stride * sizeof(float);
  const size_t per_warp = 4 * static_cast<size_t>(kTileKeys) * geo.row_bytes + kTileKeys * R * sizeof(float);
  geo.nwarps = static_cast<int>(std::max<size_t>(1, std::min<size_t>(4, (kMaxSmem - base) / per_warp)));
  // The warps' (m, l, o) exchange reuses the stages; only tiny head dims need more than they hold.
  const size_t merge = static_cast<size_t>(geo.nwarps) * R * (32 * DPL + 2) * sizeof(float);
  geo.smem = base + std::max(geo.nwarps * per_warp, merge);
  auto kernel = attn::decode_kernel<T, VB, R, DPL>;
  if (const char* err = allow_smem(kernel, geo.smem)) return err;
  const DecodePlan plan = decode_plan(a, kernel, 32 * geo.nwarps, geo.smem, geo.hchunks, ws_floats);
  geo.splits = plan.splits;
  geo.target = plan.target;
  float* ws_o = geo.splits > 1 ? ws : nullptr;
  float* ws_lse = geo.splits > 1 ? ws + a.batch * a.num_q_heads * geo.splits * a.head_dim : nullptr;
  const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.num_kv_heads * geo.hchunks),
                  static_cast<unsigned>(geo.splits));
  kernel<<<grid, 32 * geo.nwarps, geo.smem, stream>>>(a, geo, ws_o, ws_lse);
  if (const char* err = launched()) return err;
  return launch_merge<T>(a, geo.splits, ws_o, ws_lse, stream);
}

// Whether the tensor-core kernels may run: bf16 / fp16, head_dim % 16 == 0 and <= max_dim, sm_80+, and
// the measurement switch `env` (read per call) not "0".
template <typename T>
bool tensor_cores_ok(const AppendAttentionArgs& a, int64_t max_dim, const char* env) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (a.head_dim % 16 != 0 || a.head_dim > max_dim) return false;
    const char* v = std::getenv(env);
    if (v != nullptr && std::strcmp(v, "0") == 0) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 8;
  }
}

// The tensor-core decode (append_attention_decode_tc.cuh): head_dim <= 256, group <= 16 (one block
// covers the whole group); PADDLE_MLA_GQA_TC=0 turns it off.
template <typename T>
bool use_decode_tc(const AppendAttentionArgs& a) {
  return a.num_q_heads / a.num_kv_heads <= attn::kTcRows && tensor_cores_ok<T>(a, 256, "PADDLE_MLA_GQA_TC");
}

// A tensor-core decode kernel over (request, KV head, split), then the merge of its splits.
template <typename T, typename K>
const char* launch_split_decode(const AppendAttentionArgs& a, K kernel, int threads, size_t smem, float* ws,
                                int64_t ws_floats, cudaStream_t stream) {
  if (const char* err = allow_smem(kernel, smem)) return err;
  const DecodePlan plan = decode_plan(a, kernel, threads, smem, 1, ws_floats);
  const int splits = plan.splits;
  float* ws_o = splits > 1 ? ws : nullptr;
  float* ws_lse = splits > 1 ? ws + a.batch * a.num_q_heads * splits * a.head_dim : nullptr;
  const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.num_kv_heads), static_cast<unsigned>(splits));
  kernel<<<grid, threads, smem, stream>>>(a, splits, plan.target, ws_o, ws_lse);
  if (const char* err = launched()) return err;
  return launch_merge<T>(a, splits, ws_o, ws_lse, stream);
}

template <typename T, int DMAX, int TK>
const char* launch_decode_tc(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, cudaStream_t stream) {
  const attn::TcLayout<TK> layout(static_cast<int>(a.head_dim), static_cast<int>(sizeof(T)));
  return launch_split_decode<T>(a, attn::decode_tc_kernel<T, DMAX, TK>, 32 * attn::kTcWarps, layout.total, ws,
                                ws_floats, stream);
}

// The register-O tensor-core decode (append_attention_decode_mma.cuh), NST cp.async stages.
template <typename T, int D, int NST>
const char* launch_decode_mma(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, cudaStream_t stream) {
  const attn::DmLayout layout(D, static_cast<int>(sizeof(T)), NST);
  return launch_split_decode<T>(a, attn::decode_mma_kernel<T, D, NST>, 32 * attn::kDmWarps, layout.total, ws,
                                ws_floats, stream);
}


// Tensor-core decode: the register-O kernel for head_dim 64, 80, 96, 128 (2 stages: ~75 KB a block at
// head_dim 128, three blocks an SM); the WMMA kernel above 128. Measurement switches, read per call:
// PADDLE_MLA_GQA_TC_KERNEL=wmma (the WMMA kernel), PADDLE_MLA_GQA_TC_TILE=32 (its 32-key tile),
// PADDLE_MLA_GQA_TC_STAGES=3 (the register-O kernel at head_dim 128 with 3 stages, two blocks an SM).
template <typename T, int VB, int DPL>
const char* launch_decode_any(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    if (use_decode_tc<T>(a)) {
      const bool tile32 = env_is("PADDLE_MLA_GQA_TC_TILE", "32");
      if (!tile32 && !env_is("PADDLE_MLA_GQA_TC_KERNEL", "wmma")) {
        switch (a.head_dim) {
          case 64: return launch_decode_mma<T, 64, 2>(a, ws, ws_floats, stream);
          case 80: return launch_decode_mma<T, 80, 2>(a, ws, ws_floats, stream);
          case 96: return launch_decode_mma<T, 96, 2>(a, ws, ws_floats, stream);
          case 128:
            if (env_is("PADDLE_MLA_GQA_TC_STAGES", "3")) return launch_decode_mma<T, 128, 3>(a, ws, ws_floats, stream);
            return launch_decode_mma<T, 128, 2>(a, ws, ws_floats, stream);
          default: break;
        }
      }
      if (a.head_dim <= 64) return launch_decode_tc<T, 64, attn::TcTile<64>::keys>(a, ws, ws_floats, stream);
      if (a.head_dim <= 128) {
        if (tile32) return launch_decode_tc<T, 128, 32>(a, ws, ws_floats, stream);
        return launch_decode_tc<T, 128, attn::TcTile<128>::keys>(a, ws, ws_floats, stream);
      }
      return launch_decode_tc<T, 256, attn::TcTile<256>::keys>(a, ws, ws_floats, stream);
    }
  }
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  return group <= 4 ? launch_decode<T, VB, 4, DPL>(a, ws, ws_floats, stream)
                    : launch_decode<T, VB, 8, DPL>(a, ws, ws_floats, stream);
}

template <typename T, int VB, int DPL>
const char* launch_prefill(const AppendAttentionArgs& a, cudaStream_t stream) {
  attn::PrefillGeometry geo{};
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  geo.row_bytes = tile_row_bytes<T, VB>(a.head_dim);
  geo.q_stride = static_cast<int>((a.head_dim + 3) / 4 * 4);
  geo.queries = static_cast<int>(attn::kPrefillBlockRows / group);
  geo.smem = static_cast<size_t>(attn::kPrefillBlockRows) * geo.q_stride * sizeof(float) +
             4 * static_cast<size_t>(kTileKeys) * geo.row_bytes +
             static_cast<size_t>(attn::kPrefillWarps) * kTileKeys * attn::kPrefillRows * sizeof(float);
  auto kernel = attn::prefill_kernel<T, VB, DPL>;
  if (const char* err = allow_smem(kernel, geo.smem)) return err;
  const int64_t tiles = (a.num_tokens + geo.queries - 1) / geo.queries + a.batch;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads));
  kernel<<<grid, 32 * attn::kPrefillWarps, geo.smem, stream>>>(a, geo);
  return launched();
}

// The tensor-core prefill (append_attention_prefill_tc.cuh): W warps of MF 16-row fragments a block
// (DSPLIT: the W warps share MF fragments and split O's dims).
template <typename T, int D, int W, int MF, bool DSPLIT = false, bool SEG = false>
const char* launch_prefill_tc(const AppendAttentionArgs& a, cudaStream_t stream, float* seg_ws = nullptr,
                              int segs = 1) {
  constexpr int rows = 16 * MF * (DSPLIT ? 1 : W);
  const attn::PtcLayout layout(D, static_cast<int>(sizeof(T)), rows, attn::ptc_exchange_bytes<DSPLIT, MF>());
  auto kernel = attn::prefill_tc_kernel<T, D, W, MF, DSPLIT, SEG>;
  if (const char* err = allow_smem(kernel, layout.total)) return err;
  const int64_t queries = rows / (a.num_q_heads / a.num_kv_heads);
  const int64_t tiles = a.rows == RequestRows::kOneToken ? a.batch : (a.num_tokens + queries - 1) / queries + a.batch;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(DSPLIT && SEG ? segs : 1));
  kernel<<<grid, 32 * W, layout.total, stream>>>(a, seg_ws, segs);
  return launched();
}

// Prefill rows: the tensor-core kernel for bf16 / fp16 with head_dim 64, 80, 96 or 128 on sm_80+
// (PADDLE_MLA_GQA_PREFILL_TC=0 turns it off), else the CUDA-core prefill_kernel. One block shape,
// 4 warps x 32 rows (FA2's): on an H100 it beat 8 warps x 16 rows (Q held in registers) and 4 warps x
// 16 rows by 15-18% at groups 4 and 8 (docs/benchmarks_history.md, "GQA prefill on tensor cores").
template <typename T, int VB, int DPL>
const char* launch_prefill_any(const AppendAttentionArgs& a, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    if (tensor_cores_ok<T>(a, 128, "PADDLE_MLA_GQA_PREFILL_TC")) {
      switch (a.head_dim) {
        case 64: return launch_prefill_tc<T, 64, 4, 2>(a, stream);
        case 80: return launch_prefill_tc<T, 80, 4, 2>(a, stream);
        case 96: return launch_prefill_tc<T, 96, 4, 2>(a, stream);
        case 128: return launch_prefill_tc<T, 128, 4, 2>(a, stream);
        default: break;
      }
    }
  }
  return launch_prefill<T, VB, DPL>(a, stream);
}

// Head dims with a tensor-core prefill instantiation (launch_prefill_any's), and those of its dims-split
// form (whole 16-dim steps a warp).
inline bool prefill_tc_head_dim(int64_t d) { return d == 64 || d == 80 || d == 96 || d == 128; }
inline bool dsplit_head_dim(int64_t d) { return d == 64 || d == 96 || d == 128; }

// The dims-split form; SEG: one block a (row, KV head, segment).
template <typename T, bool SEG>
const char* launch_dsplit(const AppendAttentionArgs& a, cudaStream_t stream, float* ws = nullptr, int segs = 1) {
  switch (a.head_dim) {
    case 64: return launch_prefill_tc<T, 64, 4, 1, true, SEG>(a, stream, ws, segs);
    case 96: return launch_prefill_tc<T, 96, 2, 1, true, SEG>(a, stream, ws, segs);
    default: return launch_prefill_tc<T, 128, 4, 1, true, SEG>(a, stream, ws, segs);
  }
}

// The row-split block with segments, MF 16-row fragments a warp.
template <typename T, int MF>
const char* launch_segment_rows(const AppendAttentionArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64: return launch_prefill_tc<T, 64, 4, MF, false, true>(a, stream);
    case 80: return launch_prefill_tc<T, 80, 4, MF, false, true>(a, stream);
    case 96: return launch_prefill_tc<T, 96, 4, MF, false, true>(a, stream);
    default: return launch_prefill_tc<T, 128, 4, MF, false, true>(a, stream);
  }
}

// 128 rows a block (MF = 2, the fold's state in local memory), or 64 (MF = 1) where `wide` is false:
// requests averaging fewer rows than a 128-row block (a one-token request among a few prompt chunks
// leaves the rest of its block empty). The two give a row the same bits.
template <typename T>
const char* launch_segment_rows(const AppendAttentionArgs& a, bool wide, cudaStream_t stream) {
  return wide ? launch_segment_rows<T, 2>(a, stream) : launch_segment_rows<T, 1>(a, stream);
}

// dsplit: the one-token requests (every request of a decode-only step) split over blocks by segment,
// merged by segment_merge_kernel; the other requests then take 128-row blocks, as default mode's
// prefill. Without it (or without workspace for the partials) every row takes the row-split block.
template <typename T>
const char* launch_segments(const AppendAttentionArgs& a, bool dsplit, bool decode_only, float* ws,
                            int64_t ws_floats, cudaStream_t stream) {
  const int64_t width = a.max_blocks * a.block_size;  // the longest row's keys, at most
  const int segs = static_cast<int>(attn::row_segments(a, width - 1));
  if (!dsplit || attn::segment_ws_floats(a, segs) > ws_floats)
    return launch_segment_rows<T>(a, a.num_tokens * (a.num_q_heads / a.num_kv_heads) >= 128 * a.batch, stream);
  AppendAttentionArgs one = a;
  one.rows = RequestRows::kOneToken;
  if (const char* err = launch_dsplit<T, true>(one, stream, ws, segs)) return err;
  attn::segment_merge_kernel<T><<<dim3(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.num_q_heads)),
                                  128, 0, stream>>>(one, segs, ws);
  if (const char* err = launched()) return err;
  if (decode_only) return nullptr;
  AppendAttentionArgs several = a;
  several.rows = RequestRows::kSeveral;
  return launch_segment_rows<T>(several, true, stream);
}

// batch_invariant: every token through the prefill kernels (decode rows too; SWA heads walk the whole
// row and mask), so a row's sums never depend on the step's other rows. A decode-only step (one query
// a request, `group` real rows a block) takes the DSPLIT form, whose rows have the row-split form's
// bits (tests/kernels/test_append_attention_deterministic_gpu.py): its four warps all compute, where
// the row-split form's 128-row block has one warp with real rows. PADDLE_MLA_GQA_DSPLIT=0: off (A/B).
// With a.invariant_split > 0 the tensor-core forms cut every row into fixed key segments
// (append_attention_segments.cuh): the one-token rows of any step then split over blocks by segment
// (split-KV with a batch-invariant split) and segment_merge_kernel folds them; the other rows fold in
// the row-split block (a second O, in registers or local memory). Both give a row the same bits.
template <typename T, int VB, int DPL>
const char* launch_invariant(const AppendAttentionArgs& a, bool decode_only, float* ws, int64_t ws_floats,
                             cudaStream_t stream) {
  AppendAttentionArgs walk_all = a;
  walk_all.swa_mask = true;
  if constexpr (sizeof(T) == 2) {
    if (tensor_cores_ok<T>(a, 128, "PADDLE_MLA_GQA_PREFILL_TC")) {
      const bool dsplit = a.num_q_heads / a.num_kv_heads <= 16 && dsplit_head_dim(a.head_dim) &&
                          tensor_cores_ok<T>(a, 128, "PADDLE_MLA_GQA_DSPLIT");
      if (a.invariant_split > 0 && prefill_tc_head_dim(a.head_dim))  // else no segments, on every path
        return launch_segments<T>(walk_all, dsplit, decode_only, ws, ws_floats, stream);
      if (dsplit && decode_only) return launch_dsplit<T, false>(walk_all, stream);
    }
  }
  return launch_prefill_any<T, VB, DPL>(walk_all, stream);
}

template <typename T, int VB, int DPL>
const char* launch_all(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, bool decode_only,
                       cudaStream_t stream) {
  rope_write_kernel<T><<<static_cast<unsigned>(a.num_tokens), 128, 0, stream>>>(a);
  if (const char* err = launched()) return err;
  if (a.batch == 0) return nullptr;
  if (a.batch_invariant) return launch_invariant<T, VB, DPL>(a, decode_only, ws, ws_floats, stream);
  const char* err = launch_decode_any<T, VB, DPL>(a, ws, ws_floats, stream);
  if (err != nullptr || decode_only) return err;
  return launch_prefill_any<T, VB, DPL>(a, stream);
}

template <typename T, int VB>
const char* by_head_dim(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, bool decode_only,
                        cudaStream_t stream) {
  if (a.head_dim <= 64) return launch_all<T, VB, 2>(a, ws, ws_floats, decode_only, stream);
  if (a.head_dim <= 128) return launch_all<T, VB, 4>(a, ws, ws_floats, decode_only, stream);
  return launch_all<T, VB, 8>(a, ws, ws_floats, decode_only, stream);
}

template <typename T>
const char* by_vector(const AppendAttentionArgs& a, float* ws, int64_t ws_floats, bool decode_only,
                      cudaStream_t stream) {
  const int64_t bytes = a.head_dim * static_cast<int64_t>(sizeof(T));
  if (bytes % 16 == 0) return by_head_dim<T, 16>(a, ws, ws_floats, decode_only, stream);
  return by_head_dim<T, 4>(a, ws, ws_floats, decode_only, stream);
}

}  // namespace

const char* append_attention_cuda(const AppendAttentionArgs& a, float* workspace, int64_t workspace_floats,
                                  bool decode_only, void* stream) {
  if (a.num_tokens == 0) return nullptr;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  if (a.head_dim > 256) return "append_attention_cuda: head_dim > 256 is not supported";
  if (group > attn::kPrefillBlockRows) return "append_attention_cuda: more than 32 query heads per KV head";
  const int64_t es = a.dtype == AttnDtype::kFloat32 ? 4 : 2;
  if ((a.head_dim * es) % 4 != 0) return "append_attention_cuda: head_dim * element size must be a multiple of 4";
  const auto st = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case AttnDtype::kFloat32: return by_vector<float>(a, workspace, workspace_floats, decode_only, st);
    case AttnDtype::kBFloat16: return by_vector<__nv_bfloat16>(a, workspace, workspace_floats, decode_only, st);
    case AttnDtype::kFloat16: return by_vector<__half>(a, workspace, workspace_floats, decode_only, st);
  }
  return "append_attention_cuda: unknown dtype";
}

}  // namespace paddle_mla
