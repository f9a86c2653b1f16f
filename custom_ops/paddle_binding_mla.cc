// Paddle custom operators pmla_mla_decode and pmla_mla_sparse over the framework-neutral launchers
// (mla_decode_cuda.h, mla_sparse_cuda.h).
// Same library as paddle_binding.cc. out, partial_out and partial_lse are updated in place
// (SetInplaceMap); the Python wrapper returns `out`. GPU tensors only: a CPU build refuses calls.
#include <vector>

#include "mla_decode_cuda.h"
#include "mla_sparse_cuda.h"
#include "paddle/extension.h"

namespace {

using paddle::DataType;

paddle_mla::MlaTensor view(const paddle::Tensor& x) {
  const auto dt = x.dtype();
  const auto elem = dt == DataType::BFLOAT16        ? paddle_mla::MlaElem::kBF16
                    : dt == DataType::FLOAT8_E4M3FN ? paddle_mla::MlaElem::kFP8
                    : dt == DataType::FLOAT32       ? paddle_mla::MlaElem::kFP32
                    : dt == DataType::INT32   ? paddle_mla::MlaElem::kINT32
                    : dt == DataType::INT64   ? paddle_mla::MlaElem::kINT64
                                              : paddle_mla::MlaElem::kOther;
  const auto shape = x.shape();
  const auto strides = x.strides();
  return paddle_mla::mla_tensor(x.data(), elem, static_cast<int>(shape.size()), [&](int i) { return shape[i]; },
                                [&](int i) { return strides[i]; }, x.numel(), x.is_contiguous());
}

void MlaDecode(const paddle::Tensor& q, const paddle::Tensor& kv_cache, const paddle::Tensor& block_tables,
               const paddle::Tensor& seq_lens, const paddle::Tensor& num_splits, const paddle::Tensor& cu_tiles,
               const paddle::Tensor& split_start, const paddle::Tensor& tiles_per_prog, paddle::Tensor& out,
               paddle::Tensor& partial_out, paddle::Tensor& partial_lse, int64_t batch, float softmax_scale,
               int64_t programs, int64_t block_n, int64_t row_blocks, int64_t col_splits, int64_t stages) {
  const char* op = "pmla_mla_decode";
  const paddle_mla::MlaDecodeTensors t{view(q), view(kv_cache), view(block_tables), view(seq_lens), view(num_splits),
                                       view(cu_tiles), view(split_start), view(tiles_per_prog), view(out),
                                       view(partial_out), view(partial_lse)};
  paddle_mla::MlaDecodeArgs a{};
  const char* bad = paddle_mla::mla_decode_args(
      t, {batch, programs, block_n, row_blocks, col_splits, stages, softmax_scale}, &a);
  PD_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
#ifdef PADDLE_MLA_WITH_CUDA
  PD_CHECK(q.is_gpu() && kv_cache.is_gpu() && out.is_gpu(), op, ": GPU tensors expected");
  const char* err = paddle_mla::mla_decode_cuda(a, static_cast<void*>(q.stream()));
  PD_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  PD_CHECK(false, op, ": this build has no CUDA kernels");
#endif
}

void MlaSparse(const paddle::Tensor& q_lat, const paddle::Tensor& q_pe, const paddle::Tensor& kv_cache,
               const paddle::Tensor& slots, paddle::Tensor& out, paddle::Tensor& part_o, paddle::Tensor& part_lse,
               int64_t rows, int64_t num_splits, int64_t split_len, float softmax_scale) {
  const char* op = "pmla_mla_sparse";
  const paddle_mla::MlaSparseTensors t{view(q_lat), view(q_pe), view(kv_cache), view(slots),
                                       view(out),   view(part_o), view(part_lse)};
  paddle_mla::MlaSparseArgs a{};
  const char* bad = paddle_mla::mla_sparse_args(t, {rows, num_splits, split_len, softmax_scale}, &a);
  PD_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
#ifdef PADDLE_MLA_WITH_CUDA
  PD_CHECK(q_lat.is_gpu() && q_pe.is_gpu() && kv_cache.is_gpu() && slots.is_gpu() && out.is_gpu() && part_o.is_gpu() &&
               part_lse.is_gpu(),
           op, ": GPU tensors expected");
  const char* err = paddle_mla::mla_sparse_cuda(a, static_cast<void*>(q_lat.stream()));
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

PD_BUILD_OP(pmla_mla_sparse)
    .Inputs({"q_lat", "q_pe", "kv_cache", "slots", "out", "part_o", "part_lse"})
    .Outputs({"out_out", "part_o_out", "part_lse_out"})
    .SetInplaceMap({{"out", "out_out"}, {"part_o", "part_o_out"}, {"part_lse", "part_lse_out"}})
    .Attrs({"rows: int64_t", "num_splits: int64_t", "split_len: int64_t", "softmax_scale: float"})
    .SetKernelFn(PD_KERNEL(MlaSparse));
