// mla_decode and mla_sparse: the CUDA launchers and the decode's split combine. Framework-neutral:
// nvcc compiles this file alone (scripts/check_cuda_compile.sh). Contracts: mla_decode_cuda.h and
// mla_sparse_cuda.h; kernels: mla_decode_kernel.cuh, mla_decode_wgmma.cuh, mla_decode_narrow.cuh,
// mla_sparse_wgmma.cuh.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "cuda_launch.cuh"
#include "mla_decode_cuda.h"
#include "mla_decode_kernel.cuh"
#include "mla_decode_narrow.cuh"
#include "mla_decode_wgmma.cuh"
#include "mla_sparse_cuda.h"
#include "mla_sparse_wgmma.cuh"

namespace paddle_mla {
namespace {

constexpr int kCombineThreads = kMlaLatentDim / 4;  // 4 value columns a thread (one float4)
constexpr int kCombineClasses = 4;                  // splits summed apart by s % 4, then in class order

// A combine program's shared memory: the warps' maxima, the classes handed to group 0, and the plan
// of the program's rows.
template <int G>
struct CombineShared {
  static constexpr int kWarps = kCombineThreads * G / 32, kHanded = G > 1 ? kCombineClasses - kCombineClasses / G : 1;
  float warp_max[kWarps];
  float4 class_acc[kHanded][kCombineThreads];
  float class_den[kHanded][kCombineThreads];
  int seq_len[kCombineThreads], splits[kCombineThreads];
  int64_t start[kCombineThreads];
};

// Merges the n >= 2 splits of (row b, head h), whose partial rows start at r0, into out. Every thread
// of the program calls it (it syncs the block).
//
// G groups of kCombineThreads threads share the merge. The splits are summed in 4 classes (s % 4),
// each in split order, and the classes' sums are added in class order: group g sums classes
// g * 4 / G .. (g + 1) * 4 / G - 1, so every G gives the same bits (the launcher picks G by the grid's
// size, and a row's bits must not follow its batch). At b=1 a program merges up to 65 splits and
// the merge is a latency-bound chain: 4 groups walk a quarter each.
template <int G>
__device__ __forceinline__ void combine_head(const MlaDecodeArgs& a, int64_t b, int64_t h, int n, int64_t r0,
                                             CombineShared<G>& sh) {
  constexpr int R = kCombineClasses / G, kWarps = CombineShared<G>::kWarps;
  static_assert(kCombineClasses % G == 0, "G must divide the class count");
  const int tid = static_cast<int>(threadIdx.x), g = tid / kCombineThreads, t = tid % kCombineThreads;
  const int col = t * 4;
  const float* lse = a.partial_lse + r0 * a.lse_stride_row + h * a.lse_stride_head;
  float mx = -INFINITY;  // the block's maximum over the splits' LSEs (max is exact in any order)
  for (int s = tid; s < n; s += kCombineThreads * G) mx = fmaxf(mx, lse[s * a.lse_stride_row]);
#pragma unroll
  for (int d = 16; d > 0; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  if (tid % 32 == 0) sh.warp_max[tid / 32] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sh.warp_max[w]);
  float den[R];
  float4 acc[R];
  const float* po = a.partial_out + r0 * a.po_stride_row + h * a.po_stride_head + col;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    den[r] = 0.0f;
    acc[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = g * R + r; s < n; s += kCombineClasses) {
      const float w = exp2f(lse[s * a.lse_stride_row] - mx);
      const float4 p = *reinterpret_cast<const float4*>(po + s * a.po_stride_row);
      den[r] += w;
      acc[r].x += w * p.x;
      acc[r].y += w * p.y;
      acc[r].z += w * p.z;
      acc[r].w += w * p.w;
    }
  }
  if constexpr (G > 1) {  // groups 1.. hand their classes to group 0
    if (g > 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sh.class_acc[(g - 1) * R + r][t] = acc[r];
        sh.class_den[(g - 1) * R + r][t] = den[r];
      }
    }
    __syncthreads();
  }
  if (g == 0) {
    float d = den[0];
    float4 sum = acc[0];
#pragma unroll
    for (int c = 1; c < kCombineClasses; ++c) {  // class order, whoever summed each class
      const float dc = c < R ? den[c % R] : sh.class_den[G > 1 ? c - R : 0][t];
      const float4 ac = c < R ? acc[c % R] : sh.class_acc[G > 1 ? c - R : 0][t];
      d += dc;
      sum.x += ac.x;
      sum.y += ac.y;
      sum.z += ac.z;
      sum.w += ac.w;
    }
    const float inv = 1.0f / d;
    __nv_bfloat16* o = static_cast<__nv_bfloat16*>(a.out) + b * a.out_stride_b + h * a.out_stride_h + col;
    reinterpret_cast<__nv_bfloat162*>(o)[0] = __floats2bfloat162_rn(sum.x * inv, sum.y * inv);
    reinterpret_cast<__nv_bfloat162*>(o)[1] = __floats2bfloat162_rn(sum.z * inv, sum.w * inv);
  }
}

