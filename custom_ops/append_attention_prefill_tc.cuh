// append_attention, tensor-core prefill / extend kernel (bf16 / fp16 caches, head_dim 64, 80, 96 or 128),
// flash-attention-2 style. Requests with >= 2 new tokens (all under batch_invariant), as prefill_kernel
// (which keeps fp32 caches, other head dims and pre-sm80 GPUs).
//
// One block of W warps per (query tile, KV head); a tile is 16 MF W rows, row r being query q0 + r / group
// and query head g * group + r % group of one request, so the group's heads share every K/V tile. Warp w
// owns rows 16 MF w .. 16 MF (w + 1) - 1 (MF 16-row M fragments) for the whole key loop (FA2's split: no
// cross-warp reduction). The launcher uses W = 4, MF = 2 (128 rows; docs/benchmarks_history.md,
// "GQA prefill on tensor cores", compares).
// Per tile of kPtcKeys keys (cp.async, double buffered, one block barrier a tile; offsets planned two
// tiles ahead by one thread per key, from block-table entries read a tile before that; masked / -1
// rows are zero-filled by copy_planned_rows):
//   S = Q K^T with mma.sync m16n8k16 (Q and K fragments by ldmatrix from shared memory; with MF = 1 Q
//   stays in registers for the whole loop), fp32 accumulators in registers;
//   mask (only tiles that need it: SWA heads, holes, the causal diagonal), online softmax in fp32 on the
//   accumulators (a row's 4 owners reduce with two shuffles), scores in log2 units;
//   P packed to the cache dtype straight from the S accumulators: the m16n8 C layout of two adjacent
//   key blocks is the m16k16 A layout, so P never touches shared memory;
//   O += P V with mma.sync (V fragments by ldmatrix.trans), O in fp32 registers, rescaled in place.
// Why mma.sync and not WMMA (the decode kernel's): WMMA fragments have no documented element mapping,
// so the per-row rescale of O and the masking would need a shared-memory round trip per tile.
// Which keys a block walks: [0, last] for a full head, the sinks and (first - window, last] for an SWA
// head (swa_mask: [0, last]), exactly as prefill_kernel; each score is masked by the contract's rule.
// Blocks take tiles from the last (the longest causal rows) to the first, so the tail of the grid is
// short work. Included by append_attention_kernels.cu.
#pragma once

#include <climits>
#include <type_traits>

#include "append_attention_device.cuh"
#include "append_attention_mma.cuh"
#include "append_attention_prefill.cuh"
#include "append_attention_segments.cuh"

