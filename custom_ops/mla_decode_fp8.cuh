// mla_decode over FP8 cache rows (paddle_mla/cache/fp8_latent.py's format): the key source of the SM90
// warpgroup kernel (mla_wgmma_attend.cuh) when the latent cache holds a token as 576 e4m3 values, its
// power-of-two scale as fp32 at byte 576, then zeros to 592 bytes.
//
// The tile the MMAs read stays the bf16 64 x 576 tile of the bf16 cache: an e4m3 value times its row's
// power-of-two scale is exact in bf16, so the converted tile holds exactly the codec's dequantized rows
// and everything downstream runs the same MMAs on the same bits (the GPU test compares the op over FP8
// rows with the op over their dequantized bf16 copy, bit for bit). What FP8 saves is the bytes read.
//
// How a tile arrives: TMA, as for the bf16 cache (cp.async gathers from every thread measured about
// half TMA's rate an SM in these kernels), into the stage's own shared memory: the kernel uses 225 of
// the SM's 227 KB, so a separate FP8 stage (37 KB) does not fit. Per page run of R rows, 9 boxes of
// 64 bytes x R rows land chunk c's values in the upper half of the stage's chunk c (bf16 rows 32..63
// of it, 64 bytes a row), and one box of 16 bytes x R rows brings the rows' scale units to the stage's
// first kilobyte. Once they land every thread reads its 9 units (row tid / 4, quarter tid % 4 of each
// chunk) and its row's scale, the block meets at a barrier, and each writes its bf16 units: the
// in-place order needs only that one barrier. Rows past the row's length are written as zeros (their
// bytes, a page's stale slots or boxes not issued, are never converted).
//
// Conversion: e4m3 byte x -> bf16 bits (x & 0x80) << 8 | (x & 0x7f) << 4, which is x's value times
// 2^-120 (same mantissa; exponent bias 127 instead of 7; zero stays zero), then exact bf16 multiplies
// by 2^120 times the scale: one factor for scales up to 2^7, two beyond (one would overflow bf16).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mla_decode_kernel.cuh"
#include "mla_paged_keys.cuh"
#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace paddle_mla {
namespace mla {

constexpr uint32_t kFp8Park = kWgChunk / 2;  // where chunk c's FP8 values land inside bf16 chunk c

// Two e4m3 values (the bytes `sel` picks from w: 0x1404 the low two, 0x3424 the high two) as bf16x2,
// times f (and times g when kTwo).
template <bool kTwo>
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t w, uint32_t sel, __nv_bfloat162 f, __nv_bfloat162 g) {
  const uint32_t t = __byte_perm(w, 0u, sel);  // each value's byte at the top of its 16-bit half
  uint32_t bits = (t & 0x80008000u) | ((t >> 4) & 0x07F007F0u);
  __nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&bits), f);
  if (kTwo) v = __hmul2(v, g);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16 e4m3 values -> the two bf16 units (values 0..7 and 8..15) at byte offsets lo and hi of the tile.
template <bool kTwo>
__device__ __forceinline__ void convert_unit(uint8_t* tile, uint4 x, __nv_bfloat162 f, __nv_bfloat162 g, uint32_t lo,
                                             uint32_t hi) {
  *reinterpret_cast<uint4*>(tile + lo) =
      make_uint4(e4m3x2_bf16x2<kTwo>(x.x, 0x1404, f, g), e4m3x2_bf16x2<kTwo>(x.x, 0x3424, f, g),
                 e4m3x2_bf16x2<kTwo>(x.y, 0x1404, f, g), e4m3x2_bf16x2<kTwo>(x.y, 0x3424, f, g));
  *reinterpret_cast<uint4*>(tile + hi) =
      make_uint4(e4m3x2_bf16x2<kTwo>(x.z, 0x1404, f, g), e4m3x2_bf16x2<kTwo>(x.z, 0x3424, f, g),
                 e4m3x2_bf16x2<kTwo>(x.w, 0x1404, f, g), e4m3x2_bf16x2<kTwo>(x.w, 0x3424, f, g));
}

template <bool kTwo>
__device__ __forceinline__ void convert_row(uint8_t* tile, const uint4 (&x)[kWgChunks], __nv_bfloat162 f,
                                            __nv_bfloat162 g, int r, int q) {
#pragma unroll
  for (int c = 0; c < kWgChunks; ++c)
    convert_unit<kTwo>(tile, x[c], f, g, swz(r, 8 * c + 2 * q), swz(r, 8 * c + 2 * q + 1));
}

// A request's key tiles [t0, t0 + nt) of FP8 rows through its block table, by TMA from thread 128:
// PagedKeys' fields, Q and mask, with kv_map over the values (boxes of 64 bytes x box_rows), the scale
// boxes beside them and the tile converted once landed.
struct Fp8PagedKeys : PagedKeys {
  const CUtensorMap* scale_map;  // the rows' bytes 576..591 (the scale, then zeros): 16 bytes x box_rows

  __device__ __forceinline__ void issue(int i, int, uint32_t dst, uint32_t bar) const {
    const int tok0 = (t0 + i) * kWgKeys, boxes = (min(kWgKeys, seq_len - tok0) + box_rows - 1) / box_rows;
    wg::mbar_expect_tx(bar, static_cast<uint32_t>(boxes * box_rows * (kWgChunks * 64 + 16)));
    for (int x = 0; x < boxes; ++x) {  // boxes holding a key of the row; the table is read for them only
      const int tok = tok0 + x * box_rows, blk = bt[tok / page];
#pragma unroll
      for (int c = 0; c < kWgChunks; ++c)
        wg::tma_load_3d(dst + c * kWgChunk + kFp8Park + x * box_rows * 64, kv_map, c * 64, tok % page, blk, bar);
      wg::tma_load_3d(dst + x * box_rows * 16, scale_map, kKeyDim, tok % page, blk, bar);
    }
  }
  // the tile's FP8 rows -> its bf16 rows, in place (the file's comment); then the proxy fence for wgmma
  __device__ __forceinline__ void landed(int i, uint8_t* tile) const {
    const int r = static_cast<int>(threadIdx.x) / 4, q = static_cast<int>(threadIdx.x) % 4;
    const bool live = (t0 + i) * kWgKeys + r < seq_len;
    const float scale = *reinterpret_cast<const float*>(tile + r * 16);
    uint4 x[kWgChunks];
#pragma unroll
    for (int c = 0; c < kWgChunks; ++c)
      x[c] = *reinterpret_cast<const uint4*>(tile + c * kWgChunk + kFp8Park + r * 64 + q * 16);
    __syncthreads();  // every source unit and scale read: the bf16 writes may overwrite them
    const __nv_bfloat162 two120 = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
    if (!live) {
#pragma unroll
      for (int c = 0; c < kWgChunks; ++c) {
        *reinterpret_cast<uint4*>(tile + swz(r, 8 * c + 2 * q)) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(tile + swz(r, 8 * c + 2 * q + 1)) = make_uint4(0, 0, 0, 0);
      }
    } else if (scale <= 0x1p7f) {
      const float f = scale * 0x1p120f;
      convert_row<false>(tile, x, __floats2bfloat162_rn(f, f), two120, r, q);
    } else {
      convert_row<true>(tile, x, two120, __floats2bfloat162_rn(scale, scale), r, q);
    }
    wg::fence_proxy_async();
  }
};

}  // namespace mla
}  // namespace paddle_mla