// One program per head and run of `rows` rows: rows with several splits merge their partials by
// log2-sum-exp (combine_head); zero-length rows get zeros; single-split rows were written by the split
// kernel. Runs of rows keep the grid to about one wave: where most rows are whole (the plan keeps
// uniform rows whole), a program per (row, head) would be several waves of programs that only read
// the plan.
// Launched by PDL behind the split kernel: its blocks may wait on free SMs for the split grid to end.
template <int G>
__global__ void __launch_bounds__(kCombineThreads * G) mla_combine_kernel(MlaDecodeArgs a, int rows) {
  __shared__ CombineShared<G> sh;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * rows, h = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x);
  rows = static_cast<int>(min(static_cast<int64_t>(rows), a.batch - b0));
  grid_dependency_wait();
  if (tid < rows) {  // the plan of every row at once: one round trip, not one a row
    sh.seq_len[tid] = a.seq_lens[b0 + tid];
    sh.splits[tid] = a.num_splits[b0 + tid];
    sh.start[tid] = a.split_start[b0 + tid];
  }
  __syncthreads();
  for (int i = 0; i < rows; ++i) {
    const int64_t b = b0 + i;
    const int n = sh.splits[i];
    if (sh.seq_len[i] <= 0) {
      if (tid < kCombineThreads) {
        __nv_bfloat16* o = static_cast<__nv_bfloat16*>(a.out) + b * a.out_stride_b + h * a.out_stride_h + tid * 4;
        const __nv_bfloat162 zero = __floats2bfloat162_rn(0.0f, 0.0f);
        reinterpret_cast<__nv_bfloat162*>(o)[0] = zero;
        reinterpret_cast<__nv_bfloat162*>(o)[1] = zero;
      }
    } else if (n > 1) {
      combine_head<G>(a, b, h, n, sh.start[i], sh);
      __syncthreads();  // the next row reuses the warps' maxima and the handed classes
    }
  }
}

// The combine's group count: programs of 4 groups where the grid leaves most SMs idle (few rows), 1
// where it fills the GPU several times over; the bits are the same for every count. With one group, a
// program takes a run of rows, enough to keep the grid to one wave of resident programs (at most
// kCombineThreads: the plan of a run is read at once).
const char* launch_combine(const MlaDecodeArgs& a, cudaStream_t stream) {
  const int64_t programs = a.batch * a.num_heads, sms = sm_count();
  const auto grid = [&](int64_t rows) {
    return dim3(static_cast<unsigned>((a.batch + rows - 1) / rows), static_cast<unsigned>(a.num_heads));
  };
  if (programs <= sms) return launch_pdl(mla_combine_kernel<4>, grid(1), dim3(kCombineThreads * 4), 0, stream, a, 1);
  if (programs <= 4 * sms)
    return launch_pdl(mla_combine_kernel<2>, grid(1), dim3(kCombineThreads * 2), 0, stream, a, 1);
  static const int resident = [] {  // programs of one group an SM (its registers set it)
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mla_combine_kernel<1>, kCombineThreads, 0) == cudaSuccess
               ? std::max(n, 1)
               : 1;
  }();
  const int64_t wave = sms * resident;
  const int rows = static_cast<int>(std::min<int64_t>((programs + wave - 1) / wave, kCombineThreads));
  return launch_pdl(mla_combine_kernel<1>, grid(rows), dim3(kCombineThreads), 0, stream, a, rows);
}

// A launch config (row_blocks, col_splits, block_n, stages) as one switch label.
constexpr int64_t config_key(int64_t rb, int64_t cs, int64_t bn, int64_t st) {
  return ((rb * 10 + cs) * 100 + bn) * 10 + st;
}

// Only the 64-head warpgroup kernel reads FP8 rows (ops.mla_decode.launch_config picks it for them);
// the dispatcher refuses every other config over them.
constexpr const char* kFp8NeedsWarpgroup = "FP8 cache rows are read by the 64-head warpgroup config only";

