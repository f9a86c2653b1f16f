// mla_decode, absorbed-MLA paged decode for SM90: the arguments, their one validation (plain C++,
// shared by the torch and Paddle bindings, which only describe their tensors as MlaTensor) and the
// CUDA launcher's declaration (definition: mla_decode_kernels.cu).
//
// One query token per row: q [batch, H, 576] (kv_lora 512 then rope 64), the latent cache read through
// block_tables, out [batch, H, 512]. The cache is bf16 [num_blocks, page, 1, 576] or FP8 rows
// [num_blocks, page, 1, 592] (paddle_mla/cache/fp8_latent.py: 576 e4m3 values, the fp32 scale, zeros;
// the warpgroup kernel only). Work is split by the
// per-step plan that paddle_mla/attention/triton_mla/decode_plan.py builds on the GPU: windows of
// `tiles_per_prog` consecutive key tiles of `block_n` tokens across request boundaries, taken by a
// persistent grid of `programs` programs per head block in strides of the grid (the balanced plan
// has one window a program; the batch-invariant one has windows from each row's start). A request
// inside one window gets its output written directly, the others leave fp32 partials and their
// log2-sum-exp, which the combine kernel merges in split order (deterministic). Every launch size
// comes from shapes and the config, never from device values, and nothing is allocated: the launch
// is CUDA-graph capturable.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace paddle_mla {

constexpr int64_t kMlaLatentDim = 512;  // kv_lora_rank: the value width
constexpr int64_t kMlaKeyDim = 576;     // kv_lora_rank + qk_rope_head_dim
constexpr int64_t kMlaFp8Row = 592;     // bytes of an FP8 cache row: 576 e4m3 values, the fp32 scale, zeros
static_assert(kMlaFp8Row == (kMlaKeyDim + 4 + 15) / 16 * 16, "the FP8 row: values, scale, zeros to 16 bytes");

