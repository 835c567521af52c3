// AVX-512 (F + BW + VL + DQ) tiles of the float-weight matmul (fmm.h, fmm_tiles.h); compiled
// for that ISA by the pragma below (no torch headers; internal linkage but for the entry
// point). bf16 weights are widened by a zero-extension and a 16-bit shift (no AVX-512 BF16
// instructions: the same sums on every AVX-512 CPU), fp16 by vcvtph2ps.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include "fmm.h"

namespace localchat_cpu {
namespace {

typedef __m512 VF;
constexpr int W = 16;
constexpr int kMaxRows = 16;
// 1 row: 8 columns (8 independent FMA chains); then NT x MT <= 16 accumulators
constexpr int nt_for(int rows) { return rows == 1 ? 8 : rows <= 4 ? 4 : rows <= 8 ? 2 : 1; }

inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
#include "avx512_common.h"  // sum16
inline float vsum(VF v) { return sum16(v); }

template <int WT>
inline VF wload(const void* w, int64_t i) {
  if constexpr (WT == kFmmBF16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  } else if constexpr (WT == kFmmF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(w) + i)));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  }
}

template <int WT>
inline float wone(const void* w, int64_t i) {
  if constexpr (WT == kFmmBF16) {
    const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  } else if constexpr (WT == kFmmF16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]);
  } else {
    return static_cast<const float*>(w)[i];
  }
}

inline VF vset1(float f) { return _mm512_set1_ps(f); }
inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
inline float sfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
constexpr int ntt_for(int rows) { return rows == 1 ? 8 : rows <= 3 ? 4 : rows <= 7 ? 2 : 1; }

// bf16 pair order: 32 weights -> even columns (low halves shifted up) and odd (high halves)
inline void wsplit(const uint16_t* p, VF& even, VF& odd) {
  const __m512i v = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
constexpr int nt_pair_for(int rows) { return rows == 1 ? 8 : rows <= 5 ? 4 : rows <= 10 ? 2 : 1; }

#include "fmm_tiles.h"

}  // namespace

void fmm_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1) { fmm_all(a, n0, n1); }
void fmmt_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1) { fmmt_all(a, n0, n1); }

}  // namespace localchat_cpu
