// What the tensor pipe does alone with the wgmma shapes of the SM90 MLA decode (one program an SM,
// the operands where the kernels keep them, 128-byte swizzled; the values do not matter for time).
// Each mix is timed over many rounds of one 64-key tile's work, so the decode kernel's time a tile
// (benchmarks/profile/mla_decode_latency.py, BENCHMARKS) can be read against the pipe's own:
//   S        warpgroup 0's S = Q K^T: 36 m64n64k16, Q and keys from shared memory (ss)
//   S rs     the same with Q's fragments in registers (rs; the probe reuses one k-step's)
//   S n128   36 m64n128k16 ss over 128 keys, reported per 64 keys (n32: twice 36 m64n32k16)
//   PV       one warpgroup's half of P V: 4 m64n256k16, P from registers, V from shared memory
//   mixes    both warpgroups at once (S beside S, PV beside PV, S beside PV), the kernel's serial
//            order without the softmax (S, then both halves of P V, a block barrier between), and
//            the same work with no barrier (the pipe's floor for a tile when everything overlaps)
//   program  the decode's own warpgroup program (wg_attend) over tiles already in shared memory,
//            then a copy of its loop without the softmax, without the block barrier, without both
// (also compiled by scripts/check_cuda_compile.sh, so it follows the headers it includes)
// Build and run on an SM90 GPU:
//   F=benchmarks/profile/wgmma_rates.cu
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 -I custom_ops -o /tmp/wr $F && /tmp/wr
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "mla_wgmma_attend.cuh"
#include "wgmma.cuh"

namespace pw = paddle_mla::wg;
namespace mla = paddle_mla::mla;

// S's step with A (Q) from registers: d += A B, B (keys) K-major from shared memory.
__device__ __forceinline__ void m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
      " {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// S's step over 128 keys: d += A B, both K-major from shared memory.
__device__ __forceinline__ void m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
      " %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

// S's step over 32 keys: d += A B, both K-major from shared memory.
__device__ __forceinline__ void m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
      " %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b));
}

constexpr uint32_t kChunk = mla::kWgChunk;  // a 64-row chunk of 128-byte rows
constexpr uint32_t kTile = mla::kWgTile;    // 64 x 576 bf16
constexpr uint32_t kSmem = 3 * kTile + 1024;  // Q, a tile (or 128 keys), alignment slack
constexpr int kRounds = 256;

enum Mix { kS, kSBoth, kSRs, kSN128, kSN32, kPv, kPvBoth, kSBesidePv, kSerial, kOverlapped, kOverlappedN32, kMixes };
const char* kNames[kMixes] = {"S (warpgroup 0)", "S, both warpgroups", "S rs (warpgroup 0)",
                              "S n128 (per 64 keys)", "S n32 (per 64 keys)", "PV half (warpgroup 0)",
                              "PV, both halves", "S (wg 0) beside PV half (wg 1)", "S then both PV halves",
                              "S and PV half (wg 0) beside PV half (wg 1), no barrier",
                              "the same with S n32 twice"};

__device__ __forceinline__ void s_ss(float (&s)[32], uint64_t dq, uint64_t dk) {
  pw::fence_regs(s);
  pw::fence();
#pragma unroll
  for (int ks = 0; ks < 36; ++ks) {
    const uint32_t off = (ks / 4) * kChunk + (ks % 4) * 32;
    pw::wgmma_m64n64k16_ss(s, pw::desc_add(dq, off), pw::desc_add(dk, off), 1);
  }
  pw::commit();
  pw::wait<0>();
  pw::fence_regs(s);
}

__device__ __forceinline__ void pv_half(float (&o)[128], const uint32_t (&pa)[4], uint64_t dv) {
  pw::fence_regs(o);
  pw::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) pw::wgmma_m64n256k16_rs_mn(o, pa, pw::desc_add(dv, kk * 2048));
  pw::commit();
  pw::wait<0>();
  pw::fence_regs(o);
}

