// AVX2 kernels of the exact fp32 panel matmuls (panelf.h). Lane j of a vector is output
// 16 t + 8 h + j (h the tile's half, 32 bytes of an octet / quad); per column k the half's 8
// weights are unpacked once (a shift, a mask or sign extension, a conversion, an FMA with the
// group's scale and min) and meet x[m, k] broadcast for each of the pass's rows. TT tiles and
// MT rows per pass (TT * 2 * MT accumulators in registers: several tiles at once for one or
// two rows, whose lone FMA chains would otherwise wait on the FMA latency); more rows take
// further passes over the tiles while their weights are in L1 / L2. Each accumulator takes the
// same FMAs in the same order whatever the pass shape, so the results equal the portable
// kernel's bit for bit.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <type_traits>

#include "panelf.h"

namespace localchat_cpu {
namespace {

constexpr int kMaxRows = 5;  // rows a pass (2 x 5 accumulators + 5 working registers)

// One group's scale and min vectors of half h of tile t (fp16 -> fp32, exact).
inline __m256 ld_half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 weights of column 8 o + c (int4: byte c % 4, nibble c / 4 of each 32-bit lane).
template <int C>
inline __m256 int4_col(__m256i v, __m256 s, __m256 m) {
  const __m256i q = _mm256_and_si256(_mm256_srli_epi32(v, 8 * (C % 4) + 4 * (C / 4)),
                                     _mm256_set1_epi32(0xF));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, m);
}

// The 8 weights of column 4 c + B (int8: byte B of each 32-bit lane, sign extended).
template <int B>
inline __m256 int8_col(__m256i v, __m256 s) {
  const __m256i q = _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * B), 24);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
}

// The 8 weights of column 8 o + C of the int5 panel: the nibble as int4_col's, the top bit
// bit 2 (o % 4) + C / 4 of byte C % 4 of each 32-bit lane of the group's top bits (hs: those
// shifted right by 2 (o % 4)); w = float(u - 16) * d.
template <int C>
inline __m256 int5_col(__m256i v, __m256i hs, __m256 d) {
  const __m256i q = _mm256_and_si256(_mm256_srli_epi32(v, 8 * (C % 4) + 4 * (C / 4)),
                                     _mm256_set1_epi32(0xF));
  const __m256i top = _mm256_and_si256(_mm256_srli_epi32(hs, 8 * (C % 4) + C / 4),
                                       _mm256_set1_epi32(1));
  const __m256i u = _mm256_or_si256(q, _mm256_slli_epi32(top, 4));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(16))), d);
}

template <int TT, int MT>
struct Acc {
  __m256 v[TT][2][MT];
  Acc() {
    for (int i = 0; i < TT; ++i)
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < MT; ++r) v[i][h][r] = _mm256_setzero_ps();
  }
  // v[i][h][r] += w * x[r][k] for every row
  inline void fma(int i, int h, __m256 w, const float* x, int64_t K, int64_t k) {
    for (int r = 0; r < MT; ++r)
      v[i][h][r] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(x + r * K + k), v[i][h][r]);
  }
  inline void store(const PanelF32Args& a, int64_t t, int64_t m0) const {
    for (int i = 0; i < TT; ++i)
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < MT; ++r)
          _mm256_storeu_ps(a.out + (m0 + r) * a.N + 16 * (t + i) + 8 * h, v[i][h][r]);
  }
};

// Tiles t .. t + TT - 1, rows m0 .. m0 + MT - 1.
template <int TT, int MT>
void pass4(const PanelF32Args& a, int64_t t, int64_t m0) {
  const int64_t K = a.K, ng = K / 32;
  const float* x = a.x + m0 * K;
  Acc<TT, MT> acc;
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t o = 4 * g; o < 4 * g + 4; ++o)
      for (int i = 0; i < TT; ++i) {
        const auto* qp = static_cast<const uint8_t*>(a.qweight) + ((t + i) * (K / 8) + o) * 64;
        const int64_t at = ((t + i) * ng + g) * 16;
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp + 32 * h));
          const __m256 s = ld_half8(a.scales + at + 8 * h), m = ld_half8(a.mins + at + 8 * h);
          const int64_t k = 8 * o;
          acc.fma(i, h, int4_col<0>(v, s, m), x, K, k);
          acc.fma(i, h, int4_col<1>(v, s, m), x, K, k + 1);
          acc.fma(i, h, int4_col<2>(v, s, m), x, K, k + 2);
          acc.fma(i, h, int4_col<3>(v, s, m), x, K, k + 3);
          acc.fma(i, h, int4_col<4>(v, s, m), x, K, k + 4);
          acc.fma(i, h, int4_col<5>(v, s, m), x, K, k + 5);
          acc.fma(i, h, int4_col<6>(v, s, m), x, K, k + 6);
          acc.fma(i, h, int4_col<7>(v, s, m), x, K, k + 7);
        }
      }
  acc.store(a, t, m0);
}