namespace paddle_mla {
namespace attn {

constexpr int kPtcKeys = 64;  // keys per tile

// Shared-memory layout of one block (host and device compute it alike): Q rows, two stages of K and V
// tiles (rows of D + 8 elements: the 8 rows of an ldmatrix fall in distinct banks), and three slots of
// per-key plans (offset, position, hole flags): while tile it is computed, slot it % 3 holds its mask,
// (it + 1) % 3 the plan being copied and (it + 2) % 3 the one being written.
// `exchange`: bytes the Q region must also hold once Q is in registers (the dims-split form's S tiles).
struct PtcLayout {
  int pitch;
  size_t q, kv, stage, offs, kpos, dense, total;
  PMLA_HD static size_t up(size_t x) { return (x + 127) / 128 * 128; }
  PMLA_HD PtcLayout(int D, int elem, int rows, size_t exchange = 0) {
    pitch = D + 8;
    q = 0;
    const size_t q_bytes = static_cast<size_t>(rows) * pitch * elem;
    kv = up(q_bytes > exchange ? q_bytes : exchange);
    stage = up(static_cast<size_t>(kPtcKeys) * pitch * elem);
    offs = kv + 4 * stage;
    kpos = up(offs + 3 * kPtcKeys * sizeof(int64_t));
    dense = up(kpos + 3 * kPtcKeys * sizeof(int32_t));
    total = up(dense + 3 * (kPtcKeys / 32) * sizeof(int32_t));
  }
};

// Bytes of the dims-split form's S exchange: a tile's MF x kPtcKeys / 8 fp32 C fragments, 16 bytes a lane.
template <bool DSPLIT, int MF>
PMLA_HD constexpr size_t ptc_exchange_bytes() {
  return DSPLIT ? static_cast<size_t>(MF) * (kPtcKeys / 8) * 32 * 16 : 0;
}

// D: head_dim (compile time: the fragment loops unroll into one basic block); W warps of MF 16-row M
// fragments each (MF = 2: FA2's split, each K / V fragment read from shared memory feeds two MMAs; Q is
// then re-read by ldmatrix per tile instead of held in registers, for the register budget).
// DSPLIT: the W warps share one set of 16 MF rows (MF = 1: Q in registers) and split the work instead:
// warp w computes S = Q K^T for the w-th W-th of the tile's keys with the row-split form's MMA chains,
// the C fragments meet in the Q region (free once Q is in registers; one barrier a tile), and every
// warp then runs the rows' softmax on the whole S (the row-split warp's instructions) and O += P V for
// its D / W columns. A row's bits are therefore those of the row-split kernel; what changes is that a
// block of few real rows (decode under batch_invariant: one query, `group` rows) keeps W warps busy
// instead of one, without W copies of Q K^T (docs/determinism.md).
// SEG (batch_invariant with a.invariant_split > 0, append_attention_segments.cuh): the keys fall in fixed
// segments, each with a fresh online softmax, folded left to right. Row-split: folded here, at each
// boundary, into a second O (FoldedSegments: registers at MF = 1, local memory at MF = 2). DSPLIT:
// block z of the grid's third axis walks segment z alone and writes its (m, l, O) to `seg_ws` (`segs`
// a row at most) for segment_merge_kernel, or the output itself when the row has one segment.
template <typename T, int D, int W, int MF, bool DSPLIT = false, bool SEG = false>
__global__ void __launch_bounds__(32 * W, 1) prefill_tc_kernel(AppendAttentionArgs a, float* seg_ws, int segs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int TK = kPtcKeys, WR = 16 * MF, ROWS = DSPLIT ? WR : WR * W, KD = D / 16, NK = TK / 8,
                P = D + 8;
  constexpr int KDW = DSPLIT ? KD / W : KD, NDW = 2 * KDW;  // O's 16-dim k-steps / 8-dim blocks of a warp
  static_assert(W >= TK / 32, "the planning threads are whole warps");
  static_assert(D % 16 == 0, "head_dim is a whole number of MMA k-steps");
  static_assert(!DSPLIT || KD % W == 0, "DSPLIT: the warps split O's dims evenly");
  static_assert(!DSPLIT || (MF == 1 && (NK / 2) % W == 0), "DSPLIT: Q in registers, S's key pairs split evenly");
  constexpr int NPW = DSPLIT ? NK / 2 / W : NK / 2;  // S's 16-key pairs this warp computes
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int group = static_cast<int>(a.num_q_heads / a.num_kv_heads);
  const int queries = ROWS / group;
  const int64_t g = blockIdx.y;
  const int r0 = DSPLIT ? 0 : WR * warp;  // this warp's first row
  __shared__ int64_t s_req, s_q0, s_tok[ROWS], s_pos[ROWS];
  __shared__ int32_t s_pmin[W], s_pmax[W];
  if (warp == 0) {
    int64_t req, q0;
    find_tile(a, static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x, queries, req, q0);
    if (lane == 0) {
      s_req = req;
      s_q0 = q0;
    }
  }
  __syncthreads();
  const int64_t b = s_req, q0 = s_q0;
  if (b < 0) return;
  const int64_t t_begin = a.cu_seqlens_q[b], n = a.cu_seqlens_q[b + 1] - t_begin;
  for (int r = tid; r < ROWS; r += blockDim.x) {
    const int64_t i = r / group, t = t_begin + q0 + i;
    const bool real = i < queries && q0 + i < n && token_request(a, t) == b;
    s_tok[r] = real ? t : -1;
    s_pos[r] = real ? a.positions[t] : 0;
  }
  __syncthreads();
  // This thread's rows: lane / 4 + 8 h of the warp's M fragment f; their positions (-1: padding), in
  // 32 bits for the register budget (positions index cos_sin rows: far below 2^31).
  int32_t pos[MF][2];
  int32_t wmin = INT_MAX, wmax = -1;
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = s_tok[r0 + 16 * f + lane / 4 + 8 * h];
      pos[f][h] = t >= 0 ? static_cast<int32_t>(a.positions[t]) : -1;
      if (pos[f][h] >= 0) wmin = min(wmin, pos[f][h]);
      wmax = max(wmax, pos[f][h]);
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
  }
  if (lane == 0) {
    s_pmin[warp] = wmin;
    s_pmax[warp] = wmax;
  }
  extern __shared__ __align__(128) uint8_t ptc_smem[];
  const PtcLayout L(D, static_cast<int>(sizeof(T)), ROWS, ptc_exchange_bytes<DSPLIT, MF>());
  T* qs = reinterpret_cast<T*>(ptc_smem + L.q);
  __syncthreads();
  int64_t pmin = INT_MAX, pmax = -1;
  for (int w = 0; w < W; ++w) {
    pmin = min(pmin, static_cast<int64_t>(s_pmin[w]));
    pmax = max(pmax, static_cast<int64_t>(s_pmax[w]));
  }
  if (pmax < 0) return;  // no valid row (uniform over the block)
  const bool swa = is_swa_head(a, g);
  KeyRanges keys{0, pmax + 1, 0, 0};
  if (swa && !a.swa_mask) {  // swa_mask: walk [0, pmax], the mask below hides the rest
    const int64_t sinks = max(static_cast<int64_t>(0), min(a.sink, pmax + 1));
    const int64_t win_lo = max(sinks, pmin - a.window + 1);
    keys = KeyRanges{0, sinks, win_lo, max(win_lo, pmax + 1)};
  }
  const int64_t nvis = keys.count();
  // this block's keys [lo, hi): the row's, or (DSPLIT + SEG) one segment of them
  const int64_t lo = DSPLIT && SEG ? static_cast<int64_t>(blockIdx.z) * a.invariant_split : 0;
  const int64_t hi = DSPLIT && SEG ? min(nvis, lo + a.invariant_split) : nvis;
  if (lo >= hi && DSPLIT && SEG) return;  // past the row's last segment
  int64_t* offs = reinterpret_cast<int64_t*>(ptc_smem + L.offs);
  int32_t* kpos = reinterpret_cast<int32_t*>(ptc_smem + L.kpos);
  int32_t* dense = reinterpret_cast<int32_t*>(ptc_smem + L.dense);
  auto k_stage = [&](int st) { return reinterpret_cast<T*>(ptc_smem + L.kv + 2 * st * L.stage); };
  auto v_stage = [&](int st) { return reinterpret_cast<T*>(ptc_smem + L.kv + (2 * st + 1) * L.stage); };
  // The raw table entry of this planning thread's key in the tile at virtual index `first`, read
  // two tiles before plan() checks and uses it.
  auto fetch = [&](int64_t first) -> int32_t {
    return tid < TK ? raw_table_entry(a, b, g, keys, first + tid, nvis) : -1;
  };
  // Source offset and position of each key of that tile (-1: past the end or no block), and per 32
  // keys whether none is -1, into plan slot `slot`.
  auto plan = [&](int64_t first, int slot, int32_t raw) {
    if (tid < TK) {
      const int64_t i = first + tid;
      int64_t off = -1, j = -1;
      if (i < nvis) {
        j = keys.position(i);
        const int64_t blk = checked_block(a, raw);
        if (blk >= 0) off = cache_offset(a, g, blk, j);
        if (off < 0) j = -1;
      }
      offs[slot * TK + tid] = off;
      kpos[slot * TK + tid] = static_cast<int32_t>(j);
      const unsigned holes = __ballot_sync(0xffffffffu, off < 0);
      if (lane == 0) dense[slot * (TK / 32) + warp] = holes == 0u;
    }
  };
  auto issue = [&](int slot, int st) {
    copy_planned_rows<T, D>(a, offs + slot * TK, TK, k_stage(st), v_stage(st), P, tid, 32 * W);
  };

