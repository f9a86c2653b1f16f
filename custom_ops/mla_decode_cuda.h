// mla_decode, absorbed-MLA paged decode for SM90: the arguments, their checks (plain C++, shared by
// the torch and Paddle bindings) and the CUDA launcher's declaration (definition: mla_decode_kernels.cu).
//
// One query token per row: q [batch, H, 576] (kv_lora 512 then rope 64), the bf16 latent cache
// [num_blocks, page, 1, 576] read through block_tables, out [batch, H, 512]. Work is split by the
// per-step plan that paddle_mla/attention/triton_mla/decode_plan.py builds on the GPU (a persistent
// grid of `programs` programs per head block, each taking `tiles_per_prog` consecutive key tiles of
// `block_n` tokens across request boundaries): a request touched by one program gets its output
// written directly, the others leave fp32 partials and their log2-sum-exp, which the combine kernel
// merges in split order (deterministic). Every launch size comes from shapes and the config, never
// from device values, and nothing is allocated: the launch is CUDA-graph capturable.
#pragma once

#include <cstdint>

namespace paddle_mla {

constexpr int64_t kMlaLatentDim = 512;  // kv_lora_rank: the value width
constexpr int64_t kMlaKeyDim = 576;     // kv_lora_rank + qk_rope_head_dim

struct MlaDecodeArgs {
  const void* q;  // bf16 [batch, H, 576], last dim packed
  int64_t q_stride_b, q_stride_h;
  const void* kv_cache;  // bf16 [num_blocks, page, 1, 576], last dim packed
  int64_t kv_stride_block, kv_stride_token;
  const int32_t* block_tables;  // [>= batch, max_blocks]
  int64_t bt_stride;
  const int32_t* seq_lens;        // [>= batch]
  const int32_t* num_splits;      // the plan: [>= batch]
  const int32_t* cu_tiles;        // [>= batch + 1]
  const int32_t* split_start;     // [>= batch + 1]
  const int32_t* tiles_per_prog;  // [1]
  void* out;  // bf16 [batch, H, 512], last dim packed
  int64_t out_stride_b, out_stride_h;
  float* partial_out;  // fp32 [rows, >= H, 512]
  int64_t po_stride_row, po_stride_head;
  float* partial_lse;  // fp32 [rows, >= H, ...] (log2 domain; slot 0 is used)
  int64_t lse_stride_row, lse_stride_head;
  int64_t batch, num_heads, page_size;
  // launch config (paddle_mla/ops/mla_decode.py, launch_config): 16 * row_blocks heads per program,
  // col_splits warps share each 16-head row block (splitting QK's depth and the value columns)
  int64_t programs, block_n, row_blocks, col_splits, stages;
  float softmax_scale;
};

// nullptr when the arguments are consistent, else what is wrong.
inline const char* check_mla_decode_args(const MlaDecodeArgs& a) {
  if (a.batch < 0 || a.num_heads < 1) return "batch must be >= 0 and num_heads >= 1";
  if (a.page_size < 1) return "page size must be positive";
  if (a.programs < 1) return "programs must be positive";
  if (a.num_heads > 16 * a.row_blocks * 65535) return "too many heads";
  return nullptr;
}

// Launches the split kernel and the combine kernel on `stream` (cudaStream_t as void*); returns
// nullptr, or the error text (an unsupported config included).
const char* mla_decode_cuda(const MlaDecodeArgs& a, void* stream);

}  // namespace paddle_mla
