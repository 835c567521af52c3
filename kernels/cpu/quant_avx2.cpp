// AVX2 + FMA tiles of the quantized matmuls; compiled for that ISA by the pragma below (no
// torch headers; internal linkage for everything but the two entry points).
//
// int4: per 32-column block one 128-bit broadcast of the 16 weight bytes into both halves,
// then per 8 weights a per-lane shift (vpsrlvd), a mask, a conversion and fma(q, s, m): the
// permuted activation layout of quant.h read 8 lanes at a time.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "quant.h"

namespace localchat_cpu {
namespace {

typedef __m256 VF;
constexpr int W = 8;
constexpr int NT_A = 2, MT_A = 4;
constexpr int NT_B = 1, MT_B = 8;
constexpr int NT_C = 1, MT_C = 8;
// more than MT_B rows (16-row chunks of a short prompt): int4_many's shape, 2 x 4 accumulators
// (with two weight vectors and one activation vector 11 of the 16 ymm registers; 2 x 6 spills
// and measured no faster); 1.3-1.5x the C tiles at 16 rows on a Zen 3 core pair (Q4_K
// 17920 x 1536, 2 threads: 10.9-12.4 -> 8.1 ms)
constexpr int NT_D = 2, MT_D = 4;

inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset1(float f) { return _mm256_set1_ps(f); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(VF v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

struct P4 {
  VF s, m;
};
inline P4 prep4(float s, float m) { return {_mm256_set1_ps(s), _mm256_set1_ps(m)}; }
inline void deq4_32(const uint8_t* p, const P4& pr, VF* out) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i mask = _mm256_set1_epi32(0x0F);
  // vector u, lane l: word l % 4 shifted to nibble 2 u + l / 4
  const __m256i sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  for (int u = 0; u < 4; ++u) {
    const __m256i q = _mm256_and_si256(
        _mm256_srlv_epi32(b, _mm256_add_epi32(sh, _mm256_set1_epi32(8 * u))), mask);
    out[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), pr.s, pr.m);
  }
}
inline void deq8_16(const int8_t* p, VF s, VF m, bool has_min, VF* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const VF q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const VF q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  out[0] = has_min ? _mm256_fmadd_ps(q0, s, m) : _mm256_mul_ps(q0, s);
  out[1] = has_min ? _mm256_fmadd_ps(q1, s, m) : _mm256_mul_ps(q1, s);
}

#include "quant_tiles.h"

}  // namespace

void int4_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.M > MT_B) int4_many<NT_D, MT_D>(a, n0, n1);  // each weight dequantized once
  else int4_all(a, n0, n1);
}
void int8_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1) { int8_all(a, n0, n1); }

}  // namespace localchat_cpu
