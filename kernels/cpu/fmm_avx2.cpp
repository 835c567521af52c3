// AVX2 + FMA tiles of the float-weight matmul (fmm.h, fmm_tiles.h); compiled for that ISA by
// the pragma below (no torch headers; internal linkage but for the entry point). 16 vector
// registers: at most 8 rows and 8 accumulators per tile.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "fmm.h"

namespace localchat_cpu {
namespace {

typedef __m256 VF;
constexpr int W = 8;
constexpr int kMaxRows = 8;
constexpr int nt_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(VF v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

template <int WT>
inline VF wload(const void* w, int64_t i) {
  if constexpr (WT == kFmmBF16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  } else if constexpr (WT == kFmmF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(w) + i)));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
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

inline VF vset1(float f) { return _mm256_set1_ps(f); }
inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
inline float sfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
constexpr int ntt_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

// bf16 pair order: 16 weights -> even columns (low halves shifted up) and odd (high halves)
inline void wsplit(const uint16_t* p, VF& even, VF& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
constexpr int nt_pair_for(int rows) { return rows == 1 ? 4 : rows <= 4 ? 2 : 1; }

#include "fmm_tiles.h"

}  // namespace

void fmm_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1) { fmm_all(a, n0, n1); }
void fmmt_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1) { fmmt_all(a, n0, n1); }

}  // namespace localchat_cpu
