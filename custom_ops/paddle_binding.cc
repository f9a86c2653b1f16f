// Paddle custom operators over the framework-neutral kernels (metadata_cpu.h, metadata_cuda.h).
// Op names carry a pmla_ prefix because Paddle's operator registry is process-global.
// Built by paddle_mla/ops/build.py; PADDLE_MLA_WITH_CUDA is defined when metadata_kernels.cu is
// compiled in.
#include <vector>

#include "metadata_cpu.h"
#include "metadata_cuda.h"
#include "paddle/extension.h"

namespace {

using paddle::DataType;

paddle::Tensor as_dtype(const paddle::Tensor& x, DataType dtype) {
  return x.dtype() == dtype ? x : x.cast(dtype);
}

void check_device(const paddle::Tensor& x, const char* op) {
#ifdef PADDLE_MLA_WITH_CUDA
  PD_CHECK(x.is_cpu() || x.is_gpu(), op, ": tensors must be on CPU or GPU");
#else
  PD_CHECK(x.is_cpu(), op, ": this build has no CUDA kernels (CPU tensors only)");
#endif
}

#ifdef PADDLE_MLA_WITH_CUDA
void check_launch(const char* err, const char* op) { PD_CHECK(err == nullptr, op, ": CUDA launch failed: ", err); }
#endif

std::vector<paddle::Tensor> GetPositionIds(const paddle::Tensor& seq_lens_encoder,
                                           const paddle::Tensor& seq_lens_decoder,
                                           const paddle::Tensor& seq_lens_this_time, int64_t num_tokens) {
  check_device(seq_lens_encoder, "pmla_get_position_ids");
  const auto enc = as_dtype(seq_lens_encoder, DataType::INT32);
  const auto dec = as_dtype(seq_lens_decoder, DataType::INT32);
  const auto this_time = as_dtype(seq_lens_this_time, DataType::INT32);
  auto out = paddle::empty({num_tokens}, DataType::INT64, enc.place());
  const int64_t batch = enc.numel();
  if (enc.is_cpu()) {
    paddle_mla::get_position_ids_cpu(enc.data<int32_t>(), dec.data<int32_t>(), this_time.data<int32_t>(), batch,
                                     out.data<int64_t>(), num_tokens);
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    check_launch(paddle_mla::get_position_ids_cuda(enc.data<int32_t>(), dec.data<int32_t>(),
                                                   this_time.data<int32_t>(), batch, out.data<int64_t>(),
                                                   num_tokens, static_cast<void*>(enc.stream())),
                 "pmla_get_position_ids");
#endif
  }
  return {out};
}

std::vector<paddle::Tensor> GetCuSeqlens(const paddle::Tensor& seq_lens_this_time,
                                         const paddle::Tensor& seq_lens_decoder, int64_t num_tokens) {
  check_device(seq_lens_this_time, "pmla_get_cu_seqlens");
  const auto this_time = as_dtype(seq_lens_this_time, DataType::INT32);
  const auto dec = as_dtype(seq_lens_decoder, DataType::INT32);
  const int64_t batch = this_time.numel();
  auto cu_q = paddle::empty({batch + 1}, DataType::INT32, this_time.place());
  auto cu_k = paddle::empty({batch + 1}, DataType::INT32, this_time.place());
  auto ids = paddle::empty({num_tokens}, DataType::INT32, this_time.place());
  if (this_time.is_cpu()) {
    paddle_mla::get_cu_seqlens_cpu(this_time.data<int32_t>(), dec.data<int32_t>(), batch, cu_q.data<int32_t>(),
                                   cu_k.data<int32_t>(), ids.data<int32_t>(), num_tokens);
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    check_launch(paddle_mla::get_cu_seqlens_cuda(this_time.data<int32_t>(), dec.data<int32_t>(), batch,
                                                 cu_q.data<int32_t>(), cu_k.data<int32_t>(), ids.data<int32_t>(),
                                                 num_tokens, static_cast<void*>(this_time.stream())),
                 "pmla_get_cu_seqlens");
#endif
  }
  return {cu_q, cu_k, ids};
}

std::vector<paddle::Tensor> ComputeSlotMapping(const paddle::Tensor& block_tables_in,
                                               const paddle::Tensor& batch_id_per_token,
                                               const paddle::Tensor& positions_in, int64_t block_size) {
  check_device(block_tables_in, "pmla_compute_slot_mapping");
  PD_CHECK(block_size > 0, "pmla_compute_slot_mapping: block_size must be positive");
  PD_CHECK(block_tables_in.shape().size() == 2, "pmla_compute_slot_mapping: block_tables must be [B, max_blocks]");
  const auto tables = as_dtype(block_tables_in, DataType::INT32);
  const auto ids = as_dtype(batch_id_per_token, DataType::INT32);
  const auto positions = as_dtype(positions_in, DataType::INT64);
  const int64_t num_tokens = positions.numel();
  PD_CHECK(ids.numel() == num_tokens, "pmla_compute_slot_mapping: batch_id_per_token and positions differ in length");
  const int64_t batch = tables.shape()[0], max_blocks = tables.shape()[1];
  auto slots = paddle::empty({num_tokens}, DataType::INT64, positions.place());
  if (positions.is_cpu()) {
    paddle_mla::compute_slot_mapping_cpu(tables.data<int32_t>(), batch, max_blocks, ids.data<int32_t>(),
                                         positions.data<int64_t>(), num_tokens, block_size, slots.data<int64_t>());
  } else {
#ifdef PADDLE_MLA_WITH_CUDA
    check_launch(paddle_mla::compute_slot_mapping_cuda(tables.data<int32_t>(), batch, max_blocks, ids.data<int32_t>(),
                                                       positions.data<int64_t>(), num_tokens, block_size,
                                                       slots.data<int64_t>(), static_cast<void*>(positions.stream())),
                 "pmla_compute_slot_mapping");
#endif
  }
  return {slots};
}

// Shapes for static graphs: a -1 (unknown) batch stays unknown.
std::vector<std::vector<int64_t>> PositionIdsShape(const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>&, int64_t num_tokens) {
  return {{num_tokens}};
}

std::vector<std::vector<int64_t>> CuSeqlensShape(const std::vector<int64_t>& this_shape, const std::vector<int64_t>&,
                                                 int64_t num_tokens) {
  const int64_t cu = this_shape[0] < 0 ? -1 : this_shape[0] + 1;
  return {{cu}, {cu}, {num_tokens}};
}

std::vector<std::vector<int64_t>> SlotMappingShape(const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>& positions_shape, int64_t) {
  return {positions_shape};
}

std::vector<DataType> Int64Dtype(const DataType&, const DataType&, const DataType&) { return {DataType::INT64}; }

std::vector<DataType> CuSeqlensDtype(const DataType&, const DataType&) {
  return {DataType::INT32, DataType::INT32, DataType::INT32};
}

}  // namespace

