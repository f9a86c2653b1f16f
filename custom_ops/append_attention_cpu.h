// append_attention, CPU implementation: plain loops over raw arrays, no framework headers.
// Semantics: append_attention_common.h. Storage dtypes fp32, bf16, fp16; all arithmetic in fp32.
// The whole step's K/V is written first, then every token attends, so a token sees the new tokens of
// its own request that precede it. Per (token, KV head) the group's query heads share each key read.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "append_attention_common.h"

namespace paddle_mla {
namespace cpu {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

struct F32 {
  using storage = float;
  static float load(const storage* p, int64_t i) { return p[i]; }
  static void store(storage* p, int64_t i, float x) { p[i] = x; }
};

struct BF16 {
  using storage = uint16_t;
  static float load(const storage* p, int64_t i) { return bits_to_float(static_cast<uint32_t>(p[i]) << 16); }
  static void store(storage* p, int64_t i, float x) {  // round to nearest even, NaN stays NaN
    const uint32_t bits = float_to_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      p[i] = static_cast<uint16_t>((bits >> 16) | 0x40u);
      return;
    }
    p[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
};

struct F16 {
  using storage = uint16_t;
  static float load(const storage* p, int64_t i) {
    const uint32_t h = p[i], sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
    if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(man), -24);  // zero, subnormal
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  }
  static void store(storage* p, int64_t i, float x) {  // round to nearest even, overflow to inf
    const uint32_t bits = float_to_bits(x), sign = (bits >> 16) & 0x8000u;
    const float ax = std::fabs(x);
    if (std::isnan(x)) {
      p[i] = static_cast<uint16_t>(sign | 0x7e00u);
      return;
    }
    if (ax >= 65520.0f) {  // rounds past the largest half (65504)
      p[i] = static_cast<uint16_t>(sign | 0x7c00u);
      return;
    }
    if (ax < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24, rint rounds half to even
      p[i] = static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::ldexp(ax, 24))));
      return;
    }
    const uint32_t a = bits & 0x7fffffffu;
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);  // round the 13 dropped mantissa bits
    p[i] = static_cast<uint16_t>(sign | (((rounded >> 23) - 112u) << 10) | ((rounded >> 13) & 0x3ffu));
  }
};

// x[0..D) of one head, loaded to fp32 and roped at position p.
template <typename T>
void load_roped(const AppendAttentionArgs& a, const typename T::storage* src, int64_t p, float* x) {
  for (int64_t d = 0; d < a.head_dim; ++d) x[d] = T::load(src, d);
  for (int64_t i = 0; i < a.rot_dim / 2; ++i) {
    int64_t d1, d2;
    rope_dims(a, i, d1, d2);
    rope_pair(a, p, i, x[d1], x[d2]);
  }
}

template <typename T>
void write_cache(const AppendAttentionArgs& a) {
  using S = typename T::storage;
  const S* k = static_cast<const S*>(a.k);
  const S* v = static_cast<const S*>(a.v);
  S* kc = static_cast<S*>(a.k_cache);
  S* vc = static_cast<S*>(a.v_cache);
  std::vector<float> x(a.head_dim);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t b = token_request(a, t);
    if (b < 0) continue;
    const int64_t p = a.positions[t];
    for (int64_t g = 0; g < a.num_kv_heads; ++g) {
      const int64_t block = block_of(a, b, g, p);
      if (block < 0) continue;
      const int64_t dst = cache_offset(a, g, block, p);
      load_roped<T>(a, k + t * a.k_stride + g * a.head_dim, p, x.data());
      for (int64_t d = 0; d < a.head_dim; ++d) T::store(kc, dst + d, x[d]);
      const S* vrow = v + t * a.v_stride + g * a.head_dim;
      for (int64_t d = 0; d < a.head_dim; ++d) vc[dst + d] = vrow[d];
    }
  }
}

template <typename T>
void attend(const AppendAttentionArgs& a) {
  using S = typename T::storage;
  const S* q = static_cast<const S*>(a.q);
  const S* kc = static_cast<const S*>(a.k_cache);
  const S* vc = static_cast<const S*>(a.v_cache);
  S* out = static_cast<S*>(a.out);
  const int64_t D = a.head_dim, group = a.num_q_heads / a.num_kv_heads;
  std::vector<float> qr(group * D), acc(group * D), kx(D), vx(D), m(group), l(group);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t b = token_request(a, t);
    const int64_t p = a.positions[t];
    for (int64_t g = 0; g < a.num_kv_heads; ++g) {
      S* o = out + (t * a.num_q_heads + g * group) * D;
      if (b < 0) {
        for (int64_t i = 0; i < group * D; ++i) T::store(o, i, 0.0f);
        continue;
      }
      for (int64_t h = 0; h < group; ++h) {
        load_roped<T>(a, q + t * a.q_stride + (g * group + h) * D, p, qr.data() + h * D);
        m[h] = -INFINITY;
        l[h] = 0.0f;
      }
      for (int64_t i = 0; i < group * D; ++i) acc[i] = 0.0f;
      const KeyRanges keys = key_ranges(a, g, p);
      for (int64_t i = 0; i < keys.count(); ++i) {
        const int64_t j = keys.position(i);
        if (!key_visible(a, g, p, j)) continue;  // swa_mask: keys outside an SWA head's window are masked
        const int64_t block = block_of(a, b, g, j);
        if (block < 0) continue;  // no block: nothing to read (a visible key always has one)
        const int64_t off = cache_offset(a, g, block, j);
        for (int64_t d = 0; d < D; ++d) {
          kx[d] = T::load(kc, off + d);
          vx[d] = T::load(vc, off + d);
        }
        for (int64_t h = 0; h < group; ++h) {  // online softmax, one key at a time
          float s = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += qr[h * D + d] * kx[d];
          s *= a.softmax_scale;
          const float m_new = s > m[h] ? s : m[h];
          const float keep = std::exp(m[h] - m_new), w = std::exp(s - m_new);
          l[h] = l[h] * keep + w;
          for (int64_t d = 0; d < D; ++d) acc[h * D + d] = acc[h * D + d] * keep + w * vx[d];
          m[h] = m_new;
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        for (int64_t d = 0; d < D; ++d) T::store(o, h * D + d, acc[h * D + d] * inv);
      }
    }
  }
}

template <typename T>
void run(const AppendAttentionArgs& a) {
  write_cache<T>(a);
  attend<T>(a);
}

}  // namespace cpu

// The whole op on CPU; the caller checked shapes and dtypes (see the bindings).
inline void append_attention_cpu(const AppendAttentionArgs& a) {
  switch (a.dtype) {
    case AttnDtype::kFloat32: cpu::run<cpu::F32>(a); break;
    case AttnDtype::kBFloat16: cpu::run<cpu::BF16>(a); break;
    case AttnDtype::kFloat16: cpu::run<cpu::F16>(a); break;
  }
}

}  // namespace paddle_mla
