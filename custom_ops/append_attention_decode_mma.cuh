// append_attention, tensor-core decode with O in registers (bf16 / fp16 caches, head_dim 64, 80, 96 or
// 128, group <= 16). Same grid, split rule, workspace layout and merge_kernel as decode_tc_kernel (the
// WMMA kernel, which keeps head_dim > 128 and is selectable for measurement).
//
// Why a second tensor-core decode: the WMMA kernel keeps S, P and O in shared memory (WMMA fragments
// have no documented element mapping, so the per-row rescale of O needs them there) and pays four
// block barriers per tile for it; it reached 73% of copy bandwidth on an H100 (docs/benchmarks_history.md,
// "GQA decode on tensor cores, and head-wise SWA"). Here each of the 4 warps takes its own 16 keys of every 64-key tile (split-K inside the
// block), so a warp's S, P and O never leave its registers: S = Q K^T and O += P V with mma.sync
// m16n8k16 (the group's query heads, zero-padded to 16, are the M rows; Q stays in registers for the
// whole split), the online softmax runs on the accumulators, and P goes from the S accumulators to the
// A operand directly. A tile costs one block barrier (data landed, previous stage free); the four
// warps' (m, l, O) merge once, through shared memory, at the end of the split.
// K/V tiles stream in through the block table with 16-byte cp.async, NST stages deep (NST - 1 tiles in
// flight during a tile's MMAs); offsets are planned by one thread per key a stage ahead of their copy
// (-1: past the split or no block: zero-filled, never dereferenced; a key masked in swa_mask mode is
// read and masked, see read_offset). A tile whose keys are consecutive cache rows (a tile inside one
// block, the common case) is copied as one linear range (copy_contiguous_rows), others row by row from
// their planned offsets. Plans have NST + 1 slots: those of the tiles in flight, the current tile's
// validity bits, the new plan. Included by append_attention_kernels.cu.
#pragma once

#include "append_attention_device.cuh"
#include "append_attention_mma.cuh"

