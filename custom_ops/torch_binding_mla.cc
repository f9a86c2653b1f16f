// torch.library operator paddle_mla::mla_decode over the framework-neutral launcher
// (mla_decode_cuda.h). Same library as torch_binding.cc (a fragment of its namespace). It writes
// `out` (and the partial workspace) in place and returns nothing; the Python wrapper
// (paddle_mla/ops/mla_decode.py) returns `out`. GPU tensors only: a CPU build registers the schema
// and refuses calls.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "mla_decode_cuda.h"

#ifdef PADDLE_MLA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace {

void mla_decode(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                const at::Tensor& seq_lens, const at::Tensor& num_splits, const at::Tensor& cu_tiles,
                const at::Tensor& split_start, const at::Tensor& tiles_per_prog, at::Tensor& out,
                at::Tensor& partial_out, at::Tensor& partial_lse, int64_t batch, double softmax_scale,
                int64_t programs, int64_t block_n, int64_t row_blocks, int64_t col_splits, int64_t stages) {
  const char* op = "paddle_mla::mla_decode";
  TORCH_CHECK(q.dim() == 3 && q.size(2) == paddle_mla::kMlaKeyDim && q.stride(2) == 1, op,
              ": q must be [B, H, 576] with a packed last dim");
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(2) == 1 && kv_cache.size(3) == paddle_mla::kMlaKeyDim &&
                  kv_cache.stride(3) == 1,
              op, ": kv_cache must be [num_blocks, page, 1, 576] with a packed last dim");
  TORCH_CHECK(out.dim() == 3 && out.size(2) == paddle_mla::kMlaLatentDim && out.stride(2) == 1 &&
                  out.size(1) == q.size(1),
              op, ": out must be [B, H, 512] with a packed last dim");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && kv_cache.scalar_type() == at::kBFloat16 &&
                  out.scalar_type() == at::kBFloat16,
              op, ": q, kv_cache and out must be bf16");
  for (const at::Tensor* t : {&seq_lens, &num_splits, &cu_tiles, &split_start, &tiles_per_prog})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), op, ": the lengths and plan must be int32, contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.stride(1) == 1, op,
              ": block_tables must be int32 [B, max_blocks] with a packed last dim");
  TORCH_CHECK(block_tables.size(0) >= batch && seq_lens.numel() >= batch &&
                  cu_tiles.numel() >= batch + 1 && split_start.numel() >= batch + 1 && q.size(0) >= batch &&
                  out.size(0) >= batch,
              op, ": fewer rows than batch");
  TORCH_CHECK(partial_out.scalar_type() == at::kFloat && partial_lse.scalar_type() == at::kFloat &&
                  partial_out.dim() == 3 && partial_lse.dim() == 3 && partial_out.size(2) == paddle_mla::kMlaLatentDim &&
                  partial_out.stride(2) == 1 && partial_out.size(1) >= q.size(1) && partial_lse.size(1) >= q.size(1),
              op, ": partial_out must be fp32 [rows, >= H, 512], partial_lse fp32 [rows, >= H, k]");
  paddle_mla::MlaDecodeArgs a{};
  a.q = q.data_ptr();
  a.q_stride_b = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.kv_cache = kv_cache.data_ptr();
  a.kv_stride_block = kv_cache.stride(0);
  a.kv_stride_token = kv_cache.stride(1);
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.bt_stride = block_tables.stride(0);
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.num_splits = num_splits.data_ptr<int32_t>();
  a.cu_tiles = cu_tiles.data_ptr<int32_t>();
  a.split_start = split_start.data_ptr<int32_t>();
  a.tiles_per_prog = tiles_per_prog.data_ptr<int32_t>();
  a.out = out.data_ptr();
  a.out_stride_b = out.stride(0);
  a.out_stride_h = out.stride(1);
  a.partial_out = partial_out.data_ptr<float>();
  a.po_stride_row = partial_out.stride(0);
  a.po_stride_head = partial_out.stride(1);
  a.partial_lse = partial_lse.data_ptr<float>();
  a.lse_stride_row = partial_lse.stride(0);
  a.lse_stride_head = partial_lse.stride(1);
  a.batch = batch;
  a.num_heads = q.size(1);
  a.page_size = kv_cache.size(1);
  a.programs = programs;
  a.block_n = block_n;
  a.row_blocks = row_blocks;
  a.col_splits = col_splits;
  a.stages = stages;
  a.softmax_scale = static_cast<float>(softmax_scale);
  const char* bad = paddle_mla::check_mla_decode_args(a);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(paddle_mla, m) {
  m.def("mla_decode(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, Tensor num_splits, "
        "Tensor cu_tiles, Tensor split_start, Tensor tiles_per_prog, Tensor(a!) out, Tensor(b!) partial_out, "
        "Tensor(c!) partial_lse, int batch, float softmax_scale, int programs, int block_n, int row_blocks, "
        "int col_splits, int stages) -> ()");
}

TORCH_LIBRARY_IMPL(paddle_mla, CPU, m) { m.impl("mla_decode", &mla_decode); }

#ifdef PADDLE_MLA_WITH_CUDA
TORCH_LIBRARY_IMPL(paddle_mla, CUDA, m) { m.impl("mla_decode", &mla_decode); }
#endif
