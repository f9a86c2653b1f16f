// Launch helpers shared by every CUDA source of the ops (metadata, append_attention, mla_decode): the
// last launch's error as text, the opt-in to more than 48 KB of dynamic shared memory, the SM count
// and compute capability, and programmatic dependent launch. Framework-neutral; nvcc alone compiles
// its includers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

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

// The current device's SM count (132, an H100's, when the query fails) and compute capability as
// major * 10 + minor (0 when it fails). Launchers ask every call; the attributes are read once per
// device and thread.
struct DeviceInfo {
  int sms = 132, cc = 0;
};
inline DeviceInfo device_info() {
  thread_local int known = -1;
  thread_local DeviceInfo info;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DeviceInfo{};
  if (dev != known) {
    int n = 0, major = 0, minor = 0;
    info = DeviceInfo{};
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0) info.sms = n;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
      info.cc = major * 10 + minor;
    known = dev;
  }
  return info;
}
inline int sm_count() { return device_info().sms; }

// Programmatic dependent launch (PDL, sm_90+). A kernel launched by `launch_pdl` may be scheduled
// while the kernel before it on the stream still runs, once every block of that one has called
// `launch_dependents` (or exited): its launch latency and prologue then overlap the other's tail. It
// must call `grid_dependency_wait` before it reads what an earlier kernel wrote or writes what one
// reads; the wait returns when those kernels have completed and their memory is visible. Both are
// no-ops in a kernel launched without the attribute, and below sm_90.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launches take the PDL attribute: on unless PADDLE_MLA_PDL=0 (a measurement switch, read
// per call). CUDA graphs capture it as a programmatic edge.
inline bool pdl_enabled() {
  const char* v = std::getenv("PADDLE_MLA_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// `kernel<<<grid, block, smem, stream>>>(args...)`, with programmatic stream serialization allowed
// where `pdl_enabled()`; nullptr or the error text.
template <typename... Params, typename... Args>
const char* launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace paddle_mla
