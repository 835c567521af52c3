// AVX-512 VNNI kernel of the int8 panel layout (panel8.h). Per pass: one tile (16 outputs) x
// MT activation rows (up to 8). Per 32-column group: eight 64-byte weight loads (xor 0x80:
// u = q + 128), one fp16 scale vector, and per row an int32 sum started at the group's -128 *
// sum(xq), eight `vpdpbusd` against broadcast activation dwords (lanes = outputs), one convert
// and one FMA (panel8.h's order). One tile a pass keeps a single sequential weight stream,
// every cache line of it prefetched (as panel4_vnni.cpp / panel6_vnni.cpp).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "panel8.h"

namespace localchat_cpu {
namespace {
#include "avx512_common.h"  // to_bf16

#include "panel_vnni.h"  // kPrefetch, bcast4, store16

// off: [M, K / 32] each group's -128 * sum(xq) (panel8_offset), per call.
template <int MT>
inline void pass(const A8Args& a, const int32_t* off, int64_t t, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = K / 32;
  const int8_t* pq = static_cast<const int8_t*>(a.qweight) + t * (K / 4) * 64;
  const uint16_t* ps = static_cast<const uint16_t*>(a.scales) + t * ng * 16;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const int8_t* w = pq + g * 512;
    __m512i u[8];
    for (int c = 0; c < 8; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(w + 64 * c + kPrefetch), _MM_HINT_T0);
      u[c] = _mm512_xor_si512(_mm512_loadu_si512(w + 64 * c), flip);
    }
    if (g % 2 == 0)
      _mm_prefetch(reinterpret_cast<const char*>(ps + g * 16 + kPrefetch / 16), _MM_HINT_T0);
    const __m512 sv = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ps + g * 16)));
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const int8_t* x = a.xq + m * Kp + 32 * g;
      __m512i v = _mm512_set1_epi32(off[m * ng + g]);
      for (int c = 0; c < 8; ++c) v = _mm512_dpbusd_epi32(v, u[c], bcast4(x + 4 * c));
      const __m512 da = _mm512_set1_ps(a.d[m * (Kp / 32) + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(sv, da), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) store16(a, m0 + r, t * 16, acc[r]);
}

}  // namespace

void int8_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t ng = a.K / 32;
  thread_local std::vector<int32_t> off;
  off.resize(a.M * ng);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t g = 0; g < ng; ++g) off[m * ng + g] = panel8_offset(a, m, g);
  pass_tiles([&](auto mt, int64_t t, int64_t m0) {
    pass<decltype(mt)::value>(a, off.data(), t, m0);
  }, a.M, t0, t1);
}

}  // namespace localchat_cpu
