// append_attention: arguments and per-element helpers shared by the CPU loops
// (append_attention_cpu.h) and the CUDA kernels (append_attention_kernels.cu). No framework headers.
//
// Semantics (docs/append_attention.md, paddle_mla/attention/gqa_reference.py):
//   (1) RoPE on q and k at `positions` (neox halves or interleaved pairs, over the first rot_dim dims);
//   (2) roped k and v go into the head-major paged caches [Hkv, num_blocks, block_size, D] at
//       (table[b, (g,) p / block_size], p % block_size); a block id of -1 is never dereferenced.
//       Per-head ranges (flat_cache): caches [num_blocks, block_size, D] shared by every head, with
//       head-wise tables whose ids are global (each head's ids lie in its own range of the one array);

//   (3) token t of request b at position p, query head h, KV head g = h / group, attends causally over
//       key positions j <= p of request b read from the cache; an SWA head (g >= Hkv - num_swa_heads)
//       sees j only if j < sink or j > p - window. How: swa_mask false (default) walks only the sinks and
//       the window (work O(sink + window)); swa_mask true walks every j <= p and masks the rest (the
//       seed's "uniform tables, walk the whole row and mask" baseline). Same outputs either way;
//   (4) out[t, h, :] in the dtype of q.
// A token is processed only when it lies in its request's rows of cu_seqlens_q and 0 <= p <
// seq_lens_k[b]; padding tokens (past cu_seqlens_q[B], or CUDA-graph rows with seq_lens_k 0)
// therefore write nothing, read nothing and get zeros.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define PMLA_HD __host__ __device__
#else
#define PMLA_HD
#endif

namespace paddle_mla {

enum class AttnDtype : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };
enum class RequestRows : int { kAll = 0, kOneToken = 1, kSeveral = 2 };

struct AppendAttentionArgs {
  const void* q;  // [T, Hq, D], token stride q_stride (elements); heads and dims contiguous
  const void* k;  // [T, Hkv, D], token stride k_stride
  const void* v;  // [T, Hkv, D], token stride v_stride
  int64_t q_stride, k_stride, v_stride;
  void* k_cache;  // [Hkv, num_blocks, block_size, D], or [num_blocks, block_size, D] (flat_cache), contiguous
  void* v_cache;
  const int32_t* block_tables;  // [B, max_blocks] (uniform) or [B, Hkv, max_blocks] (head_wise)
  bool head_wise;
  bool flat_cache;  // caches [num_blocks, block_size, D], table ids global (per-head ranges); needs head_wise
  const int32_t* cu_seqlens_q;        // [B + 1]
  const int32_t* seq_lens_k;          // [B]
  const int32_t* batch_id_per_token;  // [T]
  const int64_t* positions;           // [T]
  const float* cos_sin;               // [max_position, rot_dim]: cos | sin
  void* out;                          // [T, Hq, D] contiguous, dtype of q
  int64_t num_tokens, batch, num_q_heads, num_kv_heads, head_dim;
  int64_t num_blocks, block_size, max_blocks, max_position, rot_dim;
  float softmax_scale;
  bool neox;
  int64_t num_swa_heads, window, sink;
  bool swa_mask;  // SWA heads walk [0, p] and mask instead of skipping (benchmark baseline)
  // deterministic: true. Every token, one new token of a request included, takes the prefill kernel,
  // whose per-row sums walk key tiles from key 0 whatever else shares the block (the launcher sets
  // swa_mask too: a window start would move the tiles), so a row's bits do not depend on the batch,
  // the chunking or the step kind.
  bool batch_invariant;
  // batch_invariant only: > 0 cuts every row's keys into segments of this many (a multiple of 64) from
  // key 0, folded in a fixed order (append_attention_segments.cuh), so a decode row splits over blocks;
  // 0: one walk a row. The CPU op ignores it (one loop per token is batch-invariant already).
  int64_t invariant_split;
  // Which requests the prefill kernels' tiles cover (the launcher's, under batch_invariant): all of them,
  // only those with one new token, or only those with more; a step can then run its one-token rows on
  // the segment-split form and the rest on the row-split one.
  RequestRows rows;
  AttnDtype dtype;
};