PD_BUILD_OP(pmla_get_position_ids)
    .Inputs({"seq_lens_encoder", "seq_lens_decoder", "seq_lens_this_time"})
    .Outputs({"position_ids"})
    .Attrs({"num_tokens: int64_t"})
    .SetKernelFn(PD_KERNEL(GetPositionIds))
    .SetInferShapeFn(PD_INFER_SHAPE(PositionIdsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Int64Dtype));

PD_BUILD_OP(pmla_get_cu_seqlens)
    .Inputs({"seq_lens_this_time", "seq_lens_decoder"})
    .Outputs({"cu_seqlens_q", "cu_seqlens_k", "batch_id_per_token"})
    .Attrs({"num_tokens: int64_t"})
    .SetKernelFn(PD_KERNEL(GetCuSeqlens))
    .SetInferShapeFn(PD_INFER_SHAPE(CuSeqlensShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CuSeqlensDtype));

PD_BUILD_OP(pmla_compute_slot_mapping)
    .Inputs({"block_tables", "batch_id_per_token", "positions"})
    .Outputs({"slot_mapping"})
    .Attrs({"block_size: int64_t"})
    .SetKernelFn(PD_KERNEL(ComputeSlotMapping))
    .SetInferShapeFn(PD_INFER_SHAPE(SlotMappingShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Int64Dtype));