template <int TT, int MT>
void pass5(const PanelF32Args& a, int64_t t, int64_t m0) {
  const int64_t K = a.K, ng = K / 32;
  const float* x = a.x + m0 * K;
  Acc<TT, MT> acc;
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t o = 4 * g; o < 4 * g + 4; ++o)
      for (int i = 0; i < TT; ++i) {
        const auto* qp = static_cast<const uint8_t*>(a.qweight) + ((t + i) * (K / 8) + o) * 64;
        const int64_t at = ((t + i) * ng + g) * 16;
        const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(2 * (o - 4 * g)));
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp + 32 * h));
          const __m256i hs = _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              a.qhigh + at * 4 + 32 * h)), shift);
          const __m256 d = ld_half8(a.scales + at + 8 * h);
          const int64_t k = 8 * o;
          acc.fma(i, h, int5_col<0>(v, hs, d), x, K, k);
          acc.fma(i, h, int5_col<1>(v, hs, d), x, K, k + 1);
          acc.fma(i, h, int5_col<2>(v, hs, d), x, K, k + 2);
          acc.fma(i, h, int5_col<3>(v, hs, d), x, K, k + 3);
          acc.fma(i, h, int5_col<4>(v, hs, d), x, K, k + 4);
          acc.fma(i, h, int5_col<5>(v, hs, d), x, K, k + 5);
          acc.fma(i, h, int5_col<6>(v, hs, d), x, K, k + 6);
          acc.fma(i, h, int5_col<7>(v, hs, d), x, K, k + 7);
        }
      }
  acc.store(a, t, m0);
}

template <int TT, int MT>
void pass8(const PanelF32Args& a, int64_t t, int64_t m0) {
  const int64_t K = a.K, ng = K / 32;
  const float* x = a.x + m0 * K;
  Acc<TT, MT> acc;
  for (int64_t g = 0; g < ng; ++g)
    for (int64_t c = 8 * g; c < 8 * g + 8; ++c)
      for (int i = 0; i < TT; ++i) {
        const auto* qp = static_cast<const int8_t*>(a.qweight) + ((t + i) * (K / 4) + c) * 64;
        const int64_t at = ((t + i) * ng + g) * 16;
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp + 32 * h));
          const __m256 s = ld_half8(a.scales + at + 8 * h);
          const int64_t k = 4 * c;
          acc.fma(i, h, int8_col<0>(v, s), x, K, k);
          acc.fma(i, h, int8_col<1>(v, s), x, K, k + 1);
          acc.fma(i, h, int8_col<2>(v, s), x, K, k + 2);
          acc.fma(i, h, int8_col<3>(v, s), x, K, k + 3);
        }
      }
  acc.store(a, t, m0);
}

// Tiles [t0, t1) over all rows: each group of tiles (4 at one row, 2 at two, else 1) takes
// passes of at most kMaxRows rows split evenly.
template <template <int, int> class P>
void drive(const PanelF32Args& a, int64_t t0, int64_t t1) {
  const int64_t M = a.M;
  if (M == 1 || M == 2) {
    int64_t t = t0;
    if (M == 1) {
      for (; t + 4 <= t1; t += 4) P<4, 1>::run(a, t, 0);
      for (; t < t1; ++t) P<1, 1>::run(a, t, 0);
    } else {
      for (; t + 2 <= t1; t += 2) P<2, 2>::run(a, t, 0);
      for (; t < t1; ++t) P<1, 2>::run(a, t, 0);
    }
    return;
  }
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t m = 0; m < M;) {
      const int64_t passes = (M - m + kMaxRows - 1) / kMaxRows;
      const int64_t mt = (M - m + passes - 1) / passes;
      switch (mt) {
        case 1: P<1, 1>::run(a, t, m); break;
        case 2: P<1, 2>::run(a, t, m); break;
        case 3: P<1, 3>::run(a, t, m); break;
        case 4: P<1, 4>::run(a, t, m); break;
        default: P<1, 5>::run(a, t, m); break;
      }
      m += mt;
    }
}

template <int TT, int MT>
struct P4 {
  static void run(const PanelF32Args& a, int64_t t, int64_t m0) { pass4<TT, MT>(a, t, m0); }
};
template <int TT, int MT>
struct P5 {
  static void run(const PanelF32Args& a, int64_t t, int64_t m0) { pass5<TT, MT>(a, t, m0); }
};
template <int TT, int MT>
struct P8 {
  static void run(const PanelF32Args& a, int64_t t, int64_t m0) { pass8<TT, MT>(a, t, m0); }
};

}  // namespace

void int4_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1) { drive<P4>(a, t0, t1); }
void int5_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1) { drive<P5>(a, t0, t1); }
void int8_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1) { drive<P8>(a, t0, t1); }

}  // namespace localchat_cpu
