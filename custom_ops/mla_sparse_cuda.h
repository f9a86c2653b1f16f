// mla_sparse, absorbed-MLA attention over each query row's selected cache slots for SM90 (DSA's
// sparse MLA, decode and prefill rows alike): the arguments, their one validation (plain C++, shared
// by the torch and Paddle bindings) and the launcher's declaration (mla_decode_kernels.cu).
//
// Row t, head h: softmax over the slots j of slots[t] (those >= 0) of (q_lat[t, h] . c_j +
// q_pe[t, h] . k_pe_j) * scale, times c_j, where a slot indexes the paged cache [num_blocks, page, 1,
// 576] as block * page + token (the caller keeps slots below num_blocks * page: they are not bounded
// here, as in the Triton kernel). The top-k axis is cut into `num_splits` chunks of `split_len` keys:
// one chunk writes out [t, h] directly; more write fp32 partials [T, H, S, 512] and their log2-sum-exp
// [T, H, S], which the caller merges (paddle_mla/attention/dsa/sparse_mla.py). A row with no valid
// slot gives zeros. Nothing is allocated and every launch size comes from shapes: capturable.
#pragma once

#include <cstdint>

#include "mla_decode_cuda.h"

namespace paddle_mla {

constexpr int64_t kMlaRopeDim = kMlaKeyDim - kMlaLatentDim;

struct MlaSparseArgs {
  const void* q_lat;  // bf16 [>= rows, H, 512], last dim packed
  int64_t ql_stride_t, ql_stride_h;
  const void* q_pe;  // bf16 [>= rows, H, 64], last dim packed
  int64_t qp_stride_t, qp_stride_h;
  int64_t q_rows;            // rows of q_lat and q_pe (the Q tensor maps' extent)
  const void* kv_cache;      // bf16 slot rows of 576, `kv_stride_slot` elements apart
  int64_t kv_stride_slot;
  const int64_t* slots;  // [>= rows, topk], last dim packed
  int64_t slots_stride;
  void* out;  // bf16 [>= rows, H, 512], last dim packed
  int64_t out_stride_t, out_stride_h;
  float* part_o;    // fp32 [rows, H, num_splits, 512], packed (num_splits > 1)
  float* part_lse;  // fp32 [rows, H, num_splits], packed (log2 domain)
  int64_t rows, num_heads, topk, num_splits, split_len;
  float softmax_scale;
};

struct MlaSparseTensors {
  MlaTensor q_lat, q_pe, kv_cache, slots, out, part_o, part_lse;
};

struct MlaSparseLaunchConfig {
  int64_t rows, num_splits, split_len;
  float softmax_scale;
};

// The one validation of the op's inputs: nullptr and `*a` filled, or what is wrong.
inline const char* mla_sparse_args(const MlaSparseTensors& t, const MlaSparseLaunchConfig& c, MlaSparseArgs* a) {
  const MlaTensor &ql = t.q_lat, &qp = t.q_pe, &kv = t.kv_cache, &sl = t.slots, &out = t.out;
  if (ql.ndim > 4 || qp.ndim > 4 || kv.ndim > 4 || sl.ndim > 4 || out.ndim > 4) return "a tensor has more than 4 dims";
  if (!(ql.ndim == 3 && ql.size[2] == kMlaLatentDim && ql.stride[2] == 1))
    return "q_lat must be [T, H, 512] with a packed last dim";
  if (!(qp.ndim == 3 && qp.size[2] == kMlaRopeDim && qp.stride[2] == 1 && qp.size[1] == ql.size[1] &&
        qp.size[0] == ql.size[0]))
    return "q_pe must be [T, H, 64] with a packed last dim, as many rows and heads as q_lat";
  if (!(kv.ndim == 4 && kv.size[2] == 1 && kv.size[3] == kMlaKeyDim && kv.stride[3] == 1))
    return "kv_cache must be [num_blocks, page, 1, 576] with a packed last dim";
  if (kv.size[0] > 1 && kv.stride[0] != kv.size[1] * kv.stride[1])
    return "kv_cache blocks must follow each other (a slot is block * page + token)";
  if (reinterpret_cast<uintptr_t>(kv.data) % 16 != 0 || kv.stride[1] % 8 != 0)
    return "kv_cache rows must be 16-byte aligned (the kernel copies them in 16-byte units)";
  if (!(out.ndim == 3 && out.size[2] == kMlaLatentDim && out.stride[2] == 1 && out.size[1] == ql.size[1]))
    return "out must be [T, H, 512] with a packed last dim";
  if (ql.elem != MlaElem::kBF16 || qp.elem != MlaElem::kBF16 || kv.elem != MlaElem::kBF16 || out.elem != MlaElem::kBF16)
    return "q_lat, q_pe, kv_cache and out must be bf16";
  if (!(sl.elem == MlaElem::kINT64 && sl.ndim == 2 && sl.stride[1] == 1)) return "slots must be int64 [T, topk], packed";
  if (!(t.part_o.elem == MlaElem::kFP32 && t.part_lse.elem == MlaElem::kFP32 && t.part_o.contiguous &&
        t.part_lse.contiguous))
    return "part_o and part_lse must be contiguous fp32";
  const int64_t H = ql.size[1], K = sl.size[1], S = c.num_splits;
  if (c.rows < 0 || H < 1) return "rows must be >= 0 and num_heads >= 1";
  if (!(ql.size[0] >= c.rows && sl.size[0] >= c.rows && out.size[0] >= c.rows)) return "fewer rows than rows";
  if (S < 1 || S > 65535 || c.split_len < 1) return "num_splits must be in 1..65535 and split_len positive";
  if (S > 1 && (c.split_len % 64 != 0 || (S - 1) * c.split_len >= K))
    return "split_len must be a multiple of 64 and every split must hold a key";
  if (S * c.split_len < K) return "the splits must cover the top-k (num_splits x split_len >= topk)";
  if (S > 1 && (t.part_o.numel < c.rows * H * S * kMlaLatentDim || t.part_lse.numel < c.rows * H * S))
    return "the partial workspaces hold fewer than rows x H x num_splits rows";
  if (c.rows * ((H + 63) / 64) > 2147483647LL) return "rows x head groups must fit a grid";
  *a = MlaSparseArgs{};
  a->q_lat = ql.data;
  a->ql_stride_t = ql.stride[0];
  a->ql_stride_h = ql.stride[1];
  a->q_pe = qp.data;
  a->qp_stride_t = qp.stride[0];
  a->qp_stride_h = qp.stride[1];
  a->q_rows = ql.size[0];
  a->kv_cache = kv.data;
  a->kv_stride_slot = kv.stride[1];
  a->slots = static_cast<const int64_t*>(sl.data);
  a->slots_stride = sl.stride[0];
  a->out = const_cast<void*>(out.data);
  a->out_stride_t = out.stride[0];
  a->out_stride_h = out.stride[1];
  a->part_o = static_cast<float*>(const_cast<void*>(t.part_o.data));
  a->part_lse = static_cast<float*>(const_cast<void*>(t.part_lse.data));
  a->rows = c.rows;
  a->num_heads = H;
  a->topk = K;
  a->num_splits = S;
  a->split_len = c.split_len;
  a->softmax_scale = c.softmax_scale;
  return nullptr;
}

// Launches the sparse kernel on `stream` (cudaStream_t as void*); nullptr, or the error text.
const char* mla_sparse_cuda(const MlaSparseArgs& a, void* stream);

}  // namespace paddle_mla