  // Pipeline, one barrier a tile: at the top of iteration `it` tile it has landed and every warp is done
  // with tile it - 1, whose stage then takes tile it + 1 (planned an iteration earlier); tile it + 2 is
  // planned after the barrier from table entries read an iteration earlier. Plan slots: it % 3.
  // The first tile's copy is issued before the Q rows are roped, so the two overlap.
  plan(lo, 0, fetch(lo));
  plan(lo + TK, 1, fetch(lo + TK));
  int32_t raw_next = fetch(lo + 2 * TK);
  __syncthreads();
  if (lo < hi) issue(0, 0);
  // Q rows roped (a pair of dims per step: rope_dims / rope_pair of append_attention_common.h, as the
  // C++ op; dims >= rot_dim pass through), unscaled, in T (the scale goes onto the fp32 scores); padding
  // rows are zeros. Positions come from shared memory and the loop is unrolled, so the global reads of q
  // and cos / sin overlap instead of forming one dependent chain per element.
  {
    constexpr int HALF = D / 2;
    const int rot_half = static_cast<int>(a.rot_dim / 2);
#pragma unroll 4
    for (int e = tid; e < ROWS * HALF; e += 32 * W) {
      const int r = e / HALF, i = e - r * HALF;
      const int64_t t = s_tok[r];
      int64_t d1 = a.rot_dim + 2 * (i - rot_half), d2 = d1 + 1;  // past the rotary dims
      if (i < rot_half) rope_dims(a, i, d1, d2);
      float x1 = 0.0f, x2 = 0.0f;
      if (t >= 0) {
        const T* row = static_cast<const T*>(a.q) + t * a.q_stride + (g * group + r % group) * D;
        x1 = to_f(row[d1]);
        x2 = to_f(row[d2]);
        if (i < rot_half) rope_pair(a, s_pos[r], i, x1, x2);
      }
      qs[r * P + d1] = from_f<T>(x1);
      qs[r * P + d2] = from_f<T>(x2);
    }
  }
  __syncthreads();  // Q rows visible

