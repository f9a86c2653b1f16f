// Paddle custom operator pmla_append_attention over the framework-neutral sources
// (append_attention_cpu.h, append_attention_cuda.h). Same library as paddle_binding.cc. k_cache,
// v_cache and out are updated in place (SetInplaceMap); the Python wrapper returns `out`.
#include <vector>

#include "append_attention_cpu.h"
#include "append_attention_cuda.h"
#include "paddle/extension.h"

namespace {

using paddle::DataType;

paddle::Tensor cast_to(const paddle::Tensor& x, DataType dtype) {
  const paddle::Tensor y = x.dtype() == dtype ? x : x.cast(dtype);
  return y.is_contiguous() ? y : y.contiguous();
}

// A [T, H, D] tensor whose heads and dims are packed (token stride free), else a packed copy.
paddle::Tensor rows_packed(const paddle::Tensor& x) {
  const auto st = x.strides();
  return (st[2] == 1 && st[1] == x.shape()[2]) ? x : x.contiguous();
}

void AppendAttention(const paddle::Tensor& q_in, const paddle::Tensor& k_in, const paddle::Tensor& v_in,
                     paddle::Tensor& k_cache, paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                     const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_k,
                     const paddle::Tensor& batch_id_per_token, const paddle::Tensor& positions,
                     const paddle::Tensor& cos_sin, paddle::Tensor& out, const paddle::Tensor& workspace,
                     float softmax_scale, bool neox, int64_t rot_dim, int64_t num_swa_heads, int64_t window,
                     int64_t sink, bool swa_mask, bool decode_only,
                     bool batch_invariant, int64_t invariant_split) {
  const char* op = "pmla_append_attention";
  PD_CHECK(q_in.shape().size() == 3 && k_in.shape().size() == 3 && v_in.shape().size() == 3, op,
           ": q, k, v must be [T, H, D]");
  PD_CHECK((k_cache.shape().size() == 4 || k_cache.shape().size() == 3) && k_cache.shape() == v_cache.shape(), op,
           ": k_cache and v_cache must both be [Hkv, num_blocks, block_size, D] or [num_blocks, block_size, D]");
  const bool flat = k_cache.shape().size() == 3;  // per-head ranges of one array, global ids in head-wise tables
  PD_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && out.is_contiguous(), op,
           ": caches and out must be contiguous");
  const DataType dt = q_in.dtype();
  PD_CHECK(dt == DataType::FLOAT32 || dt == DataType::BFLOAT16 || dt == DataType::FLOAT16, op,
           ": dtype must be fp32, bf16 or fp16");
  PD_CHECK(k_in.dtype() == dt && v_in.dtype() == dt && k_cache.dtype() == dt && v_cache.dtype() == dt &&
               out.dtype() == dt,
           op, ": q, k, v, caches and out must share one dtype");
  const auto& tshape = block_tables.shape();
  PD_CHECK(tshape.size() == 2 || tshape.size() == 3, op, ": block_tables must be 2-D or 3-D");
  const auto q = rows_packed(q_in), k = rows_packed(k_in), v = rows_packed(v_in);
  const auto tables = cast_to(block_tables, DataType::INT32), cu_q = cast_to(cu_seqlens_q, DataType::INT32);
  const auto lens = cast_to(seq_lens_k, DataType::INT32), ids = cast_to(batch_id_per_token, DataType::INT32);
  const auto pos = cast_to(positions, DataType::INT64), cs = cast_to(cos_sin, DataType::FLOAT32);
  paddle_mla::AppendAttentionArgs a{};
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.q_stride = q.strides()[0];
  a.k_stride = k.strides()[0];
  a.v_stride = v.strides()[0];
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.block_tables = tables.data<int32_t>();
  a.head_wise = tshape.size() == 3;
  a.flat_cache = flat;
  a.cu_seqlens_q = cu_q.data<int32_t>();
  a.seq_lens_k = lens.data<int32_t>();
  a.batch_id_per_token = ids.data<int32_t>();
  a.positions = pos.data<int64_t>();
  a.cos_sin = cs.data<float>();
  a.out = out.data();
  a.num_tokens = q.shape()[0];
  a.batch = lens.numel();
  a.num_q_heads = q.shape()[1];
  a.num_kv_heads = k.shape()[1];
  a.head_dim = q.shape()[2];
  a.num_blocks = k_cache.shape()[flat ? 0 : 1];
  a.block_size = k_cache.shape()[flat ? 1 : 2];
  a.max_blocks = tshape.back();
  a.max_position = cs.shape()[0];
  a.rot_dim = rot_dim;
  a.softmax_scale = softmax_scale;
  a.neox = neox;
  a.num_swa_heads = num_swa_heads;
  a.window = window;
  a.sink = sink;
  a.swa_mask = swa_mask;
  a.batch_invariant = batch_invariant;
  a.invariant_split = batch_invariant ? invariant_split : 0;
  a.dtype = dt == DataType::FLOAT32    ? paddle_mla::AttnDtype::kFloat32
            : dt == DataType::BFLOAT16 ? paddle_mla::AttnDtype::kBFloat16
                                       : paddle_mla::AttnDtype::kFloat16;
  PD_CHECK(k.shape()[0] == a.num_tokens && v.shape()[0] == a.num_tokens && v.shape()[1] == a.num_kv_heads &&
               k.shape()[2] == a.head_dim && v.shape()[2] == a.head_dim && (flat || k_cache.shape()[0] == a.num_kv_heads) &&
               k_cache.shape().back() == a.head_dim,
           op, ": q, k, v and cache shapes disagree");
  PD_CHECK(out.numel() == q.numel(), op, ": out must be [T, Hq, D]");
  PD_CHECK(tshape[0] == a.batch && cu_q.numel() == a.batch + 1 && ids.numel() == a.num_tokens &&
               pos.numel() == a.num_tokens && cs.shape().size() == 2 && cs.shape()[1] == rot_dim,
           op, ": metadata shapes disagree (block_tables [B, ...], cu_seqlens_q [B+1], "
               "batch_id_per_token and positions [T], cos_sin [max_position, rot_dim])");
  PD_CHECK(tshape.size() == 2 || tshape[1] == a.num_kv_heads, op, ": head-wise block_tables must be [B, Hkv, M]");
  const char* bad = paddle_mla::check_append_attention_args(a);
  PD_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
  if (q.is_cpu()) {
    paddle_mla::append_attention_cpu(a);
    return;
  }
#ifdef PADDLE_MLA_WITH_CUDA
  PD_CHECK(q.is_gpu() && workspace.is_gpu() && workspace.dtype() == DataType::FLOAT32, op,
           ": GPU tensors and an fp32 GPU workspace expected");
  const char* err = paddle_mla::append_attention_cuda(a, const_cast<float*>(workspace.data<float>()),
                                                      workspace.numel(), decode_only,
                                                      static_cast<void*>(q.stream()));
  PD_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  (void)workspace;
  (void)decode_only;
  PD_CHECK(false, op, ": this build has no CUDA kernels (CPU tensors only)");
#endif
}

}  // namespace

PD_BUILD_OP(pmla_append_attention)
    .Inputs({"q", "k", "v", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "seq_lens_k",
             "batch_id_per_token", "positions", "cos_sin", "out", "workspace"})
    .Outputs({"k_cache_out", "v_cache_out", "out_out"})
    .SetInplaceMap({{"k_cache", "k_cache_out"}, {"v_cache", "v_cache_out"}, {"out", "out_out"}})
    .Attrs({"softmax_scale: float", "neox: bool", "rot_dim: int64_t", "num_swa_heads: int64_t",
            "window: int64_t", "sink: int64_t", "swa_mask: bool", "decode_only: bool",
            "batch_invariant: bool", "invariant_split: int64_t"})
    .SetKernelFn(PD_KERNEL(AppendAttention));
