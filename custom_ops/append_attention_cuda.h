// append_attention, CUDA launcher: declaration only, so the framework bindings (plain C++) need no
// CUDA header. Definition: append_attention_kernels.cu.
//
// Enqueues the rope + cache-write kernel, then the attention kernels, on `stream` (the framework's
// cudaStream_t as void*), without synchronising or allocating: CUDA-graph capturable. Every launch
// parameter depends only on shapes (batch, heads, head_dim, max_blocks, block_size), the dtype and
// the workspace size, never on device values, so a captured decode step replays for any lengths.
// `workspace` (fp32, `workspace_floats` elements, preallocated by the caller) holds the split-KV
// partial outputs of decode rows; `decode_only` (every request has exactly one new token) skips the
// prefill kernel's launch. Returns nullptr, or the error text.
#pragma once

#include <cstdint>

#include "append_attention_common.h"

namespace paddle_mla {

const char* append_attention_cuda(const AppendAttentionArgs& a, float* workspace, int64_t workspace_floats,
                                  bool decode_only, void* stream);

// fp32 elements of workspace the decode path can use for a batch of `batch` rows (at most
// kMaxDecodeSplits splits): the caller preallocates this for max_num_seqs.
inline int64_t append_attention_workspace_floats(int64_t batch, int64_t num_q_heads, int64_t head_dim,
                                                 int64_t max_splits) {
  return batch * num_q_heads * max_splits * (head_dim + 1);
}

}  // namespace paddle_mla
