// AVX-512 (F + BW + VL + DQ) int8 group-wise row dequantization (dequant.h): 16 weights per
// step, int8 -> int32 -> fp32, times the group's scale (plus its min) with explicit rounding
// intrinsics (so no fma contraction can fuse the product and the sum), and for bf16 out a
// round-to-nearest-even by integer arithmetic (not vcvtneps2bf16, which flushes subnormals).
// Group tails narrower than 16 use masked loads and stores. Compiled for that ISA by the
// pragma below; no torch headers, and everything but the entry point has internal linkage.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include "dequant.h"

namespace localchat_cpu {
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <bool HALF>
inline float ldsc(const void* p, int64_t i) {
  if constexpr (HALF) return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

#include "avx512_common.h"  // to_bf16

template <bool HALF, bool MINS, bool BF16>
void rows(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups;
  float* out32 = static_cast<float*>(a.out);
  uint16_t* out16 = static_cast<uint16_t*>(a.out);
  for (int64_t n = r0; n < r1; ++n) {
    const int8_t* q = a.qweight + n * K;
    for (int64_t g = 0; g < ng; ++g) {
      const __m512 s = _mm512_set1_ps(ldsc<HALF>(a.scales, n * ng + g));
      const __m512 m = MINS ? _mm512_set1_ps(ldsc<HALF>(a.mins, n * ng + g)) : s;
      const int64_t end = (g + 1) * G;
      int64_t j = g * G;
      for (; j + 16 <= end; j += 16) {  // (unmasked: 2x the masked loop's speed here)
        const __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j))));
        __m512 w = _mm512_mul_round_ps(qf, s, kRound);
        if constexpr (MINS) w = _mm512_add_round_ps(w, m, kRound);
        if constexpr (BF16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + n * K + j), to_bf16(w));
        else
          _mm512_storeu_ps(out32 + n * K + j, w);
      }
      if (j < end) {  // a group tail narrower than 16
        const __mmask16 k = static_cast<__mmask16>((1u << (end - j)) - 1);
        const __m512 qf =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, q + j)));
        __m512 w = _mm512_mul_round_ps(qf, s, kRound);
        if constexpr (MINS) w = _mm512_add_round_ps(w, m, kRound);
        if constexpr (BF16)
          _mm256_mask_storeu_epi16(out16 + n * K + j, k, to_bf16(w));
        else
          _mm512_mask_storeu_ps(out32 + n * K + j, k, w);
      }
    }
  }
}

template <bool HALF, bool MINS>
void pick_out(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.bf16) rows<HALF, MINS, true>(a, r0, r1);
  else rows<HALF, MINS, false>(a, r0, r1);
}

// int4: 32 weights (16 bytes) per step: bytes widened to int32, low / high nibbles
// interleaved back into column order by two permutes, one fma with the group's scale and min.
template <bool HALF, bool BF16>
void rows4(const Int4DequantArgs& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups;
  float* out32 = static_cast<float*>(a.out);
  uint16_t* out16 = static_cast<uint16_t*>(a.out);
  const __m512i idx0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i idx1 =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i nib = _mm512_set1_epi32(0x0F);
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* q = a.qweight + n * (K / 2);
    for (int64_t g = 0; g < ng; ++g) {
      const __m512 s = _mm512_set1_ps(ldsc<HALF>(a.scales, n * ng + g));
      const __m512 m = _mm512_set1_ps(ldsc<HALF>(a.mins, n * ng + g));
      for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
        const __m512i b = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k / 2)));
        const __m512i lo = _mm512_and_si512(b, nib), hi = _mm512_srli_epi32(b, 4);
        const __m512 w0 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, idx0, hi)), s, m);
        const __m512 w1 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, idx1, hi)), s, m);
        if constexpr (BF16) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + n * K + k), to_bf16(w0));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + n * K + k + 16), to_bf16(w1));
        } else {
          _mm512_storeu_ps(out32 + n * K + k, w0);
          _mm512_storeu_ps(out32 + n * K + k + 16, w1);
        }
      }
    }
  }
}

}  // namespace

void int8_dequant_rows_avx512(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.half) {
    if (a.mins) pick_out<true, true>(a, r0, r1);
    else pick_out<true, false>(a, r0, r1);
  } else {
    if (a.mins) pick_out<false, true>(a, r0, r1);
    else pick_out<false, false>(a, r0, r1);
  }
}

}  // namespace localchat_cpu

namespace localchat_cpu {

void int4_dequant_rows_avx512(const Int4DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.half) {
    if (a.bf16) rows4<true, true>(a, r0, r1);
    else rows4<true, false>(a, r0, r1);
  } else {
    if (a.bf16) rows4<false, true>(a, r0, r1);
    else rows4<false, false>(a, r0, r1);
  }
}

}  // namespace localchat_cpu
