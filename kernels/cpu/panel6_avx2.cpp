// AVX2 kernel of the int6 panel layout (panel6.h), for CPUs without AVX-512 VNNI. Per 32-column
// group and half tile (8 outputs): for each of its two 16-column sub-blocks, one 32-byte
// top-bit load and two nibble loads unpacked into four u vectors (u = q + 32 in 0..63); per
// activation row four `maddubs` against the row's 4-byte broadcasts, summed two by two in
// int16 (at most 2 * 2 * 63 * 127 = 32004: no saturation), then `madd` with the sub-block
// scale in both int16 halves of each lane gives sc * sum(u * xq) in int32, and a third `madd`
// adds sc * (-32 * sum(xq)) (the sub-block's activation sum, at most 16 * 127, in the low half
// of each lane against -32 * sc): the exact integer of panel6.h, then one convert and one FMA
// per group, so the result equals the scalar and VNNI kernels' bit for bit. Tiles and rows are
// walked by panel_avx2.h's tiles_avx2. Design after llama.cpp's AVX2 Q6_K dot
// product (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "panel6.h"
#include "panel_avx2.h"

namespace localchat_cpu {
namespace {

// Rows m0 .. m0 + MT - 1 of tiles t[0 .. NT - 1], side by side (NT > 1 for one row: several
// weight streams in flight; each tile takes the same operations whatever NT).
// s16: [M, K / 16] each sub-block's activation sum in the low int16 of an int32 (high half 0).
template <int MT, int NT>
inline void pass(const A8Args& a, const int32_t* s16, const int64_t* t, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ns = K / 16;
  const uint8_t *pl[NT], *ph[NT];
  const int8_t* ps[NT];
  for (int u = 0; u < NT; ++u) {
    pl[u] = static_cast<const uint8_t*>(a.qweight) + t[u] * (K / 8) * 64;
    ph[u] = static_cast<const uint8_t*>(a.qhigh) + t[u] * ns * 64;
    ps[u] = static_cast<const int8_t*>(a.scales) + t[u] * ns * 16;
  }
  const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  alignas(32) float acc[NT][MT][16] = {};
  for (int64_t g = 0; g < K / 32; ++g) {
    for (int h = 0; h < 2; ++h) {
      __m256i isum[NT][MT];
      for (int u = 0; u < NT; ++u)
        for (int r = 0; r < MT; ++r) isum[u][r] = _mm256_setzero_si256();
      for (int64_t s = 2 * g; s < 2 * g + 2; ++s) {
        for (int u = 0; u < NT; ++u) {
          const uint8_t* w = pl[u] + 2 * s * 64 + 32 * h;
          _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2 + 64), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(ph[u] + s * 64 + kPrefetch2 / 2),
                       _MM_HINT_T0);
          const __m256i H =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ph[u] + s * 64 + 32 * h));
          const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
          const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64));
          const __m256i u0 = _mm256_or_si256(_mm256_and_si256(w0, nib),
                                             _mm256_and_si256(_mm256_slli_epi16(H, 4), top));
          const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w0, 4), nib),
                                             _mm256_and_si256(_mm256_slli_epi16(H, 2), top));
          const __m256i u2 = _mm256_or_si256(_mm256_and_si256(w1, nib),
                                             _mm256_and_si256(H, top));
          const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w1, 4), nib),
                                             _mm256_and_si256(_mm256_srli_epi16(H, 2), top));
          // the 8 outputs' sub-block scales: (sc, sc) int16 pairs, and -32 * sc in the low half
          const __m256i sc32 = _mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(ps[u] + s * 16 + 8 * h)));
          const __m256i scl = _mm256_and_si256(sc32, low16);
          const __m256i sc16 = _mm256_or_si256(scl, _mm256_slli_epi32(scl, 16));
          const __m256i scm =
              _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc32, 5));
          for (int r = 0; r < MT; ++r) {
            const int64_t m = m0 + r;
            const int8_t* x = a.xq + m * Kp + 16 * s;
            const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4_256(x)),
                                                 _mm256_maddubs_epi16(u1, bcast4_256(x + 4)));
            const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(u2, bcast4_256(x + 8)),
                                                 _mm256_maddubs_epi16(u3, bcast4_256(x + 12)));
            const __m256i v = _mm256_add_epi32(_mm256_madd_epi16(p01, sc16),
                                               _mm256_madd_epi16(p23, sc16));
            const __m256i o = _mm256_madd_epi16(_mm256_set1_epi32(s16[m * ns + s]), scm);
            isum[u][r] = _mm256_add_epi32(isum[u][r], _mm256_add_epi32(v, o));
          }
        }
      }
      for (int u = 0; u < NT; ++u)
        fold_group<MT>(a, m0, g, h, isum[u],
                       f16x8_ps(a.super + (t[u] * (K / 256) + g / 8) * 16 + 8 * h), acc[u]);
    }
  }
  for (int u = 0; u < NT; ++u) store_tile<MT>(a, m0, t[u], acc[u]);
}

}  // namespace

void int6_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t ns = a.K / 16;
  thread_local std::vector<int32_t> s16;
  s16.resize(a.M * ns);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t s = 0; s < ns; ++s) {
      int32_t sum = 0;
      for (int k = 0; k < 16; ++k) sum += a.xq[m * a.Kp + 16 * s + k];
      s16[m * ns + s] = sum & 0xFFFF;
    }
  tiles_avx2([&](auto mt, auto nt, const int64_t* t, int64_t m0) {
    pass<decltype(mt)::value, decltype(nt)::value>(a, s16.data(), t, m0);
  }, a.M, t0, t1);
}

}  // namespace localchat_cpu
