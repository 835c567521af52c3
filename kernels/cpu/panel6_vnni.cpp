// AVX-512 VNNI kernel of the int6 panel layout (panel6.h). Per pass: one tile (16 outputs) x
// MT activation rows (up to 8). Per 16-column sub-block: one 64-byte top-bit load and two
// 64-byte nibble loads, unpacked into four u vectors (low / high nibbles of two octets, each
// or-ed with its two top bits); per row an int32 accumulator started at the sub-block's -32 *
// sum(xq) and four `vpdpbusd` (lanes = outputs), then multiplied by the sub-block scales
// (`vpmulld`) into the group's exact sum; per 32-column group and row one convert and one FMA
// against d * d_act (panel6.h's order). One tile a pass keeps one sequential weight stream;
// every cache line of it is prefetched (prefetching every other nibble line, as a first
// version did, left a 5-row call of the 1536 x 8960 Q6_K down layer at 1.15 ms against 0.78
// from DRAM, one thread, a Zen 4 core).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "panel6.h"

namespace localchat_cpu {
namespace {
#include "avx512_common.h"  // to_bf16

#include "panel_vnni.h"  // kPrefetch, bcast4, store16

// off: [M, K / 16] each sub-block's -32 * sum(xq) (panel6_offset), per call.
template <int MT>
inline void pass(const A8Args& a, const int32_t* off, int64_t t0, int64_t m0) {
  constexpr int NT = 1;  // tiles per pass (the loops keep the general form)
  const int64_t K = a.K, Kp = a.Kp, ns = K / 16;
  const uint8_t* pl = static_cast<const uint8_t*>(a.qweight);
  const uint8_t* ph = static_cast<const uint8_t*>(a.qhigh);
  const int8_t* ps = static_cast<const int8_t*>(a.scales);
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  __m512 acc[NT][MT], dsv[NT];
  for (int t = 0; t < NT; ++t) {
    dsv[t] = _mm512_setzero_ps();
    for (int r = 0; r < MT; ++r) acc[t][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < K / 32; ++g) {
    if (g % 8 == 0)
      for (int t = 0; t < NT; ++t)
        dsv[t] = _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(a.super + ((t0 + t) * (K / 256) + g / 8) * 16)));
    __m512i isum[NT][MT];
    for (int h = 0; h < 2; ++h) {
      const int64_t s = 2 * g + h;
      __m512i u[NT][4], sc[NT];
      for (int t = 0; t < NT; ++t) {
        const int64_t ts = (t0 + t) * ns + s;
        const __m512i H = _mm512_loadu_si512(ph + ts * 64);
        const uint8_t* w = pl + ((t0 + t) * (K / 8) + 2 * s) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch + 64), _MM_HINT_T0);
        if (s % 4 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(ps + ts * 16 + kPrefetch / 8), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ph + ts * 64 + kPrefetch / 2), _MM_HINT_T0);
        const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
        u[t][0] = _mm512_or_si512(_mm512_and_si512(w0, nib),
                                  _mm512_and_si512(_mm512_slli_epi16(H, 4), top));
        u[t][1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w0, 4), nib),
                                  _mm512_and_si512(_mm512_slli_epi16(H, 2), top));
        u[t][2] = _mm512_or_si512(_mm512_and_si512(w1, nib), _mm512_and_si512(H, top));
        u[t][3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w1, 4), nib),
                                  _mm512_and_si512(_mm512_srli_epi16(H, 2), top));
        sc[t] = _mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(ps + ts * 16)));
      }
      for (int r = 0; r < MT; ++r) {
        const int64_t m = m0 + r;
        const int8_t* x = a.xq + m * Kp + 16 * s;
        const __m512i x0 = bcast4(x), x1 = bcast4(x + 4), x2 = bcast4(x + 8),
                      x3 = bcast4(x + 12);
        const __m512i o = _mm512_set1_epi32(off[m * ns + s]);
        for (int t = 0; t < NT; ++t) {
          __m512i v = _mm512_dpbusd_epi32(o, u[t][0], x0);
          v = _mm512_dpbusd_epi32(v, u[t][1], x1);
          v = _mm512_dpbusd_epi32(v, u[t][2], x2);
          v = _mm512_dpbusd_epi32(v, u[t][3], x3);
          v = _mm512_mullo_epi32(v, sc[t]);
          isum[t][r] = h == 0 ? v : _mm512_add_epi32(isum[t][r], v);
        }
      }
    }
    for (int r = 0; r < MT; ++r) {
      const __m512 da = _mm512_set1_ps(a.d[(m0 + r) * (Kp / 32) + g]);
      for (int t = 0; t < NT; ++t)
        acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t][r]), _mm512_mul_ps(dsv[t], da),
                                    acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < MT; ++r) store16(a, m0 + r, (t0 + t) * 16, acc[t][r]);
}

}  // namespace

void int6_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t ns = a.K / 16;
  thread_local std::vector<int32_t> off;
  off.resize(a.M * ns);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t s = 0; s < ns; ++s) off[m * ns + s] = panel6_offset(a, m, s);
  pass_tiles([&](auto mt, int64_t t, int64_t m0) {
    pass<decltype(mt)::value>(a, off.data(), t, m0);
  }, a.M, t0, t1);
}

}  // namespace localchat_cpu
