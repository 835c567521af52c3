// AVX-512 VNNI kernel of the int4 panel layout (panel4.h). Per pass: one tile (16 outputs) x
// MT activation rows (up to 8). Per 32-column group: for each of its 4 octets, one 64-byte
// weight load, low and high nibbles, and per row two broadcast activation dwords meeting them
// in `vpdpbusd` (lanes = outputs); then per row one convert, one scale multiply and two FMAs
// (the group's scale and min terms, panel4.h's order). Low and high nibbles accumulate in
// separate registers (two dependency chains), summed exactly as int32. One tile a pass keeps
// a single sequential weight stream (four tiles a pass, four streams 8 K bytes apart, read
// 0.85-0.92x as fast from DRAM on a Zen 4 VM). Up to 8 rows share each unpacked weight vector
// in one pass: 5 rows took 12-15% less time than a pass of 4 rows and one of 1 over two tiles
// (a Zen 4 core, weights in L2 or DRAM), where `vpdpbusd`'s throughput (two per octet and
// row) is the bound.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "panel4.h"

namespace localchat_cpu {
namespace {
#include "avx512_common.h"  // to_bf16

#include "panel_vnni.h"  // kPrefetch, bcast4, store16

// The scale and min vectors of group g for the 16 outputs of tile t: two-level (KS: uint8
// sc / m times the super-block's d / -dmin, loaded once per 8 groups into dw / dm) or fp16.
template <bool KS>
inline void group_scales(const A8Args& a, int64_t t, int64_t g, __m512 dw, __m512 dm,
                         __m512* sv, __m512* mv) {
  const int64_t at = (t * a.ngroups + g) * 16;
  if constexpr (KS) {
    const uint8_t* sc = static_cast<const uint8_t*>(a.scales);
    const uint8_t* mn = static_cast<const uint8_t*>(a.mins);
    *sv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + at)))), dw);
    *mv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + at)))), dm);
  } else {
    const uint16_t* sc = static_cast<const uint16_t*>(a.scales);
    const uint16_t* mn = static_cast<const uint16_t*>(a.mins);
    *sv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + at)));
    *mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn + at)));
  }
}

template <bool KS, int MT>
inline void pass(const A8Args& a, int64_t t0, int64_t m0) {
  constexpr int NT = 1;  // tiles per pass (the loops keep the general form)
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups;
  const uint8_t* qp = static_cast<const uint8_t*>(a.qweight);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 acc[NT][MT], dw[NT], dm[NT];
  for (int t = 0; t < NT; ++t) {
    dw[t] = dm[t] = _mm512_setzero_ps();
    for (int r = 0; r < MT; ++r) acc[t][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < ng; ++g) {
    if (KS && g % 8 == 0) {
      for (int t = 0; t < NT; ++t) {
        const uint16_t* s = a.super + ((t0 + t) * (ng / 8) + g / 8) * 32;
        dw[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
        dm[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 16)));
      }
    }
    __m512i ilo[NT][MT], ihi[NT][MT];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < MT; ++r) ilo[t][r] = ihi[t][r] = _mm512_setzero_si512();
    for (int o = 0; o < 4; ++o) {
      const int64_t oct = g * 4 + o;
      __m512i lo[NT], hi[NT];
      for (int t = 0; t < NT; ++t) {
        const uint8_t* w = qp + ((t0 + t) * (K / 8) + oct) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(w);
        lo[t] = _mm512_and_si512(v, nib);
        hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = a.xq + (m0 + r) * Kp + 8 * oct;
        const __m512i xa = bcast4(x), xb = bcast4(x + 4);
        for (int t = 0; t < NT; ++t) {
          ilo[t][r] = _mm512_dpbusd_epi32(ilo[t][r], lo[t], xa);
          ihi[t][r] = _mm512_dpbusd_epi32(ihi[t][r], hi[t], xb);
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      __m512 sv, mv;
      group_scales<KS>(a, t0 + t, g, dw[t], dm[t], &sv, &mv);
      for (int r = 0; r < MT; ++r) {
        const int64_t m = m0 + r;
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(ilo[t][r], ihi[t][r]));
        acc[t][r] = _mm512_fmadd_ps(
            dot, _mm512_mul_ps(sv, _mm512_set1_ps(a.d[m * (Kp / 32) + g])), acc[t][r]);
        acc[t][r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.xs[m * ng + g]), acc[t][r]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < MT; ++r) store16(a, m0 + r, (t0 + t) * 16, acc[t][r]);
}

}  // namespace

void int4_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1) {
  if (a.super)
    pass_tiles([&](auto mt, int64_t t, int64_t m0) {
      pass<true, decltype(mt)::value>(a, t, m0);
    }, a.M, t0, t1);
  else
    pass_tiles([&](auto mt, int64_t t, int64_t m0) {
      pass<false, decltype(mt)::value>(a, t, m0);
    }, a.M, t0, t1);
}

}  // namespace localchat_cpu
