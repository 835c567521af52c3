// AVX2 kernels of the int5 layout (qa5.h); also the integer-dot path of AVX-512 CPUs without
// VNNI. Per half chunk bp (64 columns: 32 qlow bytes, 32 bits of each qhigh mask):
//   u bytes: the 32 mask bits expanded to 32 bytes (broadcast, byte shuffle, AND with each
//   byte's bit, compare), AND 16, OR the nibbles; even columns (lo) and odd columns (hi).
//   integer dot: `maddubs` (u8 x s8 -> int16 pairs, at most 2 * 31 * 127 each, the even and
//   odd halves summed: 15748, no saturation), `madd` with ones -> 8 int32 lanes (lane i = lane
//   8 bp + i of qa5.h), plus corr = -16 * (lane's activation sum), converted and FMA'd with the
//   lane's d * dact; one 8-lane accumulator per (column, row), a fixed horizontal sum at the
//   end.
//   fp32 / dequant: the even / odd bytes interleaved back (unpacklo / unpackhi per 128-bit
//   lane), minus 16, widened, times d (exact); the fp32 matmul does one fma per weight into two
//   8-lane accumulators per (column, row) (vector j into j % 2), in k order.
// Design after llama.cpp's AVX2 Q5_0 x Q8_0 dot product (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "qa5.h"

namespace localchat_cpu {
namespace {

// Bytes ahead of the qlow stream prefetched (qhigh: a quarter of that).
constexpr int64_t kPrefetch = 1024;

inline void prefetch_chunk(const Int5Args& a, int64_t n, int64_t c) {
  _mm_prefetch(reinterpret_cast<const char*>(a.qlow + n * (a.K / 2) + 64 * c + kPrefetch),
               _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(a.qhigh + n * (a.K / 8) + 16 * c + kPrefetch / 4),
               _MM_HINT_T0);
}

inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// 32 bits -> 32 bytes: byte j = 16 when bit j is set, else 0.
inline __m256i bits_to_16(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(x)),
      _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// Half bp (0, 1) of chunk c of row n: the 64 columns' u bytes, even columns (lo) and odd
// columns (hi) of qlow bytes 32 bp .. 32 bp + 31.
inline void u_half(const Int5Args& a, int64_t n, int64_t c, int bp, __m256i* lo, __m256i* hi) {
  const int64_t K = a.K;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i q = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(a.qlow + n * (K / 2) + 64 * c + 32 * bp));
  const uint8_t* h = a.qhigh + n * (K / 8) + 16 * c + 4 * bp;
  *lo = _mm256_or_si256(_mm256_and_si256(q, nib), bits_to_16(h));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nib), bits_to_16(h + 8));
}

template <int MT>
inline void a8_tile(const Int5Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint16_t* sd = a.sc + n * (K / 32);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    prefetch_chunk(a, n, c);
    for (int bp = 0; bp < 2; ++bp) {
      __m256i lo, hi;
      u_half(a, n, c, bp, &lo, &hi);
      // lanes 0-3 <- block 4 c + 2 bp, lanes 4-7 <- the next
      const __m256 sv = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(sd[4 * c + 2 * bp + 1])),
                                        _mm_set1_ps(_cvtsh_ss(sd[4 * c + 2 * bp])));
      for (int r = 0; r < MT; ++r) {
        const int64_t m = m0 + r;
        const int8_t* xe = a.xq + m * K + 128 * c + 32 * bp;
        const __m256i p = _mm256_add_epi16(
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xe))),
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256(
                                         reinterpret_cast<const __m256i*>(xe + 64))));
        const __m256i dot = _mm256_add_epi32(
            _mm256_madd_epi16(p, ones),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                a.corr + m * (K / 8) + 16 * c + 8 * bp)));
        const __m256 dv = _mm256_loadu_ps(a.dv + (m * (K / 32) + 4 * c + 2 * bp) * 4);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sv, dv), acc[r]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) int5_store(a, m0 + r, n, hsum(acc[r]));
}