// Index into block_tables of key/value position `pos` of request b, KV head g; -1 past the table.
PMLA_HD inline int64_t table_index(const AppendAttentionArgs& a, int64_t b, int64_t g, int64_t pos) {
  const int64_t col = pos / a.block_size;
  if (col < 0 || col >= a.max_blocks) return -1;
  const int64_t row = a.head_wise ? (b * a.num_kv_heads + g) : b;
  return row * a.max_blocks + col;
}

// A table entry as a block id: -1 ("no block") and out-of-range ids are -1.
PMLA_HD inline int64_t checked_block(const AppendAttentionArgs& a, int64_t id) {
  return (id >= 0 && id < a.num_blocks) ? id : -1;
}

// Block id of key/value position `pos` of request b, KV head g; -1 when the table has no block there.
// (The tensor-core kernels split it: they read the entry a tile before checking and using it.)
PMLA_HD inline int64_t block_of(const AppendAttentionArgs& a, int64_t b, int64_t g, int64_t pos) {
  const int64_t i = table_index(a, b, g, pos);
  return i < 0 ? -1 : checked_block(a, a.block_tables[i]);
}

// Element offset of (g, block, pos % block_size, 0) in a cache.
PMLA_HD inline int64_t cache_offset(const AppendAttentionArgs& a, int64_t g, int64_t block, int64_t pos) {
  return (((a.flat_cache ? 0 : g * a.num_blocks) + block) * a.block_size + pos % a.block_size) * a.head_dim;
}

// Request of token t, or -1 when the token is padding: outside its request's rows of cu_seqlens_q
// (so also past cu_seqlens_q[B]) or at a position outside [0, seq_lens_k[b]).
PMLA_HD inline int64_t token_request(const AppendAttentionArgs& a, int64_t t) {
  const int64_t b = a.batch_id_per_token[t];
  if (b < 0 || b >= a.batch || t < a.cu_seqlens_q[b] || t >= a.cu_seqlens_q[b + 1]) return -1;
  const int64_t p = a.positions[t];
  if (p < 0 || p >= a.seq_lens_k[b] || p >= a.max_position) return -1;
  return b;
}

PMLA_HD inline bool is_swa_head(const AppendAttentionArgs& a, int64_t g) {
  return a.num_swa_heads > 0 && g >= a.num_kv_heads - a.num_swa_heads;
}

// The key positions a query at position p sees, as up to two ranges [lo0, hi0) and [lo1, hi1):
// full heads [0, p]; SWA heads the sinks [0, min(sink, p + 1)) and the window (p - window, p].
// A split of the work walks "virtual" indices 0..count()-1 over the two ranges, so an SWA head's work
// is proportional to sink + window, never to the context.
struct KeyRanges {
  int64_t lo0, hi0, lo1, hi1;
  PMLA_HD int64_t count() const { return (hi0 - lo0) + (hi1 - lo1); }
  PMLA_HD int64_t position(int64_t i) const { return i < hi0 - lo0 ? lo0 + i : lo1 + (i - (hi0 - lo0)); }
};

// The raw table entry of virtual key i of `keys` (request b, KV head g), unchecked (checked_block()
// validates it where it is used); -1 when i >= end or past the table. The tensor-core kernels read it
// a tile or two before they use it, so its latency overlaps a tile of MMAs.
PMLA_HD inline int32_t raw_table_entry(const AppendAttentionArgs& a, int64_t b, int64_t g, const KeyRanges& keys,
                                       int64_t i, int64_t end) {
  if (i >= end) return -1;
  const int64_t t = table_index(a, b, g, keys.position(i));
  return t >= 0 ? a.block_tables[t] : -1;
}

