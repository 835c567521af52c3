// Helpers of the panel layouts' AVX2 kernels (panel{4,5,6,8}_avx2.cpp): loads of a tile's
// 8-lane scale vectors, activation broadcasts, a group's fp32 fold, the stores of 16 outputs
// and the tile/row driver.
// Included after immintrin.h and qa8.h by TUs compiled for AVX2 + FMA + F16C; everything here
// sits in an anonymous namespace (no symbol shared with a TU compiled for another ISA).
#pragma once
#include <cstring>
#include <type_traits>

namespace localchat_cpu {
namespace {

#include "panel_pass.h"

constexpr int64_t kPrefetch2 = 1024;  // bytes ahead in a tile's weight stream
// Activation rows per pass: their int16 sums (2 registers a row) and the tile's unpacked
// weights (4) nearly fill the 16 registers; the fp32 accumulators live in L1 (once a group).
// Zen 3, one thread, Q4_K 8960 x 1536, 128 rows: 6 rows a pass 80 GMAC/s, 8 rows 79, 4 rows
// 62, 3 rows 61 (interleaved runs; about one `maddubs` a cycle).
constexpr int kRowsAvx2 = 6;

// 8 uint8 -> 8 fp32 lanes.
inline __m256 u8x8_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// 8 fp16 -> 8 fp32 lanes.
inline __m256 f16x8_ps(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Four activation bytes broadcast to every 32-bit lane.
inline __m256i bcast4_256(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Outputs n .. n + 15 of row m (v[0]: n .. n + 7), fp32 or bf16 as a8_store rounds.
inline void store16_avx2(const A8Args& a, int64_t m, int64_t n, const __m256* v) {
  if (!a.out_bf16) {
    float* o = static_cast<float*>(a.out) + m * a.N + n;
    _mm256_storeu_ps(o, v[0]);
    _mm256_storeu_ps(o + 8, v[1]);
    return;
  }
  alignas(32) float t[16];
  _mm256_store_ps(t, v[0]);
  _mm256_store_ps(t + 8, v[1]);
  for (int j = 0; j < 16; ++j) a8_store(a, m, n + j, t[j]);
}

// One group's term of 8 outputs of MT rows: acc[r][8h ..] = fma(float(isum[r]), sv * d_act[m0
// + r, g], acc[r][8h ..]) (the kernels keep their fp32 accumulators in L1, acc [MT][16]).
template <int MT>
inline void fold_group(const A8Args& a, int64_t m0, int64_t g, int h, const __m256i* isum,
                       __m256 sv, float (*acc)[16]) {
  for (int r = 0; r < MT; ++r) {
    const __m256 da = _mm256_set1_ps(a.d[(m0 + r) * (a.Kp / 32) + g]);
    float* p = acc[r] + 8 * h;
    _mm256_store_ps(p, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(sv, da),
                                       _mm256_load_ps(p)));
  }
}

// The 16 outputs of tile t for rows m0 .. m0 + MT - 1 from their accumulators.
template <int MT>
inline void store_tile(const A8Args& a, int64_t m0, int64_t t, const float (*acc)[16]) {
  for (int r = 0; r < MT; ++r) {
    const __m256 v[2] = {_mm256_load_ps(acc[r]), _mm256_load_ps(acc[r] + 8)};
    store16_avx2(a, m0 + r, t * 16, v);
  }
}

// Rows of the next pass when `left` rows remain: passes of 5-6 rows run at about 86 GMAC/s and
// passes of 2-4 at 60-66 (Zen 3, one thread, Q4_K 8960 x 1536, L3-resident), so 7 rows go as
// 5 + 2, 8 as 6 + 2 and 13 as 6 + 6 + 1 rather than split evenly (4 + 3, 4 + 4, 5 + 4 + 4):
// best of three runs, 7 rows 1.24 vs 1.45 ms, 8 rows 1.42 vs 1.63, 13 rows 2.23 vs 2.53; the
// int8 panel (49152 x 576) at 8 rows 4.29 vs 4.64 ms, the int6 one (1536 x 8960) 2.04 vs
// 2.12. 10 rows go as 5 + 5; otherwise 6 at a time.
inline int64_t avx2_pass_rows(int64_t left) {
  if (left <= kRowsAvx2) return left;
  if (left == 7 || left == 10) return 5;
  return kRowsAvx2;
}

// Tiles [t0, t1), each over all M rows in passes of avx2_pass_rows (a tile's weights stay in
// L1 / L2 across the passes): run(std::integral_constant<int, MT>{}, std::integral_constant<
// int, NT>{}, t, m0) over the NT tiles t[0 .. NT - 1]. Every output takes the same operations
// whatever the split. One row (decode) reads two weight streams side by side: the range
// split in halves, tiles t0 + i and t0 + half + i in one pass (NT = 2), an odd one last: Zen 3,
// two threads, cold weights, one row: Q4_K 17920 x 1536 0.524 -> 0.465 ms, Q6_K 1536 x 8960
// 0.412 -> 0.398, Q5_0 896 x 4864 0.121 -> 0.110 (a plain read loop: 19 GB/s with one stream a
// thread, 21 with two, 26-30 with four to eight; four tiles a pass measured slower in the
// kernels, their registers spilled). (Blocking the rows to 192 KiB of activations, each block
// over all tiles, measured no faster: the 1536 x 8960 Q6_K layer, 64 and 256 rows, one
// thread, 54-56 GMAC/s either way.)
template <class Pass>
inline void tiles_avx2(const Pass& run, int64_t M, int64_t t0, int64_t t1) {
  using One = std::integral_constant<int, 1>;
  if (M == 1) {
    const int64_t half = (t1 - t0) / 2;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t t[2] = {t0 + i, t0 + half + i};
      run(One{}, std::integral_constant<int, 2>{}, t, 0);
    }
    if ((t1 - t0) % 2) {
      const int64_t t = t1 - 1;
      run(One{}, One{}, &t, 0);
    }
    return;
  }
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m = 0; m < M;) {
      const int64_t mt = avx2_pass_rows(M - m);
      run_pass<kRowsAvx2>([&](auto k, int64_t tt, int64_t m0) { run(k, One{}, &tt, m0); },
                          t, m, mt);
      m += mt;
    }
  }
}

}  // namespace
}  // namespace localchat_cpu
