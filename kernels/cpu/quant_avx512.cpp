// AVX-512 (F + BW + VL + DQ) tiles of the quantized matmuls; compiled for that ISA by the
// pragma below (this file includes no torch headers, and everything but the two entry points
// has internal linkage, so no AVX-512 code can leak into a shared inline function).
//
// int4: per (row, group) a 16-entry table T[q] = fma(q, s, m) (exactly the dequantized
// values); per 32-column block one 128-bit broadcast of the 16 weight bytes, two per-lane
// shifts (vpsrlvd) and two table lookups (vpermps reads only an index's low 4 bits, so no
// mask is needed): 4 vector ops per 32 weights, shared by every activation row of the tile,
// plus one FMA per 16 weights and row. The shifts run on one port and the lookups on the
// other, so a 1-row decode is bound by memory rather than by dequantization.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include "quant.h"

namespace localchat_cpu {
namespace {

typedef __m512 VF;
constexpr int W = 16;
constexpr int NT_A = 4, MT_A = 4;   // decode: 4 output columns share the activation loads
constexpr int NT_B = 2, MT_B = 8;   // verification: each weight block serves 5..8 rows
constexpr int NT_C = 1, MT_C = 16;  // 9..16 rows (and blocks of 16 beyond)

inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset1(float f) { return _mm512_set1_ps(f); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
#include "avx512_common.h"  // sum16
inline float vsum(VF v) { return sum16(v); }

typedef __m512 P4;  // the table fma(q, s, m), q = 0..15
inline P4 prep4(float s, float m) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(m));
}
inline void deq4_32(const uint8_t* p, const P4& table, VF* out) {
  // lane j: 32-bit word j % 4 of the block, shifted to nibble j / 4 (v = 0) or 4 + j / 4
  const __m512i sh0 = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  const __m512i sh1 = _mm512_add_epi32(sh0, _mm512_set1_epi32(16));
  const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  out[0] = _mm512_permutexvar_ps(_mm512_srlv_epi32(b, sh0), table);
  out[1] = _mm512_permutexvar_ps(_mm512_srlv_epi32(b, sh1), table);
}
inline void deq8_16(const int8_t* p, VF s, VF m, bool has_min, VF* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const VF q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  out[0] = has_min ? _mm512_fmadd_ps(q, s, m) : _mm512_mul_ps(q, s);
}

#include "quant_tiles.h"

}  // namespace

void int4_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1) { int4_all(a, n0, n1); }
void int8_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1) { int8_all(a, n0, n1); }

}  // namespace localchat_cpu
