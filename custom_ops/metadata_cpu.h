// Per-step metadata ops, CPU kernels: plain loops over raw arrays, no framework headers.
//
// Semantics are those of paddle_mla/ops/reference.py (the oracle).
// Inputs have fixed dtypes (the bindings cast): sequence lengths, block tables and batch ids are
// int32, positions int64. Every output element is written, so outputs may be uninitialised.
#pragma once

#include <cstdint>

// The per-element helpers are shared with the CUDA kernels (metadata_kernels.cu).
#ifdef __CUDACC__
#define PMLA_HOST_DEVICE __host__ __device__
#else
#define PMLA_HOST_DEVICE
#endif

namespace paddle_mla {

// Tokens request b contributes this step: its prompt chunk when it is prefilling, else its decode
// tokens when it has a cache, else none.
PMLA_HOST_DEVICE inline int64_t step_tokens(int32_t enc, int32_t dec, int32_t this_time) {
  return enc > 0 ? enc : (dec > 0 ? this_time : 0);
}

// out[num_tokens]: dec_b + i for the i-th token of request b, 0 past the last real token.
inline void get_position_ids_cpu(const int32_t* enc, const int32_t* dec, const int32_t* this_time,
                                 int64_t batch, int64_t* out, int64_t num_tokens) {
  int64_t t = 0;
  for (int64_t b = 0; b < batch && t < num_tokens; ++b) {
    const int64_t n = step_tokens(enc[b], dec[b], this_time[b]);
    for (int64_t i = 0; i < n && t < num_tokens; ++i, ++t) out[t] = dec[b] + i;
  }
  for (; t < num_tokens; ++t) out[t] = 0;
}

// cu_q[batch+1] = cumsum(this), cu_k[batch+1] = cumsum(this + dec) (counts the cached prefix),
// batch_ids[num_tokens] = request of each token, -1 past the last one.
inline void get_cu_seqlens_cpu(const int32_t* this_time, const int32_t* dec, int64_t batch,
                               int32_t* cu_q, int32_t* cu_k, int32_t* batch_ids,
                               int64_t num_tokens) {
  int64_t q = 0, k = 0, t = 0;
  cu_q[0] = 0;
  cu_k[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < this_time[b] && t < num_tokens; ++i, ++t) batch_ids[t] = static_cast<int32_t>(b);
    q += this_time[b];
    k += static_cast<int64_t>(this_time[b]) + dec[b];
    cu_q[b + 1] = static_cast<int32_t>(q);
    cu_k[b + 1] = static_cast<int32_t>(k);
  }
  for (; t < num_tokens; ++t) batch_ids[t] = -1;
}

// One slot: block_tables[b, pos / block_size] * block_size + pos % block_size; -1 for padding
// tokens (b < 0). The column is clamped to the table width as in the reference; an out-of-range
// request id (never produced by get_cu_seqlens) also gives -1 instead of reading out of bounds.
PMLA_HOST_DEVICE inline int64_t slot_of(const int32_t* block_tables, int64_t batch, int64_t max_blocks, int32_t b,
                       int64_t pos, int64_t block_size) {
  if (b < 0 || b >= batch || max_blocks == 0) return -1;
  int64_t col = pos / block_size;
  if (col > max_blocks - 1) col = max_blocks - 1;
  const int64_t block = block_tables[b * max_blocks + col];
  return block * block_size + pos % block_size;
}

inline void compute_slot_mapping_cpu(const int32_t* block_tables, int64_t batch, int64_t max_blocks,
                                     const int32_t* batch_ids, const int64_t* positions,
                                     int64_t num_tokens, int64_t block_size, int64_t* slots) {
  for (int64_t t = 0; t < num_tokens; ++t)
    slots[t] = slot_of(block_tables, batch, max_blocks, batch_ids[t], positions[t], block_size);
}

}  // namespace paddle_mla