// The mma.sync kernel (mla_decode_kernel.cuh): bf16 rows only.
template <int RB, int CS, int BN, int NST>
const char* launch_split(const MlaDecodeArgs& a, cudaStream_t stream) {
  const size_t smem = mla::SplitLayout(RB, CS, BN, NST).total;
  auto kernel = mla::mla_decode_split_kernel<RB, CS, BN, NST>;
  if (const char* err = allow_smem(kernel, smem)) return err;
  const int head_groups = static_cast<int>((a.num_heads + 16 * RB - 1) / (16 * RB));
  kernel<<<dim3(head_groups, static_cast<unsigned>(a.programs)), 32 * RB * CS, smem, stream>>>(a);
  return launched();
}

// The driver's tensor-map encoder, found once through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                             &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 3-D map (dims innermost first, strides in elements of dims 1 and 2) read in boxes of
// box0 x rows x 1: bf16 with the 128-byte swizzle of mla_decode_wgmma.cuh's tiles by default, or plain
// bytes unswizzled (the FP8 rows); nullptr or why not.
const char* encode_map(CUtensorMap* map, const void* ptr, const int64_t (&dims)[3], int64_t stride1, int64_t stride2,
                       int rows, int box0 = 64, bool bytes = false) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return "the driver has no cuTensorMapEncodeTiled (CUDA 12+ driver needed)";
  const int64_t elem = bytes ? 1 : 2;
  const cuuint64_t size[3] = {static_cast<cuuint64_t>(dims[0]), static_cast<cuuint64_t>(dims[1]),
                              static_cast<cuuint64_t>(dims[2])};
  // a size-1 dim's stride is never stepped, and frameworks report anything there: use the packed one
  if (dims[1] == 1) stride1 = dims[0];
  if (dims[2] == 1) stride2 = dims[1] * stride1;
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || (stride1 * elem) % 16 != 0 || (stride2 * elem) % 16 != 0)
    return "the warpgroup kernel needs 16-byte aligned q / kv_cache rows (a TMA rule)";
  const cuuint64_t stride[2] = {static_cast<cuuint64_t>(stride1 * elem), static_cast<cuuint64_t>(stride2 * elem)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(rows), 1}, step[3] = {1, 1, 1};
  const CUresult r = encode(map, bytes ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                            const_cast<void*>(ptr), size, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            bytes ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? nullptr : "cuTensorMapEncodeTiled rejected the q or kv_cache layout";
}

// The warpgroup kernel: sm_90a code only (wgmma, TMA), so it runs on a compute capability 9.0 device
// and a build for it (paddle_mla/ops/build.py targets sm_90a there); anywhere else it is refused.
bool on_sm90() { return device_info().cc == 90; }

// The paged kernels' tensor maps: the cache (and, for FP8 rows, their scale units) in boxes of
// tma_box_rows(page) tokens, Q in boxes of q_rows heads; nullptr or why not.
const char* encode_paged_maps(const MlaDecodeArgs& a, int q_rows, CUtensorMap& kv_map, CUtensorMap& q_map,
                              CUtensorMap& scale_map) {
  const int rows = mla::tma_box_rows(static_cast<int>(a.page_size));
  const int64_t kv_dims[3] = {a.kv_fp8 ? kMlaFp8Row : kMlaKeyDim, a.page_size, a.kv_blocks};
  const int64_t q_dims[3] = {kMlaKeyDim, a.num_heads, a.q_rows};
  if (const char* err = encode_map(&kv_map, a.kv_cache, kv_dims, a.kv_stride_token, a.kv_stride_block, rows, 64,
                                   a.kv_fp8))
    return err;
  // FP8 rows: a second map over the same bytes brings each row's scale unit (16 bytes at 576)
  if (a.kv_fp8) {
    if (const char* err = encode_map(&scale_map, a.kv_cache, kv_dims, a.kv_stride_token, a.kv_stride_block, rows,
                                     16, true))
      return err;
  }
  return encode_map(&q_map, a.q, q_dims, a.q_stride_h, a.q_stride_b, q_rows);
}

// What both paged sm_90a kernels launch with: their tensor maps and a grid of one program per head
// group (`heads` heads each) and plan program.
struct PagedLaunch {
  CUtensorMap kv_map, q_map, scale_map;
  dim3 grid;
};

// The paged kernels' common host steps (the device check, the maps, the grid); nullptr, or why not
// (not_sm90: the kernel's refusal off a compute capability 9.0 device).
const char* paged_launch(const MlaDecodeArgs& a, int heads, const char* not_sm90, PagedLaunch& l) {
  if (!on_sm90()) return not_sm90;
  if (const char* err = encode_paged_maps(a, heads, l.kv_map, l.q_map, l.scale_map)) return err;
  l.grid = dim3(static_cast<unsigned>((a.num_heads + heads - 1) / heads), static_cast<unsigned>(a.programs));
  return nullptr;
}

