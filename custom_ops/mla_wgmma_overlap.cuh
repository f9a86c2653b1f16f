// The warpgroup MLA program of mla_wgmma_attend.cuh on an overlapped schedule: warpgroup 1's P V of
// tile i runs on the tensor cores while warpgroup 0 computes tile i + 1's softmax.
//
// Why: in wg_attend a tile is S (warpgroup 0) -> softmax -> both halves of P V, with a block barrier
// between tiles, so the tensor pipe idles through every softmax (ncu at 128 heads, b=64, 4k on an
// H200: tensor pipe 56% busy, half of the stall cycles at barriers). Here the warpgroups meet only at
// named barriers: warpgroup 0 runs S_i, softmax_i, hands P_i over and adds its own half P_i V_i; warpgroup
// 1 takes P_i at once but waits until S_{i+1} is done before its half P_i V_i, which then fills the
// softmax of tile i + 1. Per tile the tensor pipe sees S, then both P V halves around one softmax.
//
// Loads: warpgroup 1 now reads tile i's value columns 256..511 (chunks 4..7) until the middle of tile
// i + 1, so a stage is refilled in two parts, each on its own barrier: chunks 0..3 and the rope chunk
// 8 (read by S and warpgroup 0's P V) once warpgroup 0 ends tile i, and chunks 4..7 once warpgroup 1's
// P V of tile i is done. Thread 128 issues both: a load's block-table read would stall warpgroup 0's
// next wgmma (a warpgroup-wide instruction) on one thread's global load. S_{i+2} runs its k-steps over
// the first part before it waits for the second, which gives those loads 20 k-steps more to land.
//
// Named barriers (ids; mla_wgmma_attend.cuh's wg_attend uses 1 alone), each crossed by warpgroup 0
// (arrive) and warpgroup 1 (sync) once a tile, or inside one warpgroup:
//   1  P_i and the rows' rescale factors are in shared memory     (0 arrives, 1 syncs; every tile)
//   7  warpgroup 0's P_i V_i is done: chunks 0..3, 8 are free      (0 arrives, 1 syncs; every tile)
//   3  S_{i+1} is done (after the last tile: P_i V_i is)           (0 arrives, 1 syncs; every tile)
//   4  warpgroup 1 took P_i: the handoff buffer is free            (1 arrives, 0 syncs; all but the last)
//   2 / 6  warpgroup 0 / 1 alone: zeroed rows; the late load after the warpgroup's wgmma wait
// Warpgroup 1 arrives on 4 only after it synced on 1, 7 and 3, and warpgroup 0 writes P_{i+1} (and
// arrives again on any of them) only after syncing on 4, so neither side ever arrives twice on a
// barrier the other has not yet passed.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mla_decode_kernel.cuh"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

// The warpgroup kernel's schedules (mla_decode_wgmma.cuh): wg_attend's, and wg_attend_decoupled's two.
constexpr int kSerial = 0, kDecoupled = 1, kLagged = 2;
constexpr int kEarlyChunks = 0x10f;  // chunks 0..3 and 8: S and warpgroup 0's P V
constexpr int kLateChunks = 0x0f0;   // chunks 4..7: warpgroup 1's P V

