// AVX-512 VNNI integer-dot matmuls (qa8.h): per 64-column chunk one `vpdpbusd` (u8 x s8 ->
// 16 int32 lanes; lanes 0-7 cover the chunk's first 32-column block, 8-15 the second),
// converted and FMA'd with the per-lane combined scale into an fp32 vector accumulator.
// int4: q (0..15) is already unsigned; the chunk's 32 weight bytes become
// [low(block 0), high(block 0), low(block 1), high(block 1)] to meet the activation layout.
// int8: weights XOR 0x80 (= q + 128, unsigned); the dot starts from -128 * sum(xq) per lane
// (ncorr), so every dot is exact. A trailing 32-column block (K % 64 == 32) is a chunk whose
// upper half is zero (weights zero-extended, activations zero padded). Design after
// llama.cpp's AVX-512 VNNI q4/q8 dot products (own code).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include "qa8.h"

namespace localchat_cpu {
namespace {

inline float ld1(const float* p) { return *p; }
inline float ld1(const uint16_t* p) { return _cvtsh_ss(*p); }

template <class ST>
inline __m128 ld4(const ST* p) {
  if constexpr (sizeof(ST) == 2)
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  else
    return _mm_loadu_ps(reinterpret_cast<const float*>(p));
}

template <class ST>
inline __m128 ld2(const ST* p) {
  if constexpr (sizeof(ST) == 2) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
  } else {
    return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
  }
}

template <class ST>
inline float min_term(const ST* mn, const float* xs, int64_t ng) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; g += 16) {
    const __mmask16 k = ng - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (ng - g)) - 1);
    __m512 m;
    if constexpr (sizeof(ST) == 2)
      m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, mn + g));
    else
      m = _mm512_maskz_loadu_ps(k, reinterpret_cast<const float*>(mn + g));
    acc = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(k, xs + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Weight chunk c (64 columns, or 32 when `half_chunk`) as 64 bytes for vpdpbusd.
template <bool INT4>
inline __m512i load_w(const A8Args& a, int64_t n, int64_t c, bool half_chunk) {
  if (INT4) {
    const uint8_t* p = static_cast<const uint8_t*>(a.qweight) + n * (a.K / 2) + c * 32;
    const __m512i y = half_chunk
        ? _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
        : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i dup = _mm512_shuffle_i64x2(y, y, 0x50);  // 128-bit lanes [0, 0, 1, 1]
    const __m512i sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(dup, sh), _mm512_set1_epi8(0x0F));
  }
  const int8_t* p = static_cast<const int8_t*>(a.qweight) + n * a.K + c * 64;
  const __m512i w = half_chunk
      ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
      : _mm512_loadu_si512(p);
  return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
}

template <bool INT4, int MT, class ST>
inline void tile(const A8Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nc = (K + 63) / 64;
  const ST* s = static_cast<const ST*>(a.scales) + n * ng;
  const __m512i idx2 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    const bool half_chunk = 64 * c + 32 == K;
    const __m512i w = load_w<INT4>(a, n, c, half_chunk);
    __m512 sv;
    if (a.group_size == 16) {  // int8 only: lanes 4j..4j+3 <- group 4c + j
      sv = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(
          half_chunk ? _mm_setr_ps(ld1(s + 4 * c), ld1(s + 4 * c + 1), 0.0f, 0.0f)
                     : ld4(s + 4 * c)));
    } else if (a.group_size == 32 && !half_chunk) {  // GGUF groups: two consecutive scales
      sv = _mm512_permutexvar_ps(idx2, _mm512_castps128_ps512(ld2(s + 2 * c)));
    } else {
      sv = _mm512_insertf32x8(_mm512_set1_ps(ld1(s + a.blk2grp[2 * c])),
                              _mm256_set1_ps(ld1(s + a.blk2grp[2 * c + 1])), 1);
    }
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const __m512i xq = _mm512_loadu_si512(a.xq + m * Kp + c * 64);
      const __m512i init = INT4 ? _mm512_setzero_si512()
                                : _mm512_loadu_si512(a.ncorr + m * (Kp / 4) + c * 16);
      const __m512i dot = _mm512_dpbusd_epi32(init, w, xq);
      const __m512 dv = _mm512_loadu_ps(a.dv + (m * (Kp / 64) + c) * 16);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t m = m0 + r;
    float t = _mm512_reduce_add_ps(acc[r]);
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

void int4_a8_vnni(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<true, uint16_t>(a, n0, n1);
  else rows<true, float>(a, n0, n1);
}
void int8_a8_vnni(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<false, uint16_t>(a, n0, n1);
  else rows<false, float>(a, n0, n1);
}

}  // namespace localchat_cpu
