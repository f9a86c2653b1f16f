// torch.library operators (namespace paddle_mla) over the framework-neutral kernels
// (metadata_cpu.h, metadata_cuda.h). Built by paddle_mla/ops/build.py; PADDLE_MLA_WITH_CUDA is
// defined when metadata_kernels.cu is compiled in. Fake (meta) kernels are registered from Python.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "metadata_cpu.h"
#include "metadata_cuda.h"

#ifdef PADDLE_MLA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace {

at::Tensor as_dtype(const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype).contiguous(); }

#ifdef PADDLE_MLA_WITH_CUDA
void* current_stream() { return static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()); }
void check_launch(const char* err, const char* op) { TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err); }
#endif

// One implementation serves both dispatch keys: the kernel is picked from the tensor's device.
at::Tensor get_position_ids(const at::Tensor& seq_lens_encoder, const at::Tensor& seq_lens_decoder,
                            const at::Tensor& seq_lens_this_time, int64_t num_tokens) {
  const auto enc = as_dtype(seq_lens_encoder, at::kInt);
  const auto dec = as_dtype(seq_lens_decoder, at::kInt);
  const auto this_time = as_dtype(seq_lens_this_time, at::kInt);
  auto out = at::empty({num_tokens}, enc.options().dtype(at::kLong));
  const int64_t batch = enc.numel();
  if (enc.is_cpu()) {
    paddle_mla::get_position_ids_cpu(enc.data_ptr<int32_t>(), dec.data_ptr<int32_t>(), this_time.data_ptr<int32_t>(),
                                     batch, out.data_ptr<int64_t>(), num_tokens);
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    const c10::cuda::CUDAGuard guard(enc.device());
    check_launch(paddle_mla::get_position_ids_cuda(enc.data_ptr<int32_t>(), dec.data_ptr<int32_t>(),
                                                   this_time.data_ptr<int32_t>(), batch, out.data_ptr<int64_t>(),
                                                   num_tokens, current_stream()),
                 "paddle_mla::get_position_ids");
#endif
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> get_cu_seqlens(const at::Tensor& seq_lens_this_time,
                                                              const at::Tensor& seq_lens_decoder, int64_t num_tokens) {
  const auto this_time = as_dtype(seq_lens_this_time, at::kInt);
  const auto dec = as_dtype(seq_lens_decoder, at::kInt);
  const int64_t batch = this_time.numel();
  auto cu_q = at::empty({batch + 1}, this_time.options());
  auto cu_k = at::empty({batch + 1}, this_time.options());
  auto ids = at::empty({num_tokens}, this_time.options());
  if (this_time.is_cpu()) {
    paddle_mla::get_cu_seqlens_cpu(this_time.data_ptr<int32_t>(), dec.data_ptr<int32_t>(), batch,
                                   cu_q.data_ptr<int32_t>(), cu_k.data_ptr<int32_t>(), ids.data_ptr<int32_t>(),
                                   num_tokens);
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    const c10::cuda::CUDAGuard guard(this_time.device());
    check_launch(paddle_mla::get_cu_seqlens_cuda(this_time.data_ptr<int32_t>(), dec.data_ptr<int32_t>(), batch,
                                                 cu_q.data_ptr<int32_t>(), cu_k.data_ptr<int32_t>(),
                                                 ids.data_ptr<int32_t>(), num_tokens, current_stream()),
                 "paddle_mla::get_cu_seqlens");
#endif
  }
  return {cu_q, cu_k, ids};
}

at::Tensor compute_slot_mapping(const at::Tensor& block_tables, const at::Tensor& batch_id_per_token,
                                const at::Tensor& positions, int64_t block_size) {
  TORCH_CHECK(block_size > 0, "paddle_mla::compute_slot_mapping: block_size must be positive");
  TORCH_CHECK(block_tables.dim() == 2, "paddle_mla::compute_slot_mapping: block_tables must be [B, max_blocks]");
  TORCH_CHECK(batch_id_per_token.numel() == positions.numel(),
              "paddle_mla::compute_slot_mapping: batch_id_per_token and positions differ in length");
  const auto tables = as_dtype(block_tables, at::kInt);
  const auto ids = as_dtype(batch_id_per_token, at::kInt);
  const auto pos = as_dtype(positions, at::kLong);
  const int64_t num_tokens = pos.numel();
  auto slots = at::empty({num_tokens}, pos.options());
  if (pos.is_cpu()) {
    paddle_mla::compute_slot_mapping_cpu(tables.data_ptr<int32_t>(), tables.size(0), tables.size(1),
                                         ids.data_ptr<int32_t>(), pos.data_ptr<int64_t>(), num_tokens, block_size,
                                         slots.data_ptr<int64_t>());
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    const c10::cuda::CUDAGuard guard(pos.device());
    check_launch(paddle_mla::compute_slot_mapping_cuda(tables.data_ptr<int32_t>(), tables.size(0), tables.size(1),
                                                       ids.data_ptr<int32_t>(), pos.data_ptr<int64_t>(), num_tokens,
                                                       block_size, slots.data_ptr<int64_t>(), current_stream()),
                 "paddle_mla::compute_slot_mapping");
#endif
  }
  return slots;
}

}  // namespace

TORCH_LIBRARY(paddle_mla, m) {
  m.def("get_position_ids(Tensor seq_lens_encoder, Tensor seq_lens_decoder, Tensor seq_lens_this_time, "
        "int num_tokens) -> Tensor");
  m.def("get_cu_seqlens(Tensor seq_lens_this_time, Tensor seq_lens_decoder, int num_tokens) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("compute_slot_mapping(Tensor block_tables, Tensor batch_id_per_token, Tensor positions, "
        "int block_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(paddle_mla, CPU, m) {
  m.impl("get_position_ids", &get_position_ids);
  m.impl("get_cu_seqlens", &get_cu_seqlens);
  m.impl("compute_slot_mapping", &compute_slot_mapping);
}

#ifdef PADDLE_MLA_WITH_CUDA
TORCH_LIBRARY_IMPL(paddle_mla, CUDA, m) {
  m.impl("get_position_ids", &get_position_ids);
  m.impl("get_cu_seqlens", &get_cu_seqlens);
  m.impl("compute_slot_mapping", &compute_slot_mapping);
}
#endif
