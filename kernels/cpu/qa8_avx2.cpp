// AVX2 integer-dot matmuls (qa8.h): per 32-column block `maddubs` (u8 x s8 -> pairs of int16)
// then `madd` with ones (-> 8 int32), converted and FMA'd with the block's combined scale
// into an fp32 vector accumulator. int4 q (0..15) is already unsigned; int8 weights use the
// sign trick (|w| x sign(w) * xq, at most 2 * 128 * 127 per int16 pair: no saturation).
// Also the path for AVX-512 CPUs without VNNI. Design after llama.cpp's ggml_vec_dot_q4_1_q8_1
// / q8_0_q8_0 AVX2 kernels (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "qa8.h"

namespace localchat_cpu {
namespace {

inline float ld1(const float* p) { return *p; }
inline float ld1(const uint16_t* p) { return _cvtsh_ss(*p); }

inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// fp32 min term: sum_g mins[g] * xs[g] (8 lanes, then the scalar tail).
template <class ST>
inline float min_term(const ST* mn, const float* xs, int64_t ng) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= ng; g += 8) {
    __m256 m;
    if constexpr (sizeof(ST) == 2)
      m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + g)));
    else
      m = _mm256_loadu_ps(reinterpret_cast<const float*>(mn + g));
    acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(xs + g), acc);
  }
  float t = hsum(acc);
  for (; g < ng; ++g) t = __builtin_fmaf(ld1(mn + g), xs[g], t);
  return t;
}

template <bool INT4, int MT, class ST>
inline void tile(const A8Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nb = K / 32;
  const ST* s = static_cast<const ST*>(a.scales) + n * ng;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w, ax;
    if (INT4) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
          static_cast<const uint8_t*>(a.qweight) + n * (K / 2) + b * 16));
      const __m128i mask = _mm_set1_epi8(0x0F);
      w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
      ax = w;
    } else {
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          static_cast<const int8_t*>(a.qweight) + n * K + b * 32));
      ax = _mm256_sign_epi8(w, w);
    }
    __m256 sv;
    if (a.group_size == 16)
      sv = _mm256_set_m128(_mm_set1_ps(ld1(s + 2 * b + 1)), _mm_set1_ps(ld1(s + 2 * b)));
    else
      sv = _mm256_set1_ps(ld1(s + a.blk2grp[b]));
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + m * Kp + b * 32));
      if (!INT4) xq = _mm256_sign_epi8(xq, w);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, xq), ones);
      const __m256 sd = _mm256_mul_ps(sv, _mm256_set1_ps(a.d[m * (Kp / 32) + b]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t m = m0 + r;
    float t = hsum(acc[r]);
    if (a.mins)
      t += min_term(static_cast<const ST*>(a.mins) + n * ng, a.xs + m * ng, ng);
    a.out[m * a.N + n] = t;
  }
}

template <bool INT4, class ST>
void rows(const A8Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) tile<INT4, 4, ST>(a, n, m);
    switch (a.M - m) {
      case 3: tile<INT4, 3, ST>(a, n, m); break;
      case 2: tile<INT4, 2, ST>(a, n, m); break;
      case 1: tile<INT4, 1, ST>(a, n, m); break;
      default: break;
    }
  }
}

}  // namespace

void int4_a8_avx2(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<true, uint16_t>(a, n0, n1);
  else rows<true, float>(a, n0, n1);
}
void int8_a8_avx2(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<false, uint16_t>(a, n0, n1);
  else rows<false, float>(a, n0, n1);
}

}  // namespace localchat_cpu
