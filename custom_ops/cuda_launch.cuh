// Host-side launch helpers shared by every CUDA source of the ops (metadata, append_attention,
// mla_decode): the last launch's error as text, the opt-in to more than 48 KB of dynamic shared
// memory, and the SM count. Framework-neutral; nvcc alone compiles its includers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace paddle_mla {

// nullptr when the last launch on this thread succeeded, else its error text.
inline const char* launched() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Lets `kernel` take `bytes` of dynamic shared memory where that and its static shared memory pass the
// 48 KB default (dynamic bytes alone under 48 KB can still need it: the launch then fails with "invalid
// argument"). Host calls, not stream operations, so they are also allowed while a CUDA graph is captured.
template <typename K>
const char* allow_smem(K kernel, size_t bytes) {
  cudaFuncAttributes attr{};
  const size_t fixed = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.sharedSizeBytes : 0;
  if (bytes + fixed <= 48 * 1024) return nullptr;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// SMs of the current device (132, an H100's, when the query fails).
inline int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 132;
  return n > 0 ? n : 132;
}

}  // namespace paddle_mla
