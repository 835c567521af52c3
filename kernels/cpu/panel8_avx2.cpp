// AVX2 kernel of the int8 panel layout (panel8.h), for CPUs without AVX-512 VNNI. Per 32-column
// group and half tile (8 outputs): each of the group's 8 quads is one 32-byte load, its bytes'
// magnitudes taken once for all rows; per activation row the sign trick (`maddubs` of |q|
// against the row's 4-byte broadcast with q's signs moved onto it: at most 2 * 128 * 127 per
// int16 pair, no saturation) and one `madd` with ones give each output's 4-column dot in
// int32, summed over the quads into the group's exact dot of q and xq (panel8.h's integer, which
// the VNNI kernel forms as (q + 128) * xq less 128 * sum(xq)); then one convert and one FMA per
// group, so the result equals the scalar and VNNI kernels' bit for bit. Tiles and rows are
// walked by panel_avx2.h's tiles_avx2. Design after llama.cpp's AVX2 Q8_0 x Q8_0 dot
// product (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "panel8.h"
#include "panel_avx2.h"

namespace localchat_cpu {
namespace {

// Rows m0 .. m0 + MT - 1 of tiles t[0 .. NT - 1], side by side (NT > 1 for one row: several
// weight streams in flight; each tile takes the same operations whatever NT).
template <int MT, int NT>
inline void pass(const A8Args& a, const int64_t* t, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = K / 32;
  const int8_t* pq[NT];
  const uint16_t* ps[NT];
  for (int u = 0; u < NT; ++u) {
    pq[u] = static_cast<const int8_t*>(a.qweight) + t[u] * (K / 4) * 64;
    ps[u] = static_cast<const uint16_t*>(a.scales) + t[u] * ng * 16;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[NT][MT][16] = {};
  for (int64_t g = 0; g < ng; ++g) {
    for (int h = 0; h < 2; ++h) {
      __m256i dot[NT][MT];
      for (int u = 0; u < NT; ++u)
        for (int r = 0; r < MT; ++r) dot[u][r] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        for (int u = 0; u < NT; ++u) {
          const int8_t* w = pq[u] + g * 512 + 64 * c + 32 * h;
          _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2), _MM_HINT_T0);
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
          const __m256i aq = _mm256_sign_epi8(q, q);  // |q| (-128 -> 0x80, read unsigned)
          for (int r = 0; r < MT; ++r) {
            const __m256i xs =
                _mm256_sign_epi8(bcast4_256(a.xq + (m0 + r) * Kp + 32 * g + 4 * c), q);
            dot[u][r] = _mm256_add_epi32(dot[u][r],
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xs), ones));
          }
        }
      }
      for (int u = 0; u < NT; ++u)
        fold_group<MT>(a, m0, g, h, dot[u], f16x8_ps(ps[u] + g * 16 + 8 * h), acc[u]);
    }
  }
  for (int u = 0; u < NT; ++u) store_tile<MT>(a, m0, t[u], acc[u]);
}

}  // namespace

void int8_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1) {
  tiles_avx2([&](auto mt, auto nt, const int64_t* t, int64_t m0) {
    pass<decltype(mt)::value, decltype(nt)::value>(a, t, m0);
  }, a.M, t0, t1);
}

}  // namespace localchat_cpu