struct MlaDecodeArgs {
  const void* q;  // bf16 [q_rows >= batch, H, 576], last dim packed
  int64_t q_stride_b, q_stride_h, q_rows;
  const void* kv_cache;  // bf16 [num_blocks, page, 1, 576] or FP8 rows [..., 592], last dim packed
  int64_t kv_stride_block, kv_stride_token, kv_blocks;
  bool kv_fp8;  // the cache holds FP8 rows (strides in bytes then)
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

// The scalar checks of packed arguments (the launcher repeats them): nullptr, or what is wrong.
inline const char* check_mla_decode_args(const MlaDecodeArgs& a) {
  if (a.batch < 0 || a.num_heads < 1) return "batch must be >= 0 and num_heads >= 1";
  if (a.page_size < 1) return "page size must be positive";
  if (a.programs < 1) return "programs must be positive";
  // grid y of the split kernel (programs) and of the combine kernel (heads)
  if (a.programs > 65535 || a.num_heads > 65535) return "programs and num_heads must be <= 65535";
  return nullptr;
}

// A tensor as a binding sees it (torch or Paddle): element type, shape and strides in elements.
enum class MlaElem { kBF16, kFP8, kFP32, kINT32, kINT64, kOther };  // kFP8: float8 e4m3
struct MlaTensor {
  const void* data;
  MlaElem elem;
  int ndim;
  int64_t size[4], stride[4];  // the first ndim entries (ndim <= 4 for every tensor of the op)
  int64_t numel;
  bool contiguous;
};

// A binding's tensor as an MlaTensor: `size(i)` and `stride(i)` read its dims (the first 4 are kept).
template <typename Size, typename Stride>
MlaTensor mla_tensor(const void* data, MlaElem elem, int ndim, Size size, Stride stride, int64_t numel,
                     bool contiguous) {
  MlaTensor v{};
  v.data = data;
  v.elem = elem;
  v.ndim = ndim;
  for (int i = 0; i < ndim && i < 4; ++i) {
    v.size[i] = size(i);
    v.stride[i] = stride(i);
  }
  v.numel = numel;
  v.contiguous = contiguous;
  return v;
}

struct MlaDecodeTensors {
  MlaTensor q, kv_cache, block_tables, seq_lens, num_splits, cu_tiles, split_start, tiles_per_prog, out,
      partial_out, partial_lse;
};

struct MlaDecodeLaunchConfig {  // the op's scalar attributes
  int64_t batch, programs, block_n, row_blocks, col_splits, stages;
  float softmax_scale;
};

// The one validation of the op's inputs, shared by both bindings: nullptr and `*a` filled, or what
// is wrong (a has no meaning then).
inline const char* mla_decode_args(const MlaDecodeTensors& t, const MlaDecodeLaunchConfig& c, MlaDecodeArgs* a) {
  const MlaTensor &q = t.q, &kv = t.kv_cache, &bt = t.block_tables, &out = t.out, &po = t.partial_out,
                  &pl = t.partial_lse;
  if (q.ndim > 4 || kv.ndim > 4 || bt.ndim > 4 || out.ndim > 4 || po.ndim > 4 || pl.ndim > 4)
    return "a tensor has more than 4 dims";
  if (!(q.ndim == 3 && q.size[2] == kMlaKeyDim && q.stride[2] == 1)) return "q must be [B, H, 576] with a packed last dim";
  const bool fp8 = kv.elem == MlaElem::kFP8;
  if (!(kv.ndim == 4 && kv.size[2] == 1 && kv.size[3] == (fp8 ? kMlaFp8Row : kMlaKeyDim) && kv.stride[3] == 1))
    return "kv_cache must be [num_blocks, page, 1, 576] bf16 or [num_blocks, page, 1, 592] FP8 rows, last dim packed";
  if (!(out.ndim == 3 && out.size[2] == kMlaLatentDim && out.stride[2] == 1 && out.size[1] == q.size[1]))
    return "out must be [B, H, 512] with a packed last dim";
  if (q.elem != MlaElem::kBF16 || !(fp8 || kv.elem == MlaElem::kBF16) || out.elem != MlaElem::kBF16)
    return "q and out must be bf16, kv_cache bf16 or float8 e4m3";
  for (const MlaTensor* x : {&t.seq_lens, &t.num_splits, &t.cu_tiles, &t.split_start, &t.tiles_per_prog})
    if (x->elem != MlaElem::kINT32 || !x->contiguous) return "the lengths and plan must be int32, contiguous";
  if (!(bt.elem == MlaElem::kINT32 && bt.ndim == 2 && bt.stride[1] == 1))
    return "block_tables must be int32 [B, max_blocks] with a packed last dim";
  if (!(bt.size[0] >= c.batch && t.seq_lens.numel >= c.batch && t.num_splits.numel >= c.batch &&
        t.tiles_per_prog.numel >= 1 && t.cu_tiles.numel >= c.batch + 1 &&
        t.split_start.numel >= c.batch + 1 && q.size[0] >= c.batch && out.size[0] >= c.batch))
    return "fewer rows than batch";
  if (!(po.elem == MlaElem::kFP32 && pl.elem == MlaElem::kFP32 && po.ndim == 3 && pl.ndim == 3 &&
        po.size[2] == kMlaLatentDim && po.stride[2] == 1 && po.size[1] >= q.size[1] && pl.size[1] >= q.size[1]))
    return "partial_out must be fp32 [rows, >= H, 512], partial_lse fp32 [rows, >= H, k]";
  *a = MlaDecodeArgs{};
  a->q = q.data;
  a->q_stride_b = q.stride[0];
  a->q_stride_h = q.stride[1];
  a->q_rows = q.size[0];
  a->kv_cache = kv.data;
  a->kv_stride_block = kv.stride[0];
  a->kv_stride_token = kv.stride[1];
  a->kv_blocks = kv.size[0];
  a->kv_fp8 = fp8;
  a->block_tables = static_cast<const int32_t*>(bt.data);
  a->bt_stride = bt.stride[0];
  a->seq_lens = static_cast<const int32_t*>(t.seq_lens.data);
  a->num_splits = static_cast<const int32_t*>(t.num_splits.data);
  a->cu_tiles = static_cast<const int32_t*>(t.cu_tiles.data);
  a->split_start = static_cast<const int32_t*>(t.split_start.data);
  a->tiles_per_prog = static_cast<const int32_t*>(t.tiles_per_prog.data);
  a->out = const_cast<void*>(out.data);
  a->out_stride_b = out.stride[0];
  a->out_stride_h = out.stride[1];
  a->partial_out = static_cast<float*>(const_cast<void*>(po.data));
  a->po_stride_row = po.stride[0];
  a->po_stride_head = po.stride[1];
  a->partial_lse = static_cast<float*>(const_cast<void*>(pl.data));
  a->lse_stride_row = pl.stride[0];
  a->lse_stride_head = pl.stride[1];
  a->batch = c.batch;
  a->num_heads = q.size[1];
  a->page_size = kv.size[1];
  a->programs = c.programs;
  a->block_n = c.block_n;
  a->row_blocks = c.row_blocks;
  a->col_splits = c.col_splits;
  a->stages = c.stages;
  a->softmax_scale = c.softmax_scale;
  return check_mla_decode_args(*a);
}

// Launches the split kernel and the combine kernel on `stream` (cudaStream_t as void*); returns
// nullptr, or the error text (an unsupported config included).
const char* mla_decode_cuda(const MlaDecodeArgs& a, void* stream);

}  // namespace paddle_mla
