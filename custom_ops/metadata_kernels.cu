// Per-step metadata ops, CUDA kernels. Framework-neutral: nvcc compiles this file alone
// (scripts/check_cuda_compile.sh). Semantics: metadata_cpu.h / paddle_mla/ops/reference.py.
//
// The two length ops run one block per request plus one tail block (grid = batch + 1, so an empty
// batch still pads). Block b sums the lengths of requests < b itself (an O(batch) reduction per
// block, cheap for the few hundred requests of a step) and then writes only its own tokens, so
// every output element has exactly one writer and no second kernel or scratch buffer is needed.
#include <cuda_runtime.h>

#include "metadata_cpu.h"
#include "cuda_launch.cuh"
#include "metadata_cuda.h"

namespace paddle_mla {
namespace {

constexpr int kThreads = 256;

// Sum over the block of one int64 per thread; every thread gets the result.
__device__ int64_t block_sum(int64_t v, int64_t* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const int64_t total = shared[0];
  __syncthreads();  // shared is reused by the caller's next reduction
  return total;
}

__global__ void position_ids_kernel(const int32_t* enc, const int32_t* dec, const int32_t* this_time,
                                    int64_t batch, int64_t* out, int64_t num_tokens) {
  __shared__ int64_t shared[kThreads];
  const int64_t b = blockIdx.x;  // b == batch: the tail block, writes the padding
  int64_t partial = 0;
  for (int64_t i = threadIdx.x; i < b; i += blockDim.x) partial += step_tokens(enc[i], dec[i], this_time[i]);
  const int64_t start = block_sum(partial, shared);
  if (b < batch) {
    const int64_t n = step_tokens(enc[b], dec[b], this_time[b]);
    const int64_t d = dec[b];
    for (int64_t i = threadIdx.x; i < n && start + i < num_tokens; i += blockDim.x) out[start + i] = d + i;
  } else {
    for (int64_t t = start + threadIdx.x; t < num_tokens; t += blockDim.x) out[t] = 0;
  }
}

__global__ void cu_seqlens_kernel(const int32_t* this_time, const int32_t* dec, int64_t batch,
                                  int32_t* cu_q, int32_t* cu_k, int32_t* batch_ids, int64_t num_tokens) {
  __shared__ int64_t shared[kThreads];
  const int64_t b = blockIdx.x;  // b == batch: the tail block, writes cu[batch] and the padding
  int64_t q = 0, k = 0;
  for (int64_t i = threadIdx.x; i < b; i += blockDim.x) {
    q += this_time[i];
    k += static_cast<int64_t>(this_time[i]) + dec[i];
  }
  const int64_t start = block_sum(q, shared);
  const int64_t start_k = block_sum(k, shared);
  if (threadIdx.x == 0) {
    cu_q[b] = static_cast<int32_t>(start);
    cu_k[b] = static_cast<int32_t>(start_k);
  }
  if (b < batch) {
    const int64_t n = this_time[b];
    for (int64_t i = threadIdx.x; i < n && start + i < num_tokens; i += blockDim.x)
      batch_ids[start + i] = static_cast<int32_t>(b);
  } else {
    for (int64_t t = start + threadIdx.x; t < num_tokens; t += blockDim.x) batch_ids[t] = -1;
  }
}

__global__ void slot_mapping_kernel(const int32_t* block_tables, int64_t batch, int64_t max_blocks,
                                    const int32_t* batch_ids, const int64_t* positions, int64_t num_tokens,
                                    int64_t block_size, int64_t* slots) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < num_tokens) slots[t] = slot_of(block_tables, batch, max_blocks, batch_ids[t], positions[t], block_size);
}

}  // namespace

const char* get_position_ids_cuda(const int32_t* enc, const int32_t* dec, const int32_t* this_time,
                                  int64_t batch, int64_t* out, int64_t num_tokens, void* stream) {
  if (num_tokens == 0) return nullptr;
  const unsigned grid = static_cast<unsigned>(batch + 1);
  position_ids_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(enc, dec, this_time, batch,
                                                                               out, num_tokens);
  return launched();
}

const char* get_cu_seqlens_cuda(const int32_t* this_time, const int32_t* dec, int64_t batch,
                                int32_t* cu_q, int32_t* cu_k, int32_t* batch_ids, int64_t num_tokens,
                                void* stream) {
  const unsigned grid = static_cast<unsigned>(batch + 1);  // always >= 1: cu[0] = 0 needs a writer
  cu_seqlens_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(this_time, dec, batch, cu_q, cu_k,
                                                                             batch_ids, num_tokens);
  return launched();
}

const char* compute_slot_mapping_cuda(const int32_t* block_tables, int64_t batch, int64_t max_blocks,
                                      const int32_t* batch_ids, const int64_t* positions, int64_t num_tokens,
                                      int64_t block_size, int64_t* slots, void* stream) {
  if (num_tokens == 0) return nullptr;
  const unsigned grid = static_cast<unsigned>((num_tokens + kThreads - 1) / kThreads);
  slot_mapping_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      block_tables, batch, max_blocks, batch_ids, positions, num_tokens, block_size, slots);
  return launched();
}

}  // namespace paddle_mla