// wg_attend's contract on the decoupled schedules, for key sources with issue_chunks, partial and
// zero_past_length (PagedKeys). kLag: warpgroup 1's P V waits for the next S (the file's comment);
// without it, warpgroup 1 adds its P V at once and then reloads the stage whole.
template <bool kLag, class Keys>
__device__ __forceinline__ void wg_attend_decoupled(WgProgram& p, const Keys& keys, int nt, float qk_scale,
                                                    float (&o)[128], float (&m)[2], float (&sum)[2]) {
  constexpr int kFirst = kLag ? kEarlyChunks : 0x1ff;  // the chunks on a stage's full barrier
  const WgHandoff handoff(p);
  const uint64_t dq = wg::desc_sw128(p.base + WgLayout::q, 16, 1024);
  const uint64_t dk = wg::desc_sw128(p.base + WgLayout::kv, 16, 1024);
  const uint64_t dv = wg::desc_sw128(p.base + WgLayout::kv + p.wgi * 4 * kWgChunk, kWgChunk, 1024);
  if (p.tid == 128) {  // Q and the first two tiles: both stages are free
    keys.issue_q(p.base + WgLayout::q, p.qbar());
    for (int i = 0; i < min(nt, 2); ++i) {
      keys.template issue_chunks<kFirst>(i, p.stage(i), p.full(i));
      if (kLag) keys.template issue_chunks<kLateChunks>(i, p.stage(i), p.late(i));
    }
  }
  __syncwarp();  // the producer's warp converges before the barrier waits and wgmma below
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float l[2] = {0.0f, 0.0f};  // warpgroup 0: rows lane / 4 (+ 8); this lane's partial sums
  m[0] = m[1] = -INFINITY;
  uint32_t pa[4][4];
  float keep[2];

  if (p.wgi == 0) {
    wg_wait(p, p.qbar(), 2);
    for (int i = 0; i < nt; ++i) {
      const int st = i % 2;
      const uint32_t stage = st * kWgTile;
      wg_wait(p, p.full(st), st);
      float s[32];
#pragma unroll
      for (int x = 0; x < 32; ++x) s[x] = 0.0f;
      wg::fence_regs(s);
      wg::fence();
      if constexpr (kLag) {
#pragma unroll
        for (int e = 0; e < 20; ++e) wg_scores_step(s, dq, dk, stage, e < 16 ? e : e + 16);  // chunks 0..3, 8
        wg::commit();
        wg_wait(p, p.late(st), 3 + st);
        wg::fence();
#pragma unroll
        for (int ks = 16; ks < 32; ++ks) wg_scores_step(s, dq, dk, stage, ks);  // chunks 4..7
      } else {
#pragma unroll
        for (int ks = 0; ks < kKeyDim / 16; ++ks) wg_scores_step(s, dq, dk, stage, ks);  // wg_attend's order
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(s);
      // rows past the length: zeros before any P V reads them (S may read their garbage: the mask
      // below replaces those scores); warpgroup 1 sees them through barrier 1
      if (keys.partial(i)) {
        keys.zero_past_length(i, p.smem + WgLayout::kv + stage, p.tid, 128);
        row_block_barrier(2, 128);
      }
      if (kLag && i >= 1) row_block_arrive(3, kWgThreads);  // warpgroup 1's P_{i-1} V_{i-1} may start
      float(&sf)[8][4] = frag4(s);
      keys.mask(sf, i, p.lane);
      online_softmax(sf, m, l, keep, qk_scale);
      wg_pack_p(s, pa);
      if (i >= 1) row_block_barrier(4, kWgThreads);  // warpgroup 1 holds P_{i-1}
      handoff.put(pa, keep);
      row_block_arrive(1, kWgThreads);
      wg_rescale_pv(o, pa, keep, dv, stage);
      row_block_arrive(7, kWgThreads);  // chunks 0..3 and 8 of this stage are read by nobody now
      if (kLag && i == nt - 1) row_block_arrive(3, kWgThreads);  // no S_{i+1}: the last P V may start
    }
  } else {
    for (int i = 0; i < nt; ++i) {
      const int st = i % 2;
      row_block_barrier(1, kWgThreads);
      handoff.take(pa, keep);
      if constexpr (kLag) {
        row_block_barrier(7, kWgThreads);
        if (p.tid == 128 && i + 2 < nt) keys.template issue_chunks<kEarlyChunks>(i + 2, p.stage(st), p.full(st));
        __syncwarp();
        row_block_barrier(3, kWgThreads);
        if (i + 1 < nt) row_block_arrive(4, kWgThreads);
        wg_wait(p, p.late(st), 3 + st);  // chunks 4..7 landed (warpgroup 0 waited too; this makes them ours)
        wg_rescale_pv(o, pa, keep, dv, st * kWgTile);
        if (i + 2 < nt) {  // chunks 4..7 of this stage are read by nobody now
          row_block_barrier(6, 128);
          if (p.tid == 128) keys.template issue_chunks<kLateChunks>(i + 2, p.stage(st), p.late(st));
          __syncwarp();
        }
      } else {
        wg_wait(p, p.full(st), st);  // tile i landed (warpgroup 0 waited too; this makes it ours)
        wg_rescale_pv(o, pa, keep, dv, st * kWgTile);
        row_block_barrier(7, kWgThreads);  // and warpgroup 0's P V is done: the stage is free
        if (i + 1 < nt) row_block_arrive(4, kWgThreads);
        if (p.tid == 128 && i + 2 < nt) keys.template issue_chunks<0x1ff>(i + 2, p.stage(st), p.full(st));
        __syncwarp();
      }
    }
  }
  wg_finish_sums(p, l, sum);
}

}  // namespace mla
}  // namespace paddle_mla
