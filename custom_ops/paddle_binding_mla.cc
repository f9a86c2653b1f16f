// Paddle custom operator pmla_mla_decode over the framework-neutral launcher (mla_decode_cuda.h).
// Same library as paddle_binding.cc. out, partial_out and partial_lse are updated in place
// (SetInplaceMap); the Python wrapper returns `out`. GPU tensors only: a CPU build refuses calls.
#include <vector>

#include "mla_decode_cuda.h"
#include "paddle/extension.h"

namespace {

using paddle::DataType;

void MlaDecode(const paddle::Tensor& q, const paddle::Tensor& kv_cache, const paddle::Tensor& block_tables,
               const paddle::Tensor& seq_lens, const paddle::Tensor& num_splits, const paddle::Tensor& cu_tiles,
               const paddle::Tensor& split_start, const paddle::Tensor& tiles_per_prog, paddle::Tensor& out,
               paddle::Tensor& partial_out, paddle::Tensor& partial_lse, int64_t batch, float softmax_scale,
               int64_t programs, int64_t block_n, int64_t row_blocks, int64_t col_splits, int64_t stages) {
  const char* op = "pmla_mla_decode";
  const auto qs = q.shape(), ks = kv_cache.shape(), os = out.shape();
  PD_CHECK(qs.size() == 3 && qs[2] == paddle_mla::kMlaKeyDim && q.strides()[2] == 1, op,
           ": q must be [B, H, 576] with a packed last dim");
  PD_CHECK(ks.size() == 4 && ks[2] == 1 && ks[3] == paddle_mla::kMlaKeyDim && kv_cache.strides()[3] == 1, op,
           ": kv_cache must be [num_blocks, page, 1, 576] with a packed last dim");
  PD_CHECK(os.size() == 3 && os[2] == paddle_mla::kMlaLatentDim && out.strides()[2] == 1 && os[1] == qs[1], op,
           ": out must be [B, H, 512] with a packed last dim");
  PD_CHECK(q.dtype() == DataType::BFLOAT16 && kv_cache.dtype() == DataType::BFLOAT16 &&
               out.dtype() == DataType::BFLOAT16,
           op, ": q, kv_cache and out must be bf16");
  for (const paddle::Tensor* t : {&seq_lens, &num_splits, &cu_tiles, &split_start, &tiles_per_prog})
    PD_CHECK(t->dtype() == DataType::INT32 && t->is_contiguous(), op, ": the lengths and plan must be int32, contiguous");
  const auto bts = block_tables.shape(), pos = partial_out.shape(), ls = partial_lse.shape();
  PD_CHECK(block_tables.dtype() == DataType::INT32 && bts.size() == 2 && block_tables.strides()[1] == 1, op,
           ": block_tables must be int32 [B, max_blocks] with a packed last dim");
  PD_CHECK(bts.size() == 2 && bts[0] >= batch && seq_lens.numel() >= batch && cu_tiles.numel() >= batch + 1 &&
               split_start.numel() >= batch + 1 && qs[0] >= batch && os[0] >= batch,
           op, ": fewer rows than batch");
  PD_CHECK(partial_out.dtype() == DataType::FLOAT32 && partial_lse.dtype() == DataType::FLOAT32 && pos.size() == 3 &&
               ls.size() == 3 && pos[2] == paddle_mla::kMlaLatentDim && pos[1] >= qs[1] && ls[1] >= qs[1],
           op, ": partial_out must be fp32 [rows, >= H, 512], partial_lse fp32 [rows, >= H, k]");
  paddle_mla::MlaDecodeArgs a{};
  a.q = q.data();
  a.q_stride_b = q.strides()[0];
  a.q_stride_h = q.strides()[1];
  a.kv_cache = kv_cache.data();
  a.kv_stride_block = kv_cache.strides()[0];
  a.kv_stride_token = kv_cache.strides()[1];
  a.block_tables = block_tables.data<int32_t>();
  a.bt_stride = block_tables.strides()[0];
  a.seq_lens = seq_lens.data<int32_t>();
  a.num_splits = num_splits.data<int32_t>();
  a.cu_tiles = cu_tiles.data<int32_t>();
  a.split_start = split_start.data<int32_t>();
  a.tiles_per_prog = tiles_per_prog.data<int32_t>();
  a.out = out.data();
  a.out_stride_b = out.strides()[0];
  a.out_stride_h = out.strides()[1];
  a.partial_out = partial_out.data<float>();
  a.po_stride_row = partial_out.strides()[0];
  a.po_stride_head = partial_out.strides()[1];
  a.partial_lse = partial_lse.data<float>();
  a.lse_stride_row = partial_lse.strides()[0];
  a.lse_stride_head = partial_lse.strides()[1];
  a.batch = batch;
  a.num_heads = qs[1];
  a.page_size = ks[1];
  a.programs = programs;
  a.block_n = block_n;
  a.row_blocks = row_blocks;
  a.col_splits = col_splits;
  a.stages = stages;
  a.softmax_scale = softmax_scale;
  const char* bad = paddle_mla::check_mla_decode_args(a);
  PD_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
#ifdef PADDLE_MLA_WITH_CUDA
  PD_CHECK(q.is_gpu() && kv_cache.is_gpu() && out.is_gpu(), op, ": GPU tensors expected");
  const char* err = paddle_mla::mla_decode_cuda(a, static_cast<void*>(q.stream()));
  PD_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  PD_CHECK(false, op, ": this build has no CUDA kernels");
#endif
}

}  // namespace

PD_BUILD_OP(pmla_mla_decode)
    .Inputs({"q", "kv_cache", "block_tables", "seq_lens", "num_splits", "cu_tiles", "split_start", "tiles_per_prog",
             "out", "partial_out", "partial_lse"})
    .Outputs({"out_out", "partial_out_out", "partial_lse_out"})
    .SetInplaceMap({{"out", "out_out"}, {"partial_out", "partial_out_out"}, {"partial_lse", "partial_lse_out"}})
    .Attrs({"batch: int64_t", "softmax_scale: float", "programs: int64_t", "block_n: int64_t", "row_blocks: int64_t",
            "col_splits: int64_t", "stages: int64_t"})
    .SetKernelFn(PD_KERNEL(MlaDecode));