const char* launch_wgmma(const MlaDecodeArgs& a, cudaStream_t stream) {
  PagedLaunch l{};
  if (const char* err =
          paged_launch(a, mla::kWgHeads, "the warpgroup (block_n 64) kernel needs a compute capability 9.0 GPU", l))
    return err;
  const size_t smem = mla::WgLayout::total;
  auto kernel = a.kv_fp8 ? mla::mla_decode_wgmma_kernel<true> : mla::mla_decode_wgmma_kernel<false>;
  if (const char* err = allow_smem(kernel, smem)) return err;
  return launch_pdl(kernel, l.grid, dim3(mla::kWgThreads), smem, stream, a, l.kv_map, l.q_map, l.scale_map);
}

// The narrow kernel (mla_decode_narrow.cuh): 16 heads a program, bf16 rows only.
const char* launch_narrow(const MlaDecodeArgs& a, cudaStream_t stream) {
  PagedLaunch l{};
  if (const char* err =
          paged_launch(a, mla::kNarrowHeads, "the narrow warpgroup kernel needs a compute capability 9.0 GPU", l))
    return err;
  const size_t smem = mla::NarrowLayout::total;
  auto kernel = mla::mla_decode_narrow_kernel;
  if (const char* err = allow_smem(kernel, smem)) return err;
  return launch_pdl(kernel, l.grid, dim3(mla::kNarrowThreads + 32), smem, stream, a, l.kv_map, l.q_map);
}

// The sparse kernel (mla_sparse_wgmma.cuh): Q by TMA from q_lat and q_pe, one program a row, head
// group and split.
const char* launch_sparse(const MlaSparseArgs& a, cudaStream_t stream) {
  if (!on_sm90()) return "the sparse MLA kernel needs a compute capability 9.0 GPU";
  CUtensorMap ql_map{}, qp_map{};
  const int64_t ql_dims[3] = {kMlaLatentDim, a.num_heads, a.q_rows}, qp_dims[3] = {kMlaRopeDim, a.num_heads, a.q_rows};
  if (const char* err = encode_map(&ql_map, a.q_lat, ql_dims, a.ql_stride_h, a.ql_stride_t, mla::kWgHeads)) return err;
  if (const char* err = encode_map(&qp_map, a.q_pe, qp_dims, a.qp_stride_h, a.qp_stride_t, mla::kWgHeads)) return err;
  const size_t smem = mla::WgLayout::total;
  auto kernel = mla::mla_sparse_wgmma_kernel;
  if (const char* err = allow_smem(kernel, smem)) return err;
  const int64_t groups = (a.num_heads + mla::kWgHeads - 1) / mla::kWgHeads;
  return launch_pdl(kernel, dim3(static_cast<unsigned>(groups * a.rows), static_cast<unsigned>(a.num_splits)),
                    dim3(mla::kWgThreads), smem, stream, a, ql_map, qp_map);
}

}  // namespace

const char* mla_sparse_cuda(const MlaSparseArgs& a, void* stream) {
  if (a.rows == 0) return nullptr;
  return launch_sparse(a, static_cast<cudaStream_t>(stream));
}

const char* mla_decode_cuda(const MlaDecodeArgs& a, void* stream_ptr) {
  const char* bad = check_mla_decode_args(a);
  if (bad != nullptr) return bad;
  if (a.batch == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // the configs of paddle_mla/ops/mla_decode.py (launch_config and its variants)
  const char* err = nullptr;
  const int64_t key = config_key(a.row_blocks, a.col_splits, a.block_n, a.stages);
  if (a.kv_fp8 && key != config_key(4, 2, 64, 2)) return kFp8NeedsWarpgroup;
  switch (key) {
    case config_key(1, 4, 32, 4): err = launch_split<1, 4, 32, 4>(a, stream); break;
    case config_key(1, 4, 32, 2): err = launch_split<1, 4, 32, 2>(a, stream); break;
    case config_key(2, 4, 32, 3): err = launch_split<2, 4, 32, 3>(a, stream); break;
    case config_key(4, 2, 32, 3): err = launch_split<4, 2, 32, 3>(a, stream); break;
    case config_key(4, 2, 32, 2): err = launch_split<4, 2, 32, 2>(a, stream); break;
    case config_key(4, 2, 64, 2): err = launch_wgmma(a, stream); break;
    case config_key(1, 1, 64, 2): err = launch_narrow(a, stream); break;
    default: return "unsupported launch config (row_blocks, col_splits, block_n, stages)";
  }
  if (err != nullptr) return err;
  return launch_combine(a, stream);
}

}  // namespace paddle_mla