// Half bp of chunk c -> w[j] = columns 128 c + 64 bp + 8 j .. + 7 (fp32, exact values).
inline void decode_half(const Int5Args& a, int64_t n, int64_t c, int bp, __m256* w) {
  __m256i lo, hi;
  u_half(a, n, c, bp, &lo, &hi);
  const __m256i off = _mm256_set1_epi8(16);
  // per 128-bit lane l: e0 = columns 32 l .. 32 l + 15, e1 = 32 l + 16 .. 32 l + 31 (block l)
  const __m256i e0 = _mm256_sub_epi8(_mm256_unpacklo_epi8(lo, hi), off);
  const __m256i e1 = _mm256_sub_epi8(_mm256_unpackhi_epi8(lo, hi), off);
  const uint16_t* sd = a.sc + n * (a.K / 32) + 4 * c + 2 * bp;
  const float s[2] = {_cvtsh_ss(sd[0]), _cvtsh_ss(sd[1])};
  const __m128i unit[4] = {_mm256_castsi256_si128(e0), _mm256_castsi256_si128(e1),
                           _mm256_extracti128_si256(e0, 1), _mm256_extracti128_si256(e1, 1)};
  for (int u = 0; u < 4; ++u) {
    const __m256 sv = _mm256_set1_ps(s[u / 2]);
    w[2 * u] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unit[u])), sv);
    w[2 * u + 1] = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(unit[u], 8))), sv);
  }
}

// One output column x MT activation rows: two accumulators per row (the half chunk's
// 8-column vectors j go to accumulator j % 2), summed once at the end: the order depends only
// on k.
template <int MT>
inline void f32_tile(const Int5Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  __m256 acc[MT][2];
  for (int r = 0; r < MT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    prefetch_chunk(a, n, c);
    for (int bp = 0; bp < 2; ++bp) {
      __m256 w[8];
      decode_half(a, n, c, bp, w);
      for (int r = 0; r < MT; ++r) {
        const float* x = a.x + (m0 + r) * K + 128 * c + 64 * bp;
        for (int j = 0; j < 8; ++j)
          acc[r][j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * j), w[j], acc[r][j & 1]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) int5_store(a, m0 + r, n, hsum(_mm256_add_ps(acc[r][0], acc[r][1])));
}

// 16 fp32 -> 16 bf16 bits (round to nearest even, NaN -> 0x7FC0).
inline __m256i to_bf16(__m256 a, __m256 b) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                qnan = _mm256_set1_epi32(0x7fc0);
  __m256i r[2];
  const __m256 v[2] = {a, b};
  for (int i = 0; i < 2; ++i) {
    const __m256i u = _mm256_castps_si256(v[i]);
    __m256i t = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    t = _mm256_srli_epi32(t, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    r[i] = _mm256_blendv_epi8(t, qnan, nan);
  }
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
}

}  // namespace

void int5_a8_avx2(const Int5Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) a8_tile<4>(a, n, m);
    switch (a.M - m) {
      case 3: a8_tile<3>(a, n, m); break;
      case 2: a8_tile<2>(a, n, m); break;
      case 1: a8_tile<1>(a, n, m); break;
      default: break;
    }
  }
}

void int5_f32_avx2(const Int5Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) f32_tile<4>(a, n, m);
    switch (a.M - m) {
      case 3: f32_tile<3>(a, n, m); break;
      case 2: f32_tile<2>(a, n, m); break;
      case 1: f32_tile<1>(a, n, m); break;
      default: break;
    }
  }
}

void int5_dequant_rows_avx2(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n)
    for (int64_t c = 0; c < K / 128; ++c)
      for (int bp = 0; bp < 2; ++bp) {
        __m256 w[8];
        decode_half(a, n, c, bp, w);
        const int64_t at = n * K + 128 * c + 64 * bp;
        for (int j = 0; j < 8; j += 2) {
          if (bf16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at + 8 * j),
                                to_bf16(w[j], w[j + 1]));
          else {
            _mm256_storeu_ps(static_cast<float*>(out) + at + 8 * j, w[j]);
            _mm256_storeu_ps(static_cast<float*>(out) + at + 8 * j + 8, w[j + 1]);
          }
        }
      }
}

}  // namespace localchat_cpu