  // ldmatrix row addresses of this lane (shared-space bytes): A (Q) rows, B (K) rows, B^T (V) rows;
  // every fragment's address is one of these plus a compile-time offset. E: bytes of an element.
  constexpr int E = static_cast<int>(sizeof(T));
  const uint32_t q_addr = smem_u32(qs) + ((r0 + lane % 16) * P + (lane / 16) * 8) * E;
  const int k_off = ((lane % 8 + (lane / 16) * 8) * P + ((lane / 8) % 2) * 8) * E;
  const int v_off = ((lane % 8 + ((lane / 8) % 2) * 8) * P + (lane / 16) * 8) * E;
  uint32_t qf[MF == 1 ? KD : 1][4];  // one M fragment: Q held in registers for the whole key loop
  if constexpr (MF == 1) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) ldsm_x4(qf[kk], q_addr + kk * 16 * E);
  }
  float o[MF][NDW][4];  // this warp's O columns: 8-dim blocks nd0 .. nd0 + NDW - 1
  const int nd0 = DSPLIT ? warp * NDW : 0;
#pragma unroll
  for (int f = 0; f < MF; ++f) {
#pragma unroll
    for (int nd = 0; nd < NDW; ++nd) o[f][nd][0] = o[f][nd][1] = o[f][nd][2] = o[f][nd][3] = 0.0f;
  }
  float m[MF][2], l[MF][2];  // running max (log2 units) and this thread's partial row sums
#pragma unroll
  for (int f = 0; f < MF; ++f) m[f][0] = m[f][1] = -INFINITY, l[f][0] = l[f][1] = 0.0f;
  const float qk_scale = a.softmax_scale * kLog2e;
  const int col0 = (lane % 4) * 2;  // first key (S) / dim (O) column of this thread in an 8-wide block
  // SEG: (M, L, A) of the segments folded so far (row-split: folded at each boundary; MF = 2: kept in local memory)
  FoldedSegments<MF, NDW, (SEG && !DSPLIT && MF > 1)> folded;
  if constexpr (SEG && !DSPLIT) folded.init();

  // The pipeline described above the prologue: one barrier a tile, plan slots it % 3.
  int it = 0;
  for (int64_t first = lo; first < hi; first += TK, ++it) {
    const int cur = it & 1, slot = it % 3;
    __pipeline_wait_prior(0);
    __syncthreads();  // tile it visible to every thread; stage cur ^ 1 (tile it - 1) is free
    if (first + TK < hi) issue((it + 1) % 3, cur ^ 1);
    if (first + 2 * TK < hi) plan(first + 2 * TK, (it + 2) % 3, raw_next);
    raw_next = fetch(first + 3 * TK);
    if constexpr (SEG && !DSPLIT) {
      if (first > 0 && first % a.invariant_split == 0) folded.fold(o, m, l);
    }
    if (wmax < 0 || keys.position(first) > wmax) continue;  // causal: nothing here for this warp's rows
    const uint32_t kt = smem_u32(k_stage(cur)) + k_off, vt = smem_u32(v_stage(cur)) + v_off;
    float s[MF][NK][4];
#pragma unroll
    for (int f = 0; f < MF; ++f) {
#pragma unroll
      for (int nk = 0; nk < NK; ++nk) s[f][nk][0] = s[f][nk][1] = s[f][nk][2] = s[f][nk][3] = 0.0f;
    }
    // S = Q K^T: K rows are the B operand's columns (no transpose). DSPLIT: this warp's key pairs
    // np0 .. np0 + NPW - 1 into s[.][0 .. 2 NPW), then through shared memory into every warp's s.
    const int np0 = DSPLIT ? warp * NPW : 0;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qa[MF][4];
#pragma unroll
      for (int f = 0; f < MF; ++f) {
        if constexpr (MF == 1) {
#pragma unroll
          for (int x = 0; x < 4; ++x) qa[f][x] = qf[kk][x];
        } else {
          ldsm_x4(qa[f], q_addr + (f * 16 * P + kk * 16) * E);
        }
      }
#pragma unroll
      for (int np = 0; np < NPW; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, kt + ((np0 + np) * 16 * P + kk * 16) * E);
#pragma unroll
        for (int f = 0; f < MF; ++f) {
          mma16816_x2<T>(s[f][2 * np], s[f][2 * np + 1], qa[f], kb);
        }
      }
    }
    // the next write is after the next tile's top barrier, past every warp's reads
    if constexpr (DSPLIT) share_fragments<NK, 2 * NPW>(s[0], reinterpret_cast<float4*>(qs), 2 * np0, lane);
    // Masking is needed on SWA heads, on tiles with holes or past the end, and on the causal diagonal;
    // masked scores become -inf, the others stay unscaled (the scale is folded into the exponent).
    const int32_t* kp = kpos + slot * TK;
    bool full = !swa && first + TK <= nvis && keys.position(first + TK - 1) <= wmin;
