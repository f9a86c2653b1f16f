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
constexpr int kMaxDecodeSplits = 128;  // splits sized by length (PADDLE_MLA_GQA_SPLITS=length), where the workspace holds them

template <typename T>
__global__ void merge_kernel(AppendAttentionArgs a, int splits, const float* ws_o, const float* ws_lse) {
  const int64_t b = blockIdx.x, h = blockIdx.y;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;
  const int64_t row = b * a.num_q_heads + h;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ws_lse[row * splits + s]);
  for (int64_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float l = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float lse = ws_lse[row * splits + s];
        if (lse == -INFINITY) continue;
        const float f = exp2f(lse - mx);
        l += f;
        o += f * ws_o[(row * splits + s) * a.head_dim + d];
      }
    }
    static_cast<T*>(a.out)[(t0 * a.num_q_heads + h) * a.head_dim + d] = attn::from_f<T>(l > 0.0f ? o / l : 0.0f);
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
// - equal (the default): every (row, KV head) in `splits` equal parts, z for 4 blocks an SM over every
//   head, at most 16 (`target` 0 tells decode_split_keys).
// - by length (PADDLE_MLA_GQA_SPLITS=length, read per call): one split size for the launch, the
//   decode rows' visible keys over `target` splits (decode_split_keys), `target` two waves of the
//   blocks the GPU holds at once (`kernel`'s occupancy), z sized for the heads that read whole rows
//   (with SWA heads skipping, the full heads alone), at most kMaxDecodeSplits.
// Both take at most one split per 256 keys of the longest row and what the workspace holds. On an
// H200 (BENCHMARKS.md, "Head-wise SWA") by length was faster where equal splits leave a half-empty
// last wave (8 rows of 32k, ERNIE-4.5 heads: 178 vs 204 µs) and slower where it cuts 2-3 rows into
// short splits (3 rows: 112 vs 92 µs; a split's fixed cost then outweighs the balance), so equal
// stays the default. Shared by every decode kernel.
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
  if (!env_is("PADDLE_MLA_GQA_SPLITS", "length")) {
    const int64_t blocks = std::max<int64_t>(1, a.batch * a.num_kv_heads * hchunks);
    int64_t splits = (4 * sm_count() + blocks - 1) / blocks;
    splits = std::min<int64_t>(std::min<int64_t>(splits, (a.max_blocks * a.block_size + 255) / 256), ws_splits);
    return {static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(splits, kEqualMaxSplits))), 0};
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  const int64_t target = std::max<int64_t>(1, 2 * static_cast<int64_t>(per_sm) * sm_count() / hchunks);
  const bool skipping = a.num_swa_heads > 0 && !a.swa_mask && a.num_swa_heads < a.num_kv_heads;
  const int64_t long_heads = skipping ? a.num_kv_heads - a.num_swa_heads : a.num_kv_heads;
  const int64_t rows = std::max<int64_t>(1, a.batch * long_heads);
  int64_t splits = (target + rows - 1) / rows;
  splits = std::min<int64_t>(splits, (a.max_blocks * a.block_size + 255) / 256);
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
