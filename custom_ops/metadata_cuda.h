// Per-step metadata ops, CUDA launchers: declarations only, so that the framework bindings (built
// by a plain C++ compiler) need no CUDA header. Definitions: metadata_kernels.cu.
//
// `stream` is the framework's cudaStream_t passed as void*. Each launcher enqueues its kernels on
// that stream without synchronising or allocating (CUDA-graph capturable) and returns nullptr, or
// the CUDA error string when a launch failed. Inputs and outputs are device pointers with the
// dtypes of metadata_cpu.h.
#pragma once

#include <cstdint>

namespace paddle_mla {

const char* get_position_ids_cuda(const int32_t* enc, const int32_t* dec, const int32_t* this_time,
                                  int64_t batch, int64_t* out, int64_t num_tokens, void* stream);

const char* get_cu_seqlens_cuda(const int32_t* this_time, const int32_t* dec, int64_t batch,
                                int32_t* cu_q, int32_t* cu_k, int32_t* batch_ids,
                                int64_t num_tokens, void* stream);

const char* compute_slot_mapping_cuda(const int32_t* block_tables, int64_t batch, int64_t max_blocks,
                                      const int32_t* batch_ids, const int64_t* positions,
                                      int64_t num_tokens, int64_t block_size, int64_t* slots,
                                      void* stream);

}  // namespace paddle_mla