#pragma unroll
    for (int c = 0; c < TK / 32; ++c) full = full && dense[slot * (TK / 32) + c] != 0;
    if (!full) {
#pragma unroll
      for (int nk = 0; nk < NK; ++nk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t j = kp[nk * 8 + col0 + (e & 1)];
#pragma unroll
          for (int f = 0; f < MF; ++f) {
            const int32_t p = pos[f][e >> 1];
            if (!(j >= 0 && p >= 0 && j <= p && (!swa || j < a.sink || j > p - a.window))) s[f][nk][e] = -INFINITY;
          }
        }
      }
    }
#pragma unroll
    for (int f = 0; f < MF; ++f) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // online softmax of row lane / 4 + 8 h (4 lanes share a row)
        float mx = -INFINITY;
#pragma unroll
        for (int nk = 0; nk < NK; ++nk) mx = fmaxf(mx, fmaxf(s[f][nk][2 * h], s[f][nk][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[f][h], mx * qk_scale);
        const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far: 2^-inf = 0, no NaN
        const float keep = fast_exp2(m[f][h] - base);
        m[f][h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nk = 0; nk < NK; ++nk) {
#pragma unroll
          for (int x = 2 * h; x < 2 * h + 2; ++x) {
            s[f][nk][x] = fast_exp2(fmaf(s[f][nk][x], qk_scale, -base));
            sum += s[f][nk][x];
          }
        }
        l[f][h] = l[f][h] * keep + sum;
#pragma unroll
        for (int nd = 0; nd < NDW; ++nd) {
          o[f][nd][2 * h] *= keep;
          o[f][nd][2 * h + 1] *= keep;
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < TK / 16; ++kk) {  // O += P V: P from the S accumulators, V by ldmatrix.trans
      uint32_t pa[MF][4];
#pragma unroll
      for (int f = 0; f < MF; ++f) {
        pa[f][0] = pack2<T>(s[f][2 * kk][0], s[f][2 * kk][1]);
        pa[f][1] = pack2<T>(s[f][2 * kk][2], s[f][2 * kk][3]);
        pa[f][2] = pack2<T>(s[f][2 * kk + 1][0], s[f][2 * kk + 1][1]);
        pa[f][3] = pack2<T>(s[f][2 * kk + 1][2], s[f][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < KDW; ++dp) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, vt + (kk * 16 * P + (nd0 / 2 + dp) * 16) * E);
#pragma unroll
        for (int f = 0; f < MF; ++f) {
          mma16816_x2<T>(o[f][2 * dp], o[f][2 * dp + 1], pa[f], vb);
        }
      }
    }
  }
  __pipeline_wait_prior(0);
  if constexpr (SEG) {
    if constexpr (DSPLIT) {
      segment_store_block<T, MF, NDW>(a, s_tok, b, g, group, pmax, warp, lane, nd0 * 8 + col0, o, m, l, seg_ws, segs);
    } else {
      folded.fold(o, m, l);
      segment_store_rows<T>(a, s_tok, r0, g, group, lane, nd0 * 8 + col0, folded);
    }
  } else {
    store_row_outputs<T, MF, NDW>(a, s_tok, r0, g, group, lane, nd0 * 8 + col0, o, l);
  }
#endif
}

}  // namespace attn
}  // namespace paddle_mla
