// AVX2 + FMA tiles of the quantized matmuls; compiled for that ISA by the pragma below (no
// torch headers; internal linkage for everything but the two entry points).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "quant.h"

namespace localchat_cpu {
namespace {

typedef __m256 VF;
constexpr int W = 8;
constexpr int NT = 2;
constexpr int MT = 4;
constexpr int NT_WIDE = 1;
constexpr int MT_WIDE = 8;

inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset1(float f) { return _mm256_set1_ps(f); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(VF v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline void deq4_16(const uint8_t* p, int high, VF s, VF m, VF* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i q = high ? _mm_and_si128(_mm_srli_epi16(b, 4), mask) : _mm_and_si128(b, mask);
  out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), s, m);
  out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), s, m);
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

void int4_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1) { all_rows<Int4Tile>(a, n0, n1); }
void int8_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.mins) all_rows<Int8Tile<true>>(a, n0, n1);
  else all_rows<Int8Tile<false>>(a, n0, n1);
}

}  // namespace localchat_cpu