namespace paddle_mla {
namespace attn {

constexpr int kDmKeys = 64;   // keys per tile: 16 per warp
constexpr int kDmWarps = 4;

// Shared-memory layout (host and device compute it alike): Q rows (16 x (D + 8) elements), NST stages
// of K and V tiles (rows of D + 8 elements: an ldmatrix's 8 rows fall in distinct banks), NST + 1 plan
// slots (offsets, validity bits, contiguous-run bases). After the key loop the stages hold the warps' fp32 (O, m, l).
struct DmLayout {
  int pitch;
  size_t q, kv, stage, offs, valid, runs, total;
  PMLA_HD static size_t up(size_t x) { return (x + 127) / 128 * 128; }
  PMLA_HD DmLayout(int D, int elem, int nst) {
    pitch = D + 8;
    q = 0;
    kv = up(static_cast<size_t>(16) * pitch * elem);
    stage = up(static_cast<size_t>(kDmKeys) * pitch * elem);
    offs = kv + 2 * static_cast<size_t>(nst) * stage;
    valid = up(offs + static_cast<size_t>(nst + 1) * kDmKeys * sizeof(int64_t));
    runs = up(valid + static_cast<size_t>(nst + 1) * (kDmKeys / 32) * sizeof(uint32_t));
    total = up(runs + static_cast<size_t>(nst + 1) * (kDmKeys / 32) * sizeof(int64_t));
  }
};

template <typename T, int D, int NST>
__global__ void __launch_bounds__(32 * kDmWarps, 3) decode_mma_kernel(AppendAttentionArgs a, int splits, int target,
                                                                   float* ws_o, float* ws_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int TK = kDmKeys, KD = D / 16, ND = D / 8, P = D + 8, E = static_cast<int>(sizeof(T));
  constexpr int SLOTS = NST + 1;
  static_assert(D % 16 == 0 && D <= 128, "head_dim: whole MMA k-steps, O within the register budget");
  static_assert(TK == 16 * kDmWarps, "each warp owns 16 keys of a tile");
  const int64_t b = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int32_t t0 = a.cu_seqlens_q[b];
  if (a.cu_seqlens_q[b + 1] - t0 != 1 || token_request(a, t0) != b) return;  // not a decode row, or padding
  const int group = static_cast<int>(a.num_q_heads / a.num_kv_heads);
  const int64_t p = a.positions[t0];
  const KeyRanges keys = key_ranges(a, g, p);
  const int64_t nvis = keys.count();
  const int64_t chunk = splits > 1 ? decode_split_keys(a, splits, target, TK, nvis) : nvis;
  const SplitWindow win = split_window(nvis, chunk, split);
  const int64_t lo = win.lo, hi = win.hi;
  const int64_t head_row = b * a.num_q_heads + g * group;  // first (request, query head) row
  T* out = static_cast<T*>(a.out) + (t0 * a.num_q_heads + g * group) * D;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  if (lo >= hi) {  // nothing to see in this split (every split, when an SWA head has no window)
    if (splits > 1) {
      if (tid < group) ws_lse[(head_row + tid) * splits + split] = -INFINITY;
    } else {
      for (int e = tid; e < group * D; e += blockDim.x) out[e] = from_f<T>(0.0f);
    }
    return;
  }
  extern __shared__ __align__(128) uint8_t dm_smem[];
  const DmLayout L(D, E, NST);
  T* qs = reinterpret_cast<T*>(dm_smem + L.q);
  int64_t* offs = reinterpret_cast<int64_t*>(dm_smem + L.offs);
  uint32_t* valid = reinterpret_cast<uint32_t*>(dm_smem + L.valid);
  int64_t* runs = reinterpret_cast<int64_t*>(dm_smem + L.runs);
  auto k_stage = [&](int st) { return reinterpret_cast<T*>(dm_smem + L.kv + 2 * st * L.stage); };
  auto v_stage = [&](int st) { return reinterpret_cast<T*>(dm_smem + L.kv + (2 * st + 1) * L.stage); };

  // Q rows roped, unscaled, in T (the scale goes onto the fp32 scores); rows >= group are zeros. Every
  // load first, then every store: a loop that stores each element before loading the next waits one
  // memory latency per element (22% of the stall samples of 16-tile splits, ncu, H200).
  const T* qrow0 = static_cast<const T*>(a.q) + t0 * a.q_stride + g * group * D;
  constexpr int QE = 16 * D / (32 * kDmWarps);
  static_assert(16 * D % (32 * kDmWarps) == 0, "whole Q elements per thread");
  float qv[QE];
#pragma unroll
  for (int k = 0; k < QE; ++k) {
    const int e = tid + k * 32 * kDmWarps, r = e / D, d = e - r * D;
    qv[k] = r < group ? roped(a, qrow0 + r * D, d, p) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < QE; ++k) {
    const int e = tid + k * 32 * kDmWarps, r = e / D, d = e - r * D;
    qs[r * P + d] = from_f<T>(qv[k]);
  }
  // The raw table entry of this planning thread's key in the tile at virtual index `first`, read
  // a tile before plan() checks and uses it.
  auto fetch = [&](int64_t first) -> int32_t {
    return tid < TK ? raw_table_entry(a, b, g, keys, first + tid, hi) : -1;
  };
  // Offsets of the keys of that tile (-1: masked) and their validity bits, into plan slot `slot`.
  auto plan = [&](int64_t first, int slot, int32_t raw) {
    if (tid < TK) {
      const int64_t i = first + tid;
      int64_t off = -1;
      if (i < hi) {
        const int64_t j = keys.position(i);
        const int64_t blk = checked_block(a, raw);
        // swa_mask (the uniform-table baseline) walks every key of an SWA head and reads it: those
        // outside its sinks and window are masked here (always visible in skip mode)
        if (blk >= 0) off = cache_offset(a, g, blk, j);
        if (off >= 0 && !key_visible(a, g, p, j)) off = masked_read(off);
      }
      offs[slot * TK + tid] = off;
      const unsigned ok = __ballot_sync(0xffffffffu, off >= 0);
      // a run: this warp's keys are read (visible or masked) from consecutive cache rows base + n
      const int64_t rel = off == -1 ? -1 : read_offset(off) - static_cast<int64_t>(tid) * D;
      const int64_t base = __shfl_sync(0xffffffffu, rel, 0);
      const bool run = __all_sync(0xffffffffu, rel == base) && base >= 0;
      if (lane == 0) {
        valid[slot * (TK / 32) + warp] = ok;
        runs[slot * (TK / 32) + warp] = run ? base : -1;
      }
    }
  };
  auto issue = [&](int64_t first, int slot, int st) {
    if (first < hi) {
      const int64_t base = runs[slot * (TK / 32)];
      bool whole = base >= 0;
#pragma unroll
      for (int w = 1; w < TK / 32; ++w) whole = whole && runs[slot * (TK / 32) + w] == base;
      if (whole) {  // the tile is one run of cache rows (inside one block): the linear copy
        copy_contiguous_rows<T, D, TK, 32 * kDmWarps>(a, base, k_stage(st), v_stage(st), P, tid);
      } else {
        copy_planned_rows<T, D, TK, 32 * kDmWarps>(a, offs + slot * TK, TK, k_stage(st), v_stage(st), P, tid,
                                                     32 * kDmWarps);
      }
    } else {
      __pipeline_commit();  // an empty group keeps wait_prior(NST - 2) meaning "the current tile landed"
    }
  };

  // Lane addresses (shared-space bytes) of the ldmatrix rows: Q (A operand), this warp's 16 keys of a K
  // tile (B operand, no transpose: K rows are its columns) and of a V tile (B by ldmatrix.trans).
  const uint32_t q_addr = smem_u32(qs) + ((lane % 16) * P + (lane / 16) * 8) * E;
  const int k_off = ((16 * warp + lane % 8 + (lane / 16) * 8) * P + ((lane / 8) % 2) * 8) * E;
  const int v_off = ((16 * warp + lane % 8 + ((lane / 8) % 2) * 8) * P + (lane / 16) * 8) * E;
  const int col0 = (lane % 4) * 2;  // first key (S) / dim (O) column of this thread in an 8-wide block

  // Pipeline, one barrier a tile: at the top of iteration `it` tile it has landed, and every warp is
  // done with tile it - 1, whose stage then takes tile it + NST - 1 (planned an iteration earlier);
  // tile it + NST is planned after the barrier from table entries read one iteration earlier.
  for (int s = 0; s < NST; ++s) plan(lo + s * TK, s, fetch(lo + s * TK));
  int32_t raw_next = fetch(lo + NST * TK);  // for the plan of the first iteration
  __syncthreads();  // Q rows and the first plans visible
  for (int s = 0; s < NST - 1; ++s) issue(lo + s * TK, s, s);
  uint32_t qf[KD][4];  // Q for the whole split
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) ldsm_x4(qf[kk], q_addr + kk * 16 * E);
  float o[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lane / 4 and lane / 4 + 8 (log2 units)
  const float qk_scale = a.softmax_scale * kLog2e;

  int it = 0;
  for (int64_t first = lo; first < hi; first += TK, ++it) {
    const int cur = it % NST, slot = it % SLOTS;
    __pipeline_wait_prior(NST - 2);  // tile it landed (tiles it + 1 .. it + NST - 2 may still fly)
    __syncthreads();                 // ... for every thread; stage (it + NST - 1) % NST is free
    issue(first + (NST - 1) * TK, (it + NST - 1) % SLOTS, (it + NST - 1) % NST);
    if (first + NST * TK < hi) plan(first + NST * TK, (it + NST) % SLOTS, raw_next);
    raw_next = fetch(first + (NST + 1) * TK);
    const uint32_t bits = (valid[slot * (TK / 32) + warp / 2] >> (16 * (warp % 2))) & 0xffffu;
    if (bits == 0u) continue;  // none of this warp's 16 keys is visible (past the split, holes)
    const uint32_t kt = smem_u32(k_stage(cur)) + k_off, vt = smem_u32(v_stage(cur)) + v_off;
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {  // S = Q K^T over this warp's 16 keys
      uint32_t kb[4];
      ldsm_x4(kb, kt + kk * 16 * E);
      mma16816_x2<T>(s[0], s[1], qf[kk], kb);
    }
    if (bits != 0xffffu) {  // masked keys: -inf (their K/V rows are zeros, never garbage)
#pragma unroll
      for (int nk = 0; nk < 2; ++nk) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!((bits >> (nk * 8 + col0 + (e & 1))) & 1u)) s[nk][e] = -INFINITY;
      }
    }
    float keep[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // online softmax of row lane / 4 + 8 h (4 lanes share a row)
      float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx * qk_scale);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far: 2^-inf = 0, no NaN
      keep[h] = fast_exp2(m[h] - base);
      m[h] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nk = 0; nk < 2; ++nk) {
#pragma unroll
        for (int x = 2 * h; x < 2 * h + 2; ++x) {
          s[nk][x] = fast_exp2(fmaf(s[nk][x], qk_scale, -base));
          sum += s[nk][x];
        }
      }
      l[h] = l[h] * keep[h] + sum;
    }
    // O is rescaled only when some row's max moved (keep 1 multiplies by one, so the bits are the same):
    // past the first tiles the max rarely moves, and the 4 x ND multiplies are about 64 of the 230
    // instructions of a warp's tile of arithmetic.
    if (__any_sync(0xffffffffu, keep[0] != 1.0f || keep[1] != 1.0f)) {
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) {
        o[nd][0] *= keep[0];
        o[nd][1] *= keep[0];
        o[nd][2] *= keep[1];
        o[nd][3] *= keep[1];
      }
    }
    uint32_t pa[4];  // P as the A operand of one k16 step: the two n8 blocks' accumulators
    pa[0] = pack2<T>(s[0][0], s[0][1]);
    pa[1] = pack2<T>(s[0][2], s[0][3]);
    pa[2] = pack2<T>(s[1][0], s[1][1]);
    pa[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < KD; ++dp) {  // O += P V
      uint32_t vb[4];
      ldsm_x4_trans(vb, vt + dp * 16 * E);
      mma16816_x2<T>(o[2 * dp], o[2 * dp + 1], pa, vb);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // the stages are free: they take the warps' partial results
  constexpr int OP = D + 4;  // fp32 O row pitch
  float* mo = reinterpret_cast<float*>(dm_smem + L.kv);  // [warp][16 rows][OP]
  float* mm = mo + kDmWarps * 16 * OP;                     // [warp][16] running max (log2 units)
  float* ml = mm + kDmWarps * 16;                          // [warp][16] row sums
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = lane / 4 + 8 * h;
    float* dst = mo + (warp * 16 + r) * OP + col0;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(o[nd][2 * h], o[nd][2 * h + 1]);
    if (lane % 4 == 0) {
      mm[warp * 16 + r] = m[h];
      ml[warp * 16 + r] = sum;
    }
  }
  __syncthreads();
  for (int e = tid; e < group * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDmWarps; ++w) mx = fmaxf(mx, mm[w * 16 + r]);
    float lsum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDmWarps; ++w) {
        const float f = exp2f(mm[w * 16 + r] - mx);  // a warp that saw nothing: 2^-inf = 0
        lsum += f * ml[w * 16 + r];
        acc += f * mo[(w * 16 + r) * OP + d];
      }
    }
    const float val = lsum > 0.0f ? acc / lsum : 0.0f;
    if (splits == 1) {
      out[r * D + d] = from_f<T>(val);
    } else {
      ws_o[((head_row + r) * splits + split) * D + d] = val;
      if (d == 0) ws_lse[(head_row + r) * splits + split] = lsum > 0.0f ? mx + log2f(lsum) : -INFINITY;
    }
  }
#endif
}

}  // namespace attn
}  // namespace paddle_mla
