// append_attention, mma.sync building blocks shared by the tensor-core prefill and decode kernels
// (sm_80+): ldmatrix loads from shared memory, the m16n8k16 MMA with fp32 accumulators, packing of
// fp32 accumulators into A-operand registers, and 2^x on the SFU. Included by the kernel headers.
//
// Fragment layouts (PTX ISA, mma.m16n8k16): thread `lane` holds C/D elements (lane / 4 + 8 h,
// 2 (lane % 4) + c) for h, c in {0, 1}; the A operand of two adjacent n8 column blocks of a C tile
// is the m16k16 A layout, so P goes from the S accumulators to the P V product without shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace paddle_mla {
namespace attn {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the row address (shared-space bytes) of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a b, m16n8k16, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// c0 += a b[0..1], c1 += a b[2..3]: the two 8-column halves of one ldmatrix.x4 B fragment.
template <typename T>
__device__ __forceinline__ void mma16816_x2(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[4]) {
  mma16816<T>(c0, a, b[0], b[1]);
  mma16816<T>(c1, a, b[2], b[3]);
}

// Warps that each computed some 8-column blocks of one 16-row C tile (`mine` of them, from block `first`,
// in c[0 .. mine)) hand them to each other through `x` (NB x 32 float4, fragment-ordered: 16 bytes a
// lane, so stores and loads are conflict-free); every warp then holds all NB blocks in c. The caller
// keeps `x` free between calls with its own barrier.
template <int NB, int MINE>
__device__ __forceinline__ void share_fragments(float (&c)[NB][4], float4* x, int first, int lane) {
#pragma unroll
  for (int j = 0; j < MINE; ++j) x[(first + j) * 32 + lane] = make_float4(c[j][0], c[j][1], c[j][2], c[j][3]);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    const float4 v = x[j * 32 + lane];
    c[j][0] = v.x, c[j][1] = v.y, c[j][2] = v.z, c[j][3] = v.w;
  }
}

// Two floats as one register of two T (lo in the low half: the lower column of a fragment).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// 2^x on the SFU (ex2.approx.ftz: 2^-inf = +0), the softmax's one transcendental.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace attn
}  // namespace paddle_mla
