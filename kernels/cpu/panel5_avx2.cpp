// AVX2 kernel of the int5 panel layout (panel5.h). Per 32-column group and half tile (8
// outputs): one 32-byte top-bit load and, per 16 columns, two nibble loads unpacked into four
// u vectors (u = q + 16 in 0..31: a nibble mask, the top bit shifted to bit 4, an OR); per
// activation row four `maddubs` against the row's 4-byte broadcasts summed in int16 (at most
// 4 * 2 * 31 * 127 = 31496: no saturation), one `madd` with ones into the int32 sum, which
// starts at the group's -16 * sum(xq). Then one convert and one FMA per group: the exact
// integer and fp32 operations of panel5.h, so the result equals the portable kernel's bit for
// bit. Tiles and rows are walked by panel_avx2.h's tiles_avx2. Design after llama.cpp's AVX2
// Q5_0 dot (the top bits ORed into the nibbles; own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "panel5.h"
#include "panel_avx2.h"

namespace localchat_cpu {
namespace {

// u vector V of a group (bit V of each top-bit byte moved to bit 4), the nibbles given.
template <int V>
inline __m256i with_top(__m256i nibbles, __m256i H, __m256i bit4) {
  const __m256i t = V <= 4 ? _mm256_slli_epi16(H, 4 - V) : _mm256_srli_epi16(H, V - 4);
  return _mm256_or_si256(nibbles, _mm256_and_si256(t, bit4));
}

// Rows m0 .. m0 + MT - 1 of tiles t[0 .. NT - 1], side by side (NT > 1 for one row: several
// weight streams in flight; each tile takes the same operations whatever NT).
// off: [M, K / 32] each group's -16 * sum(xq), per call.
template <int MT, int NT>
inline void pass(const A8Args& a, const int32_t* off, const int64_t* t, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = K / 32;
  const uint8_t *pl[NT], *ph[NT];
  const uint16_t* ps[NT];
  for (int u = 0; u < NT; ++u) {
    pl[u] = static_cast<const uint8_t*>(a.qweight) + t[u] * (K / 8) * 64;
    ph[u] = static_cast<const uint8_t*>(a.qhigh) + t[u] * ng * 64;
    ps[u] = static_cast<const uint16_t*>(a.scales) + t[u] * ng * 16;
  }
  const __m256i nib = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[NT][MT][16] = {};
  for (int64_t g = 0; g < ng; ++g) {
    for (int u = 0; u < NT; ++u) {
      const uint8_t* w = pl[u] + 4 * g * 64;
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2 + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2 + 128), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2 + 192), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(ph[u] + g * 64 + kPrefetch2 / 4), _MM_HINT_T0);
    }
    for (int h = 0; h < 2; ++h) {
      for (int u = 0; u < NT; ++u) {
        const uint8_t* w = pl[u] + 4 * g * 64;
        const __m256i H =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ph[u] + g * 64 + 32 * h));
        __m256i isum[MT];
        for (int r = 0; r < MT; ++r) isum[r] = _mm256_set1_epi32(off[(m0 + r) * ng + g]);
        for (int q = 0; q < 2; ++q) {  // columns 32 g + 16 q .. + 15: octets 4 g + 2 q, + 1
          const __m256i w0 = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(w + (2 * q) * 64 + 32 * h));
          const __m256i w1 = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(w + (2 * q + 1) * 64 + 32 * h));
          const __m256i n0 = _mm256_and_si256(w0, nib);
          const __m256i n1 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), nib);
          const __m256i n2 = _mm256_and_si256(w1, nib);
          const __m256i n3 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), nib);
          __m256i u0, u1, u2, u3;
          if (q == 0) {
            u0 = with_top<0>(n0, H, bit4);
            u1 = with_top<1>(n1, H, bit4);
            u2 = with_top<2>(n2, H, bit4);
            u3 = with_top<3>(n3, H, bit4);
          } else {
            u0 = with_top<4>(n0, H, bit4);
            u1 = with_top<5>(n1, H, bit4);
            u2 = with_top<6>(n2, H, bit4);
            u3 = with_top<7>(n3, H, bit4);
          }
          for (int r = 0; r < MT; ++r) {
            const int8_t* x = a.xq + (m0 + r) * Kp + 32 * g + 16 * q;
            const __m256i p = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4_256(x)),
                                 _mm256_maddubs_epi16(u1, bcast4_256(x + 4))),
                _mm256_add_epi16(_mm256_maddubs_epi16(u2, bcast4_256(x + 8)),
                                 _mm256_maddubs_epi16(u3, bcast4_256(x + 12))));
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
          }
        }
        fold_group<MT>(a, m0, g, h, isum, f16x8_ps(ps[u] + g * 16 + 8 * h), acc[u]);
      }
    }
  }
  for (int u = 0; u < NT; ++u) store_tile<MT>(a, m0, t[u], acc[u]);
}

}  // namespace

void int5_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t ng = a.K / 32;
  thread_local std::vector<int32_t> off;
  off.resize(a.M * ng);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t g = 0; g < ng; ++g) {
      int32_t sum = 0;
      for (int k = 0; k < 32; ++k) sum += a.xq[m * a.Kp + 32 * g + k];
      off[m * ng + g] = -16 * sum;
    }
  tiles_avx2([&](auto mt, auto nt, const int64_t* t, int64_t m0) {
    pass<decltype(mt)::value, decltype(nt)::value>(a, off.data(), t, m0);
  }, a.M, t0, t1);
}

}  // namespace localchat_cpu
