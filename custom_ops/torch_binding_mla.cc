// torch.library operators paddle_mla::mla_decode and paddle_mla::mla_sparse over the framework-neutral launcher
// (mla_decode_cuda.h, mla_sparse_cuda.h). Same library as torch_binding.cc (a fragment of its namespace). It writes
// `out` (and the partial workspace) in place and returns nothing; the Python wrapper
// (paddle_mla/ops/mla_decode.py) returns `out`. GPU tensors only: a CPU build registers the schema
// and refuses calls.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "mla_decode_cuda.h"
#include "mla_sparse_cuda.h"

#ifdef PADDLE_MLA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace {

paddle_mla::MlaTensor view(const at::Tensor& x) {
  const auto st = x.scalar_type();
  const auto elem = st == at::kBFloat16         ? paddle_mla::MlaElem::kBF16
                    : st == at::kFloat8_e4m3fn ? paddle_mla::MlaElem::kFP8
                    : st == at::kFloat         ? paddle_mla::MlaElem::kFP32
                    : st == at::kInt    ? paddle_mla::MlaElem::kINT32
                    : st == at::kLong   ? paddle_mla::MlaElem::kINT64
                                        : paddle_mla::MlaElem::kOther;
  return paddle_mla::mla_tensor(x.data_ptr(), elem, static_cast<int>(x.dim()), [&](int i) { return x.size(i); },
                                [&](int i) { return x.stride(i); }, x.numel(), x.is_contiguous());
}

void mla_decode(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                const at::Tensor& seq_lens, const at::Tensor& num_splits, const at::Tensor& cu_tiles,
                const at::Tensor& split_start, const at::Tensor& tiles_per_prog, at::Tensor& out,
                at::Tensor& partial_out, at::Tensor& partial_lse, int64_t batch, double softmax_scale,
                int64_t programs, int64_t block_n, int64_t row_blocks, int64_t col_splits, int64_t stages) {
  const char* op = "paddle_mla::mla_decode";
  const paddle_mla::MlaDecodeTensors t{view(q), view(kv_cache), view(block_tables), view(seq_lens), view(num_splits),
                                       view(cu_tiles), view(split_start), view(tiles_per_prog), view(out),
                                       view(partial_out), view(partial_lse)};
  paddle_mla::MlaDecodeArgs a{};
  const char* bad = paddle_mla::mla_decode_args(
      t, {batch, programs, block_n, row_blocks, col_splits, stages, static_cast<float>(softmax_scale)}, &a);
  TORCH_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
#ifdef PADDLE_MLA_WITH_CUDA
  TORCH_CHECK(q.is_cuda() && kv_cache.is_cuda() && out.is_cuda(), op, ": CUDA tensors expected");
  const c10::cuda::CUDAGuard guard(q.device());
  const char* err = paddle_mla::mla_decode_cuda(a, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  TORCH_CHECK(false, op, ": this build has no CUDA kernels");
#endif
}

void mla_sparse(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& kv_cache, const at::Tensor& slots,
                at::Tensor& out, at::Tensor& part_o, at::Tensor& part_lse, int64_t rows, int64_t num_splits,
                int64_t split_len, double softmax_scale) {
  const char* op = "paddle_mla::mla_sparse";
  const paddle_mla::MlaSparseTensors t{view(q_lat), view(q_pe), view(kv_cache), view(slots),
                                       view(out),   view(part_o), view(part_lse)};
  paddle_mla::MlaSparseArgs a{};
  const char* bad =
      paddle_mla::mla_sparse_args(t, {rows, num_splits, split_len, static_cast<float>(softmax_scale)}, &a);
  TORCH_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
#ifdef PADDLE_MLA_WITH_CUDA
  TORCH_CHECK(q_lat.is_cuda() && q_pe.is_cuda() && kv_cache.is_cuda() && slots.is_cuda() && out.is_cuda() &&
                  part_o.is_cuda() && part_lse.is_cuda(),
              op, ": CUDA tensors expected");
  const c10::cuda::CUDAGuard guard(q_lat.device());
  const char* err = paddle_mla::mla_sparse_cuda(a, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  TORCH_CHECK(false, op, ": this build has no CUDA kernels");
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(paddle_mla, m) {
  m.def("mla_decode(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, Tensor num_splits, "
        "Tensor cu_tiles, Tensor split_start, Tensor tiles_per_prog, Tensor(a!) out, Tensor(b!) partial_out, "
        "Tensor(c!) partial_lse, int batch, float softmax_scale, int programs, int block_n, int row_blocks, "
        "int col_splits, int stages) -> ()");
  m.def("mla_sparse(Tensor q_lat, Tensor q_pe, Tensor kv_cache, Tensor slots, Tensor(a!) out, Tensor(b!) part_o, "
        "Tensor(c!) part_lse, int rows, int num_splits, int split_len, float softmax_scale) -> ()");
}

TORCH_LIBRARY_IMPL(paddle_mla, CPU, m) {
  m.impl("mla_decode", &mla_decode);
  m.impl("mla_sparse", &mla_sparse);
}

#ifdef PADDLE_MLA_WITH_CUDA
TORCH_LIBRARY_IMPL(paddle_mla, CUDA, m) {
  m.impl("mla_decode", &mla_decode);
  m.impl("mla_sparse", &mla_sparse);
}
#endif