// Operands with finite values (their values do not matter for time), made visible to wgmma; then the
// round's start by thread 0.
__device__ __forceinline__ long long fill_and_start(uint8_t* smem) {
  for (int i = threadIdx.x; i < 3 * kTile / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  pw::fence_proxy_async();
  __syncthreads();
  long long t0 = 0;
  if (threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  return t0;
}

// The program's time (thread 0, after every thread is done) and a sum of its results, so that no
// MMA is left out as dead code.
template <int N>
__device__ __forceinline__ void stop_and_sink(long long t0, long long* ns, float* sink, float acc,
                                              const float (&r)[N]) {
  __syncthreads();
  if (threadIdx.x == 0) {
    long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    ns[blockIdx.x] = t1 - t0;
  }
  for (int i = 0; i < N; ++i) acc += r[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int kMix>
__global__ void __launch_bounds__(256, 1) rates(long long* ns, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: the sm_90a pass only
  extern __shared__ __align__(1024) uint8_t raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t base = (raw_addr + 1023) & ~1023u;
  uint8_t* smem = raw + (base - raw_addr);
  const int wgi = threadIdx.x / 128;
  const uint64_t dq = pw::desc_sw128(base, 16, 1024);
  const uint64_t dk = pw::desc_sw128(base + kTile, 16, 1024);
  const uint64_t dv = pw::desc_sw128(base + kTile + wgi * 4 * kChunk, kChunk, 1024);
  const uint32_t pa[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u ^ (threadIdx.x << 16)};
  float s[32], s2[64], s1[16], o[128];
  for (int i = 0; i < 16; ++i) s1[i] = 0.0f;
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  for (int i = 0; i < 64; ++i) s2[i] = 0.0f;
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  const long long t0 = fill_and_start(smem);
  for (int r = 0; r < kRounds; ++r) {
    if constexpr (kMix == kS) {
      if (wgi == 0) s_ss(s, dq, dk);
    } else if constexpr (kMix == kSBoth) {
      s_ss(s, dq, dk);
    } else if constexpr (kMix == kSRs) {
      if (wgi == 0) {
        pw::fence_regs(s);
        pw::fence();
#pragma unroll
        for (int ks = 0; ks < 36; ++ks) m64n64k16_rs(s, pa, pw::desc_add(dk, (ks / 4) * kChunk + (ks % 4) * 32));
        pw::commit();
        pw::wait<0>();
        pw::fence_regs(s);
      }
    } else if constexpr (kMix == kSN128) {
      if (wgi == 0 && r % 2 == 0) {
        pw::fence_regs(s2);
        pw::fence();
#pragma unroll
        for (int ks = 0; ks < 36; ++ks) {
          const uint32_t off = (ks / 4) * 2 * kChunk + (ks % 4) * 32;
          m64n128k16_ss(s2, pw::desc_add(dq, (ks / 4) * kChunk + (ks % 4) * 32), pw::desc_add(dk, off));
        }
        pw::commit();
        pw::wait<0>();
        pw::fence_regs(s2);
      }
    } else if constexpr (kMix == kSN32 || kMix == kOverlappedN32) {
      if (wgi == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          pw::fence_regs(s1);
          pw::fence();
#pragma unroll
          for (int ks = 0; ks < 36; ++ks) {
            const uint32_t off = (ks / 4) * kChunk + (ks % 4) * 32;
            m64n32k16_ss(s1, pw::desc_add(dq, off), pw::desc_add(dk, off + half * 32 * 128));
          }
          pw::commit();
          pw::wait<0>();
          pw::fence_regs(s1);
        }
      }
      if (kMix == kOverlappedN32) pv_half(o, pa, dv);
    } else if constexpr (kMix == kOverlapped) {
      if (wgi == 0) s_ss(s, dq, dk);
      pv_half(o, pa, dv);
    } else if constexpr (kMix == kPv) {
      if (wgi == 0) pv_half(o, pa, dv);
    } else if constexpr (kMix == kPvBoth) {
      pv_half(o, pa, dv);
    } else if constexpr (kMix == kSBesidePv) {
      if (wgi == 0) s_ss(s, dq, dk); else pv_half(o, pa, dv);
    } else {
      if (wgi == 0) s_ss(s, dq, dk);
      __syncthreads();
      pv_half(o, pa, dv);
      __syncthreads();
    }
  }
  float acc = 0.0f;
  for (int i = 0; i < 32; ++i) acc += s[i];
  for (int i = 0; i < 64; ++i) acc += s2[i];
  for (int i = 0; i < 16; ++i) acc += s1[i];
  stop_and_sink(t0, ns, sink, acc, o);
#endif
}

// The decode's own warpgroup program (mla_wgmma_attend.cuh) over tiles that are already in shared
// memory: each load completes its barrier at once with no bytes, so every tile is computed on
// whatever the stage holds. The time a tile is the program's chain alone: S, the softmax, P V, the
// handoff and the barriers.
struct ResidentKeys {
  int t0 = 0, seq_len = 1 << 30;
  __device__ bool producer(int tid) const { return tid == 128; }
  __device__ void issue_q(uint32_t, uint32_t bar) const { pw::mbar_arrive(bar); }
  __device__ void issue(int, int, uint32_t, uint32_t bar) const { pw::mbar_arrive(bar); }
  __device__ void landed(int, uint8_t*) const { pw::fence_proxy_async(); }
  __device__ void mask(float (&)[8][4], int, int) const {}
};

__global__ void __launch_bounds__(mla::kWgThreads, 1) attend_resident(long long* ns, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: the sm_90a pass only
  extern __shared__ __align__(1024) uint8_t raw[];
  mla::WgProgram p = mla::wg_program(raw, 1);
  const long long t0 = fill_and_start(p.smem);
  float o[128], m[2], sum[2];
  mla::wg_attend(p, ResidentKeys{}, kRounds, 0.06f, o, m, sum);
  stop_and_sink(t0, ns, sink, sum[0] + m[1], o);
#endif
}

// wg_attend's tile loop with one part taken out, to price it: kCut 1 = no softmax (P is S packed),
// 2 = no block barrier a tile (nothing is reloaded here), 3 = both.
template <int kCut>
__global__ void __launch_bounds__(mla::kWgThreads, 1) attend_cut(long long* ns, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma: the sm_90a pass only
  extern __shared__ __align__(1024) uint8_t raw[];
  mla::WgProgram p = mla::wg_program(raw, 1);
  const long long t0 = fill_and_start(p.smem);
  const mla::WgHandoff handoff(p);
  const uint64_t dq = pw::desc_sw128(p.base + mla::WgLayout::q, 16, 1024);
  const uint64_t dk = pw::desc_sw128(p.base + mla::WgLayout::kv, 16, 1024);
  const uint64_t dv = pw::desc_sw128(p.base + mla::WgLayout::kv + p.wgi * 4 * kChunk, kChunk, 1024);
  float o[128], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  for (int i = 0; i < kRounds; ++i) {
    const uint32_t stage = (i % 2) * kTile;
    if (!(kCut & 2)) __syncthreads();
    uint32_t pa[4][4];
    float keep[2] = {1.0f, 1.0f};
    if (p.wgi == 0) {
      float s[32];
      pw::start_chain(s);
#pragma unroll
      for (int ks = 0; ks < mla::kKeyDim / 16; ++ks) mla::wg_scores_step(s, dq, dk, stage, ks);
      pw::commit();
      pw::wait<0>();
      pw::fence_regs(s);
      float(&sf)[8][4] = mla::frag4(s);
      if (!(kCut & 1)) mla::online_softmax<8, true>(sf, m, l, keep, 0.06f);
      mla::wg_pack_p(s, pa);
      handoff.put(pa, keep);
      mla::row_block_arrive(1, mla::kWgThreads);
    } else {
      mla::row_block_barrier(1, mla::kWgThreads);
      handoff.take(pa, keep);
    }
    mla::wg_rescale_pv(o, pa, keep, dv, stage);
  }
  stop_and_sink(t0, ns, sink, l[0] + m[1], o);
#endif
}

template <int kMix>
double run(int sms, long long* ns, float* sink) {
  auto kernel = kMix == kMixes       ? attend_resident
                : kMix == kMixes + 1 ? attend_cut<1>
                : kMix == kMixes + 2 ? attend_cut<2>
                : kMix == kMixes + 3 ? attend_cut<3>
                                     : rates<kMix>;
  const uint32_t smem = kMix >= kMixes ? mla::WgLayout::total : kSmem;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  std::vector<long long> h(sms);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    kernel<<<sms, 256, smem>>>(ns, sink);
    cudaMemcpy(h.data(), ns, sms * sizeof(long long), cudaMemcpyDeviceToHost);
    double mean = 0;
    for (long long v : h) mean += static_cast<double>(v);
    mean /= sms;
    if (rep > 0 && mean < best) best = mean;
  }
  return best / kRounds;
}

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int sms = prop.multiProcessorCount;
  long long* ns;
  float* sink;
  cudaMalloc(&ns, sms * sizeof(long long));
  cudaMalloc(&sink, sms * 256 * sizeof(float));
  const double t[kMixes] = {run<kS>(sms, ns, sink),         run<kSBoth>(sms, ns, sink),
                            run<kSRs>(sms, ns, sink),       run<kSN128>(sms, ns, sink),
                            run<kSN32>(sms, ns, sink),      run<kPv>(sms, ns, sink),
                            run<kPvBoth>(sms, ns, sink),    run<kSBesidePv>(sms, ns, sink),
                            run<kSerial>(sms, ns, sink),    run<kOverlapped>(sms, ns, sink),
                            run<kOverlappedN32>(sms, ns, sink)};
  if (cudaError_t e = cudaGetLastError()) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  // MACs of one round of each mix, for the rate column
  const double s_mac = 64.0 * 64 * 576, pv_mac = 64.0 * 256 * 64;
  const double macs[kMixes] = {s_mac,          2 * s_mac,      s_mac,          s_mac,
                               s_mac,          pv_mac,         2 * pv_mac,     s_mac + pv_mac,
                               s_mac + 2 * pv_mac, s_mac + 2 * pv_mac, s_mac + 2 * pv_mac};
  std::printf("%s, %d SMs; one program an SM, %d rounds, best of 4\n", prop.name, sms, kRounds);
  std::printf("| mix | ns a round (a 64-key tile's share) | TFLOPS over the GPU |\n| --- | --- | --- |\n");
  for (int m = 0; m < kMixes; ++m)
    std::printf("| %s | %.1f | %.0f |\n", kNames[m], t[m], 2 * macs[m] * sms / t[m] * 1e-3);
  const double tile = run<kMixes>(sms, ns, sink);
  const double cut[3] = {run<kMixes + 1>(sms, ns, sink), run<kMixes + 2>(sms, ns, sink),
                         run<kMixes + 3>(sms, ns, sink)};
  const char* cut_names[3] = {"the same without the softmax", "without the block barrier a tile",
                              "without either"};
  std::printf("| the decode's program (wg_attend), tiles resident | %.1f | %.0f |\n", tile,
              2 * (s_mac + 2 * pv_mac) * sms / tile * 1e-3);
  for (int c = 0; c < 3; ++c)
    std::printf("| %s | %.1f | %.0f |\n", cut_names[c], cut[c], 2 * (s_mac + 2 * pv_mac) * sms / cut[c] * 1e-3);
  if (cudaError_t e = cudaGetLastError()) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
