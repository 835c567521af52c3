// AVX-512 (F + BW + VL) tiles of the quantized matmuls; compiled for that ISA by the pragma
// below (this file includes no torch headers, and everything but the two entry points has
// internal linkage, so no AVX-512 code can leak into a shared inline function).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include "quant.h"

namespace localchat_cpu {
namespace {

typedef __m512 VF;
constexpr int W = 16;
constexpr int NT = 4;
constexpr int MT = 4;
constexpr int NT_WIDE = 2;
constexpr int MT_WIDE = 8;

inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset1(float f) { return _mm512_set1_ps(f); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(VF v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline void deq4_16(const uint8_t* p, int high, VF s, VF m, VF* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i q = high ? _mm_and_si128(_mm_srli_epi16(b, 4), mask) : _mm_and_si128(b, mask);
  out[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), s, m);
}
inline void deq8_16(const int8_t* p, VF s, VF m, bool has_min, VF* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const VF q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  out[0] = has_min ? _mm512_fmadd_ps(q, s, m) : _mm512_mul_ps(q, s);
}

#include "quant_tiles.h"

}  // namespace

void int4_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1) {
  all_rows<Int4Tile>(a, n0, n1);
}
void int8_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.mins) all_rows<Int8Tile<true>>(a, n0, n1);
  else all_rows<Int8Tile<false>>(a, n0, n1);
}

}  // namespace localchat_cpu
