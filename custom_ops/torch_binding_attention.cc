// torch.library operator paddle_mla::append_attention over the framework-neutral sources
// (append_attention_cpu.h, append_attention_cuda.h). Same library as torch_binding.cc (a fragment of
// its namespace). It mutates k_cache, v_cache and out in place and returns nothing; the Python
// wrapper (paddle_mla/ops/append_attention.py) returns `out`.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "append_attention_cpu.h"
#include "append_attention_cuda.h"

#ifdef PADDLE_MLA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace {

// A [T, H, D] tensor whose heads and dims are packed (token stride free), else a packed copy.
at::Tensor rows_packed(const at::Tensor& x) {
  return (x.stride(2) == 1 && x.stride(1) == x.size(2)) ? x : x.contiguous();
}

at::Tensor as_dtype(const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype).contiguous(); }

void append_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, at::Tensor& k_cache,
                      at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                      const at::Tensor& seq_lens_k, const at::Tensor& batch_id_per_token,
                      const at::Tensor& positions, const at::Tensor& cos_sin, at::Tensor& out,
                      const at::Tensor& workspace, double softmax_scale, bool neox, int64_t rot_dim,
                      int64_t num_swa_heads, int64_t window, int64_t sink, bool swa_mask, bool decode_only,
                      bool batch_invariant, int64_t invariant_split) {
  const char* op = "paddle_mla::append_attention";
  TORCH_CHECK(q_in.dim() == 3 && k_in.dim() == 3 && v_in.dim() == 3, op, ": q, k, v must be [T, H, D]");
  TORCH_CHECK((k_cache.dim() == 4 || k_cache.dim() == 3) && k_cache.sizes() == v_cache.sizes(), op,
              ": k_cache and v_cache must both be [Hkv, num_blocks, block_size, D] or [num_blocks, block_size, D]");
  const bool flat = k_cache.dim() == 3;  // per-head ranges of one array, global ids in head-wise tables
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && out.is_contiguous(), op,
              ": caches and out must be contiguous");
  const auto dt = q_in.scalar_type();
  TORCH_CHECK(k_in.scalar_type() == dt && v_in.scalar_type() == dt && k_cache.scalar_type() == dt &&
                  v_cache.scalar_type() == dt && out.scalar_type() == dt,
              op, ": q, k, v, caches and out must share one dtype");
  TORCH_CHECK(block_tables.dim() == 2 || block_tables.dim() == 3, op, ": block_tables must be 2-D or 3-D");
  const auto q = rows_packed(q_in), k = rows_packed(k_in), v = rows_packed(v_in);
  const auto tables = as_dtype(block_tables, at::kInt), cu_q = as_dtype(cu_seqlens_q, at::kInt);
  const auto lens = as_dtype(seq_lens_k, at::kInt), ids = as_dtype(batch_id_per_token, at::kInt);
  const auto pos = as_dtype(positions, at::kLong), cs = as_dtype(cos_sin, at::kFloat);
  paddle_mla::AppendAttentionArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.q_stride = q.stride(0);
  a.k_stride = k.stride(0);
  a.v_stride = v.stride(0);
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  a.block_tables = tables.data_ptr<int32_t>();
  a.head_wise = tables.dim() == 3;
  a.flat_cache = flat;
  a.cu_seqlens_q = cu_q.data_ptr<int32_t>();
  a.seq_lens_k = lens.data_ptr<int32_t>();
  a.batch_id_per_token = ids.data_ptr<int32_t>();
  a.positions = pos.data_ptr<int64_t>();
  a.cos_sin = cs.data_ptr<float>();
  a.out = out.data_ptr();
  a.num_tokens = q.size(0);
  a.batch = lens.numel();
  a.num_q_heads = q.size(1);
  a.num_kv_heads = k.size(1);
  a.head_dim = q.size(2);
  a.num_blocks = k_cache.size(flat ? 0 : 1);
  a.block_size = k_cache.size(flat ? 1 : 2);
  a.max_blocks = tables.size(-1);
  a.max_position = cs.size(0);
  a.rot_dim = rot_dim;
  a.softmax_scale = static_cast<float>(softmax_scale);
  a.neox = neox;
  a.num_swa_heads = num_swa_heads;
  a.window = window;
  a.sink = sink;
  a.swa_mask = swa_mask;
  a.batch_invariant = batch_invariant;
  a.invariant_split = batch_invariant ? invariant_split : 0;
  a.dtype = dt == at::kFloat      ? paddle_mla::AttnDtype::kFloat32
            : dt == at::kBFloat16 ? paddle_mla::AttnDtype::kBFloat16
                                  : paddle_mla::AttnDtype::kFloat16;
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op, ": dtype must be fp32, bf16 or fp16");
  TORCH_CHECK(k.size(0) == a.num_tokens && v.size(0) == a.num_tokens && v.size(1) == a.num_kv_heads &&
                  k.size(2) == a.head_dim && v.size(2) == a.head_dim && (flat || k_cache.size(0) == a.num_kv_heads) &&
                  k_cache.size(-1) == a.head_dim,
              op, ": q, k, v and cache shapes disagree");
  TORCH_CHECK(out.numel() == q.numel(), op, ": out must be [T, Hq, D]");
  TORCH_CHECK(tables.size(0) == a.batch && cu_q.numel() == a.batch + 1 && ids.numel() == a.num_tokens &&
                  pos.numel() == a.num_tokens && cs.dim() == 2 && cs.size(1) == rot_dim,
              op, ": metadata shapes disagree (block_tables [B, ...], cu_seqlens_q [B+1], "
                  "batch_id_per_token and positions [T], cos_sin [max_position, rot_dim])");
  TORCH_CHECK(!a.head_wise || tables.size(1) == a.num_kv_heads, op, ": head-wise block_tables must be [B, Hkv, M]");
  const char* bad = paddle_mla::check_append_attention_args(a);
  TORCH_CHECK(bad == nullptr, op, ": ", bad ? bad : "");
  if (q.is_cpu()) {
    paddle_mla::append_attention_cpu(a);
    return;
  }
#ifdef PADDLE_MLA_WITH_CUDA
  TORCH_CHECK(workspace.is_cuda() && workspace.scalar_type() == at::kFloat && workspace.is_contiguous(), op,
              ": workspace must be a contiguous fp32 CUDA tensor");
  const c10::cuda::CUDAGuard guard(q.device());
  const char* err = paddle_mla::append_attention_cuda(a, workspace.data_ptr<float>(), workspace.numel(), decode_only,
                                                      at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, op, ": ", err ? err : "");
#else
  (void)workspace;
  (void)decode_only;
  TORCH_CHECK(false, op, ": this build has no CUDA kernels");
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(paddle_mla, m) {
  m.def("append_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor block_tables, Tensor cu_seqlens_q, Tensor seq_lens_k, Tensor batch_id_per_token, "
        "Tensor positions, Tensor cos_sin, Tensor(c!) out, Tensor workspace, float softmax_scale, bool neox, "
        "int rot_dim, int num_swa_heads, int window, int sink, bool swa_mask, bool decode_only, bool batch_invariant, "
        "int invariant_split) -> ()");
}

TORCH_LIBRARY_IMPL(paddle_mla, CPU, m) { m.impl("append_attention", &append_attention); }

#ifdef PADDLE_MLA_WITH_CUDA
TORCH_LIBRARY_IMPL(paddle_mla, CUDA, m) { m.impl("append_attention", &append_attention); }
#endif