// Split `split` of a decode (row, KV head)'s `nvis` visible keys, `chunk` keys per split (whole tiles;
// decode_split_keys sizes it for the launch): [lo, hi), empty past the row's last split. Every decode
// kernel splits this way, so the merge reads the same windows whichever kernel wrote them.
struct SplitWindow {
  int64_t lo, hi;
};
PMLA_HD inline SplitWindow split_window(int64_t nvis, int64_t chunk, int64_t split) {
  const int64_t lo = split * chunk;
  const int64_t end = lo + chunk;
  return {lo, nvis < end ? nvis : end};
}

PMLA_HD inline KeyRanges key_ranges(const AppendAttentionArgs& a, int64_t g, int64_t p) {
  if (!is_swa_head(a, g) || a.swa_mask) return {0, p + 1, 0, 0};  // swa_mask: the caller masks (key_visible)
  const int64_t sink_hi = a.sink < p + 1 ? a.sink : p + 1;
  const int64_t sinks = sink_hi > 0 ? sink_hi : 0;
  int64_t win_lo = p - a.window + 1;
  if (win_lo < sinks) win_lo = sinks;  // keys already counted as sinks are not counted twice
  const int64_t win_hi = p + 1 > win_lo ? p + 1 : win_lo;
  return {0, sinks, win_lo, win_hi};
}

// The contract's rule (3): whether a query at position p of KV head g sees key position j.
PMLA_HD inline bool key_visible(const AppendAttentionArgs& a, int64_t g, int64_t p, int64_t j) {
  return j <= p && (!is_swa_head(a, g) || j < a.sink || j > p - a.window);
}

// RoPE of the pair (x1, x2) at frequency i of position p: (x1 c - x2 s, x2 c + x1 s).
PMLA_HD inline void rope_pair(const AppendAttentionArgs& a, int64_t p, int64_t i, float& x1, float& x2) {
  const float* row = a.cos_sin + p * a.rot_dim;
  const float c = row[i], s = row[a.rot_dim / 2 + i];
  const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
  x1 = y1;
  x2 = y2;
}

// Indices of the two dims rotated together at frequency i (i < rot_dim / 2).
PMLA_HD inline void rope_dims(const AppendAttentionArgs& a, int64_t i, int64_t& d1, int64_t& d2) {
  if (a.neox) {
    d1 = i;
    d2 = i + a.rot_dim / 2;
  } else {
    d1 = 2 * i;
    d2 = 2 * i + 1;
  }
}

}  // namespace paddle_mla

namespace paddle_mla {

// Shape and value checks shared by the bindings: nullptr when `a` is valid, else what is wrong.
inline const char* check_append_attention_args(const AppendAttentionArgs& a) {
  if (a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0) return "num_q_heads must be a multiple of num_kv_heads";
  if (a.head_dim <= 0) return "head_dim must be positive";
  if (a.rot_dim < 0 || a.rot_dim > a.head_dim || a.rot_dim % 2 != 0) return "rot_dim must be even and <= head_dim";
  if (a.block_size <= 0) return "block_size must be positive";
  if (a.flat_cache && !a.head_wise) return "a flat [num_blocks, block_size, D] cache needs head-wise [B, Hkv, M] tables";
  if (a.num_swa_heads < 0 || a.num_swa_heads > a.num_kv_heads) return "num_swa_heads must be in [0, num_kv_heads]";
  if (a.num_swa_heads > 0 && (a.window < 0 || a.sink < 0)) return "window and sink must be >= 0";
  if (a.q_stride < a.num_q_heads * a.head_dim || a.k_stride < a.num_kv_heads * a.head_dim ||
      a.v_stride < a.num_kv_heads * a.head_dim)
    return "q, k, v token strides are smaller than a token";
  if (a.invariant_split < 0 || a.invariant_split % 64 != 0) return "invariant_split must be 0 or a multiple of 64";
  return nullptr;
}

}  // namespace paddle_mla
