// AVX2 group-wise row dequantization (dequant.h). int8: 8 weights per step, int8 -> int32 ->
// fp32, times the group's scale (plus its min), for bf16 out a round-to-nearest-even by
// integer arithmetic; group tails narrower than 8 in scalar code with the same formula. The
// target below has no FMA on purpose: nothing can fuse the product and the sum into one
// rounding (the reference rounds each). int4 (G a multiple of 32): the fused q * s + m its
// layout defines, in a function of its own target. No torch headers; internal linkage but the
// entries.
#pragma GCC target("avx2,f16c")
#include <immintrin.h>

#include <cstring>

#include "dequant.h"

namespace localchat_cpu {
namespace {

template <bool HALF>
inline float ldsc(const void* p, int64_t i) {
  if constexpr (HALF) return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline __m128i to_bf16(__m256 w) {
  const __m256i u = _mm256_castps_si256(w);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  r = _mm256_srli_epi32(r, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
  // every lane is <= 0xFFFF, so the unsigned saturating pack is exact
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

template <bool HALF, bool MINS, bool BF16>
void rows(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups;
  float* out32 = static_cast<float*>(a.out);
  uint16_t* out16 = static_cast<uint16_t*>(a.out);
  for (int64_t n = r0; n < r1; ++n) {
    const int8_t* q = a.qweight + n * K;
    for (int64_t g = 0; g < ng; ++g) {
      const float sf = ldsc<HALF>(a.scales, n * ng + g);
      const float mf = MINS ? ldsc<HALF>(a.mins, n * ng + g) : 0.0f;
      const __m256 s = _mm256_set1_ps(sf), m = _mm256_set1_ps(mf);
      const int64_t end = (g + 1) * G;
      int64_t j = g * G;
      for (; j + 8 <= end; j += 8) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
        __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
        if constexpr (MINS) w = _mm256_add_ps(w, m);
        if constexpr (BF16)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out16 + n * K + j), to_bf16(w));
        else
          _mm256_storeu_ps(out32 + n * K + j, w);
      }
      for (; j < end; ++j) {
        float w = static_cast<float>(q[j]) * sf;
        if constexpr (MINS) w = w + mf;
        if constexpr (BF16) out16[n * K + j] = f2bf(w);
        else out32[n * K + j] = w;
      }
    }
  }
}

template <bool HALF, bool MINS>
void pick_out(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.bf16) rows<HALF, MINS, true>(a, r0, r1);
  else rows<HALF, MINS, false>(a, r0, r1);
}

// int4: 32 weights (16 bytes) per step: low / high nibbles interleaved back into column order
// by two byte unpacks, widened 8 at a time, one fma with the group's scale and min (the fused
// product and sum the layout's formula rounds once: this function's target adds FMA).
template <bool HALF, bool BF16>
__attribute__((target("avx2,fma,f16c"))) void rows4(const Int4DequantArgs& a, int64_t r0,
                                                      int64_t r1) {
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups;
  float* out32 = static_cast<float*>(a.out);
  uint16_t* out16 = static_cast<uint16_t*>(a.out);
  const __m128i nib = _mm_set1_epi8(0x0F);
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* q = a.qweight + n * (K / 2);
    for (int64_t g = 0; g < ng; ++g) {
      const __m256 s = _mm256_set1_ps(ldsc<HALF>(a.scales, n * ng + g));
      const __m256 m = _mm256_set1_ps(ldsc<HALF>(a.mins, n * ng + g));
      for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k / 2));
        const __m128i lo = _mm_and_si128(b, nib);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
        const __m128i c[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
        for (int i = 0; i < 4; ++i) {
          const __m128i part = i % 2 ? _mm_srli_si128(c[i / 2], 8) : c[i / 2];
          const __m256 w =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)), s, m);
          if constexpr (BF16)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out16 + n * K + k + 8 * i), to_bf16(w));
          else
            _mm256_storeu_ps(out32 + n * K + k + 8 * i, w);
        }
      }
    }
  }
}

}  // namespace

void int4_dequant_rows_avx2(const Int4DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.half) {
    if (a.bf16) rows4<true, true>(a, r0, r1);
    else rows4<true, false>(a, r0, r1);
  } else {
    if (a.bf16) rows4<false, true>(a, r0, r1);
    else rows4<false, false>(a, r0, r1);
  }
}

void int8_dequant_rows_avx2(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.half) {
    if (a.mins) pick_out<true, true>(a, r0, r1);
    else pick_out<true, false>(a, r0, r1);
  } else {
    if (a.mins) pick_out<false, true>(a, r0, r1);
    else pick_out<false, false>(a, r0, r1);
  }
}

}  // namespace localchat_cpu
