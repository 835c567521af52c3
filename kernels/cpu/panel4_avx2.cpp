// AVX2 kernel of the int4 panel layout (panel4.h), for CPUs without AVX-512 VNNI. A 64-byte
// octet of a tile is two 32-byte halves (outputs 0..7 and 8..15), each split into its low and
// high nibbles; per activation row, `maddubs` (u8 x s8 -> pairs of int16) meets them with the
// row's 4-byte broadcasts, and the low and high products of the group's 4 octets are summed
// in int16 (16 products of at most 15 * 127 each: at most 30480, no saturation). Per group one
// `madd` with ones turns each output's two int16 halves into the exact int32 dot, then the
// scale and min terms as panel4.h orders them, so the result equals the scalar and VNNI
// kernels' bit for bit. Tiles are the outer loop and all rows pass over a tile's weights while
// they are in L1 / L2 (panel_avx2.h's tiles_avx2).
// Design after llama.cpp's AVX2 interleaved Q4_0 / Q4_K GEMMs (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "panel4.h"
#include "panel_avx2.h"

namespace localchat_cpu {
namespace {

// The scale and min vectors (outputs 0..7, 8..15) of group g of tile t, as panel4_vnni.cpp's.
template <bool KS>
inline void group_scales(const A8Args& a, int64_t t, int64_t g, const __m256* dw,
                         const __m256* dm, __m256* sv, __m256* mv) {
  const int64_t at = (t * a.ngroups + g) * 16;
  if constexpr (KS) {
    const uint8_t* sc = static_cast<const uint8_t*>(a.scales) + at;
    const uint8_t* mn = static_cast<const uint8_t*>(a.mins) + at;
    for (int h = 0; h < 2; ++h) {
      sv[h] = _mm256_mul_ps(u8x8_ps(sc + 8 * h), dw[h]);
      mv[h] = _mm256_mul_ps(u8x8_ps(mn + 8 * h), dm[h]);
    }
  } else {
    const uint16_t* sc = static_cast<const uint16_t*>(a.scales) + at;
    const uint16_t* mn = static_cast<const uint16_t*>(a.mins) + at;
    for (int h = 0; h < 2; ++h) {
      sv[h] = f16x8_ps(sc + 8 * h);
      mv[h] = f16x8_ps(mn + 8 * h);
    }
  }
}

// Rows m0 .. m0 + MT - 1 of tiles t[0 .. NT - 1], side by side (NT > 1 for one row: several
// weight streams in flight; each tile takes the same operations whatever NT).
template <bool KS, int MT, int NT>
inline void pass(const A8Args& a, const int64_t* t, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups;
  const uint8_t* qp[NT];
  for (int u = 0; u < NT; ++u) qp[u] = static_cast<const uint8_t*>(a.qweight) + t[u] * (K / 8) * 64;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  // fp32 accumulators in L1 (touched once a group), the registers left to the int16 sums
  alignas(32) float acc[NT][MT][16] = {};
  __m256 dw[NT][2], dm[NT][2];
  for (int u = 0; u < NT; ++u) dw[u][0] = dw[u][1] = dm[u][0] = dm[u][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    if (KS && g % 8 == 0) {
      for (int u = 0; u < NT; ++u) {
        const uint16_t* s = a.super + (t[u] * (ng / 8) + g / 8) * 32;
        for (int h = 0; h < 2; ++h) {
          dw[u][h] = f16x8_ps(s + 8 * h);
          dm[u][h] = f16x8_ps(s + 16 + 8 * h);
        }
      }
    }
    __m256i s16[NT][MT][2];
    for (int u = 0; u < NT; ++u)
      for (int r = 0; r < MT; ++r) s16[u][r][0] = s16[u][r][1] = _mm256_setzero_si256();
    for (int o = 0; o < 4; ++o) {
      const int64_t oct = g * 4 + o;
      for (int u = 0; u < NT; ++u) {
        const uint8_t* w = qp[u] + oct * 64;
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch2), _MM_HINT_T0);
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * h));
          lo[h] = _mm256_and_si256(v, nib);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        }
        for (int r = 0; r < MT; ++r) {
          const int8_t* x = a.xq + (m0 + r) * Kp + 8 * oct;
          const __m256i xa = bcast4_256(x), xb = bcast4_256(x + 4);
          for (int h = 0; h < 2; ++h)
            s16[u][r][h] = _mm256_add_epi16(s16[u][r][h], _mm256_add_epi16(
                _mm256_maddubs_epi16(lo[h], xa), _mm256_maddubs_epi16(hi[h], xb)));
        }
      }
    }
    for (int u = 0; u < NT; ++u) {
      __m256 sv[2], mv[2];
      group_scales<KS>(a, t[u], g, dw[u], dm[u], sv, mv);
      for (int r = 0; r < MT; ++r) {
        const int64_t m = m0 + r;
        const __m256 da = _mm256_set1_ps(a.d[m * (Kp / 32) + g]);
        const __m256 xs = _mm256_set1_ps(a.xs[m * ng + g]);
        for (int h = 0; h < 2; ++h) {
          const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[u][r][h], ones));
          float* p = acc[u][r] + 8 * h;
          const __m256 v = _mm256_fmadd_ps(dot, _mm256_mul_ps(sv[h], da), _mm256_load_ps(p));
          _mm256_store_ps(p, _mm256_fmadd_ps(mv[h], xs, v));
        }
      }
    }
  }
  for (int u = 0; u < NT; ++u) store_tile<MT>(a, m0, t[u], acc[u]);
}

}  // namespace

void int4_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1) {
  if (a.super)
    tiles_avx2([&](auto mt, auto nt, const int64_t* t, int64_t m0) {
      pass<true, decltype(mt)::value, decltype(nt)::value>(a, t, m0);
    }, a.M, t0, t1);
  else
    tiles_avx2([&](auto mt, auto nt, const int64_t* t, int64_t m0) {
      pass<false, decltype(mt)::value, decltype(nt)::value>(a, t, m0);
    }, a.M, t0, t1);
}

}  // namespace localchat_cpu
