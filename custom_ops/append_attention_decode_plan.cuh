// append_attention, CUDA launcher helpers of append_attention_kernels.cu (its only includer): the
// decode split plan (decode_plan, from shapes only), the merge of the splits' partials and the K/V
// tile row pitch (launch errors and shared memory: cuda_launch.cuh). Framework-neutral (nvcc alone compiles it).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "append_attention_common.h"
#include "append_attention_device.cuh"
#include "cuda_launch.cuh"

namespace paddle_mla {
namespace {

constexpr int kEqualMaxSplits = 16;    // == MAX_DECODE_SPLITS in paddle_mla/ops/append_attention.py (the workspace's)
constexpr int kMaxDecodeSplits = 128;  // splits sized by length (the default plan), where the workspace holds them

// One block per (decode row, query head). The split weights 2^(lse - max) are computed once into shared
// memory (warp 0, a fixed shuffle order), then each thread sums its dims over the splits with loads that
// do not wait on each other: a serial walk that tests each split's lse before reading its partial costs
// a memory latency per split, which at a hundred splits is longer than the decode itself. A split that
// saw no key has weight 0 and its partial (never written) is not used.
template <typename T>
__global__ void merge_kernel(AppendAttentionArgs a, int splits, const float* ws_o, const float* ws_lse) {
  __shared__ float weight[kMaxDecodeSplits];
  __shared__ float total;
  __shared__ int used;  // splits up to the last that saw a key (later ones exited on an empty range)
  const int64_t b = blockIdx.x, h = blockIdx.y;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;
  const int64_t row = b * a.num_q_heads + h;
  const float* lse = ws_lse + row * splits;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) {
    float mx = -INFINITY;
    for (int s = tid; s < splits; s += 32) mx = fmaxf(mx, lse[s]);
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    int last = -1;
    for (int s = tid; s < splits; s += 32) {
      const float x = lse[s];
      const float f = x == -INFINITY ? 0.0f : exp2f(x - mx);
      weight[s] = f;
      sum += f;
      if (f != 0.0f) last = s;
    }
    for (int o = 16; o > 0; o /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
      last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    }
    if (tid == 0) {
      total = sum;
      used = last + 1;
    }
  }
  __syncthreads();
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const float* po = ws_o + row * splits * a.head_dim;
  for (int64_t d = tid; d < a.head_dim; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < used; ++s) {
      const float v = po[s * a.head_dim + d];
      const float f = weight[s];
      o += f != 0.0f ? f * v : 0.0f;
    }
    static_cast<T*>(a.out)[(t0 * a.num_q_heads + h) * a.head_dim + d] = attn::from_f<T>(o * inv);
  }
}

// Row pitch of a K/V tile row: VB-byte vectors of consecutive lanes fall in distinct banks.
template <typename T, int VB>
int tile_row_bytes(int64_t head_dim) {
  const int bytes = static_cast<int>(head_dim * sizeof(T));
  if (VB == 16) return bytes + 16;
  return bytes + ((bytes / 4) % 2 == 0 ? 4 : 0);
}

// A decode launch's split plan from shapes only (CUDA-graph replayable): `splits` is the grid's z, the
// most splits one (row, KV head) may take. Two plans:
// - by length (the default): one split size for the launch from the decode rows' visible keys
//   (decode_split_keys): their total over `target` splits, `target` two waves of the blocks the GPU
//   holds at once (`kernel`'s occupancy), but a split at least min(kSplitFloorKeys, 4 x that share).
//   z is sized for the heads that read whole rows (with SWA heads skipping, the full heads alone), at
//   most kMaxDecodeSplits. An SWA head's short row then takes few splits and frees its SMs for the full
//   heads' splits.
// - equal (PADDLE_MLA_GQA_SPLITS=equal, read per call): every (row, KV head) in `splits` equal parts,
//   z for 4 blocks an SM over every head, at most 16 (`target` 0 tells decode_split_keys).
// Both take at most one split per 256 keys of the longest row and what the workspace holds.
// Why the floor: a split has a fixed cost (Q load and rope, pipeline fill, partial write) worth
// several tiles; two waves of 4-tile splits over 3 rows of 32k ran 92 µs where 16-tile ones ran 73
// (H200, ERNIE-4.5 heads, BENCHMARKS.md "Head-wise SWA"); with many rows the share is past the floor
// and two full waves keep the last one from running half empty (64 rows of 16k: 92% of copy, 77% in one wave).
struct DecodePlan {
  int splits, target;
};

static bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

template <typename K>
DecodePlan decode_plan(const AppendAttentionArgs& a, K kernel, int threads, size_t smem, int hchunks,
                       int64_t ws_floats) {
  const int64_t per_split_floats = a.batch * a.num_q_heads * (a.head_dim + 1);
  const int64_t ws_splits = per_split_floats > 0 ? ws_floats / per_split_floats : 0;
  const int64_t width = a.max_blocks * a.block_size;  // the longest row's keys, at most
  if (env_is("PADDLE_MLA_GQA_SPLITS", "equal")) {
    const int64_t blocks = std::max<int64_t>(1, a.batch * a.num_kv_heads * hchunks);
    int64_t splits = (4 * sm_count() + blocks - 1) / blocks;
    splits = std::min<int64_t>(std::min<int64_t>(splits, (width + 255) / 256), ws_splits);
    return {static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(splits, kEqualMaxSplits))), 0};
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  const int64_t target = std::max<int64_t>(1, 2 * static_cast<int64_t>(per_sm) * sm_count() / hchunks);
  const bool skipping = a.num_swa_heads > 0 && !a.swa_mask && a.num_swa_heads < a.num_kv_heads;
  const int64_t long_heads = skipping ? a.num_kv_heads - a.num_swa_heads : a.num_kv_heads;
  const int64_t rows = std::max<int64_t>(1, a.batch * long_heads);
  // a split is no shorter than 256 keys nor than the device's floor for the most keys these shapes
  // hold (its floor for the step's keys is at most that, and it fits the longest row in z splits)
  const int64_t min_split = std::max<int64_t>(256, attn::split_floor_keys(a.batch * a.num_kv_heads * width, target));
  int64_t splits = (target + rows - 1) / rows;
  splits = std::min<int64_t>(splits, (width + min_split - 1) / min_split);
  splits = std::min<int64_t>(splits, ws_splits);
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, kMaxDecodeSplits));
  return {static_cast<int>(splits), static_cast<int>(std::min<int64_t>(target, 1 << 30))};
}

// Combines the splits' partials (nothing to do for one split: the kernel wrote the output).
template <typename T>
const char* launch_merge(const AppendAttentionArgs& a, int splits, const float* ws_o, const float* ws_lse,
                         cudaStream_t stream) {
  if (splits == 1) return nullptr;
  merge_kernel<T><<<dim3(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.num_q_heads)), 128, 0, stream>>>(
      a, splits, ws_o, ws_lse);
  return launched();
}

}  // namespace
}  // namespace paddle_mla
