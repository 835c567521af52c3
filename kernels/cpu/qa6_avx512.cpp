// AVX-512 (F/BW/VL/DQ) kernels of the int6 layout (qa6.h) that need no VNNI: the row
// dequantization and the exact fp32-activation matmul. A 128-column chunk decodes into eight
// 16-column fp32 vectors in column order: u bytes as in qa6_vnni.cpp, the even / odd columns
// interleaved back by unpacklo / unpackhi (per 128-bit lane l: columns 32 l .. 32 l + 15 and
// 32 l + 16 .. 32 l + 31), minus 32, widened, times the sub-block's d * sc (one rounding,
// explicit rounding intrinsic so no contraction). bf16 out rounds to nearest even by integer
// arithmetic (dequant_avx512.cpp's to_bf16).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa6.h"

namespace localchat_cpu {
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __m256i to_bf16(__m512 w) {
  const __m512i u = _mm512_castps_si512(w);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// Chunk c of row n -> w[j] = columns 128 c + 16 j .. 128 c + 16 j + 15 (fp32, exact values).
inline void decode_chunk(const Int6Args& a, int64_t n, int64_t c, __m512* w) {
  const int64_t K = a.K;
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30),
                off = _mm512_set1_epi8(32);
  const __m512i q = _mm512_loadu_si512(a.qlow + n * (K / 2) + 64 * c);
  const __m256i h = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(a.qhigh + n * (K / 4) + 32 * c));
  const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
  const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, nib),
                                     _mm512_and_si512(_mm512_slli_epi16(H, 4), top));
  const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), nib),
                                     _mm512_and_si512(H, top));
  const __m512i e0 = _mm512_sub_epi8(_mm512_unpacklo_epi8(lo, hi), off);
  const __m512i e1 = _mm512_sub_epi8(_mm512_unpackhi_epi8(lo, hi), off);
  const __m256 s8 = _mm256_mul_ps(
      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales + n * (K / 16) + 8 * c)))),
      _mm256_set1_ps(_cvtsh_ss(a.ssc[n * (K / 256) + c / 2])));
  alignas(32) float s[8];
  _mm256_store_ps(s, s8);
#define LC_LANE(L)                                                                              \
  w[2 * L] = _mm512_mul_round_ps(                                                               \
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e0, L))),               \
      _mm512_set1_ps(s[2 * L]), kRound);                                                        \
  w[2 * L + 1] = _mm512_mul_round_ps(                                                           \
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e1, L))),               \
      _mm512_set1_ps(s[2 * L + 1]), kRound);
  LC_LANE(0) LC_LANE(1) LC_LANE(2) LC_LANE(3)
#undef LC_LANE
}

template <bool BF16>
void dequant_rows(const Int6Args& a, void* out, int64_t r0, int64_t r1) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n) {
    for (int64_t c = 0; c < K / 128; ++c) {
      __m512 w[8];
      decode_chunk(a, n, c, w);
      for (int j = 0; j < 8; ++j) {
        const int64_t at = n * K + 128 * c + 16 * j;
        if constexpr (BF16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at),
                              to_bf16(w[j]));
        else
          _mm512_storeu_ps(static_cast<float*>(out) + at, w[j]);
      }
    }
  }
}

inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(
      _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
}

// Up to four output columns x MT activation rows, chunk by chunk: one accumulator per
// (column, row) updated in k order (16 lanes), one transposed reduction at the end.
template <int MT>
inline void f32_group(const Int6Args& a, int64_t n, int64_t cols, int64_t m0) {
  const int64_t K = a.K;
  __m512 acc[4][MT];
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < MT; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    for (int j = 0; j < cols; ++j) {
      __m512 w[8];
      decode_chunk(a, n + j, c, w);
      for (int r = 0; r < MT; ++r) {
        const float* x = a.x + (m0 + r) * K + 128 * c;
        for (int i = 0; i < 8; ++i)
          acc[j][r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * i), w[i], acc[j][r]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]));
    for (int j = 0; j < cols; ++j) int6_store(a, m0 + r, n + j, t[j]);
  }
}

}  // namespace

void int6_dequant_rows_avx512(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  if (bf16) dequant_rows<true>(a, out, r0, r1);
  else dequant_rows<false>(a, out, r0, r1);
}

void int6_f32_avx512(const Int6Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t cols = std::min<int64_t>(4, n1 - n);
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) f32_group<4>(a, n, cols, m);
    switch (a.M - m) {
      case 3: f32_group<3>(a, n, cols, m); break;
      case 2: f32_group<2>(a, n, cols, m); break;
      case 1: f32_group<1>(a, n, cols, m); break;
      default: break;
    }
  }
}

}  // namespace localchat_cpu
