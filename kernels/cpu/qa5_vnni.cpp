// AVX-512 VNNI integer-dot matmul of the int5 layout (qa5.h). Per 128-column chunk: one
// 64-byte qlow load and two 64-bit masks (the chunk's qhigh bytes) as kmasks: even columns
// u = (qlow & 15) + 16 where the even mask is set, odd columns u = (qlow >> 4) + 16 where the
// odd mask is set (one masked byte add each). Two chained `vpdpbusd` (u8 x s8 -> 16 int32
// lanes) against the even and odd halves of the chunk's activations (qa8.h's int4 layout),
// started from corr = -16 * (sum of the lane's 8 activations), give each lane's exact dot of
// q = u - 16; then one convert and one FMA with the lane's d * dact (lanes 4 b .. 4 b + 3 =
// block b of the chunk). Output columns in groups of four (one transposed reduction),
// activation rows in tiles of up to four sharing each unpacked chunk. Design after llama.cpp's
// Q5_0 x Q8_0 dot product (high bits as a byte mask; the offset as a subtracted activation
// sum here); own code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa5.h"

namespace localchat_cpu {
namespace {

constexpr int64_t kPrefetch = 1024;  // bytes of qlow ahead (qhigh: a quarter of that)

#include "avx512_common.h"  // reduce4

template <int MT>
inline void tile(const Int5Args& a, int64_t n, int64_t m0, __m512* out) {
  const int64_t K = a.K, nc = K / 128;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const uint8_t* wh = a.qhigh + n * (K / 8);
  const uint16_t* sd = a.sc + n * (K / 32);
  const __m512i nib = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  // lane L <- block L / 4 of the chunk
  const __m512i rep4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * c + kPrefetch / 4), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(wl + 64 * c);
    uint64_t me, mo;
    std::memcpy(&me, wh + 16 * c, 8);
    std::memcpy(&mo, wh + 16 * c + 8, 8);
    const __m512i ev = _mm512_and_si512(w, nib);
    const __m512i lo = _mm512_mask_add_epi8(ev, _cvtu64_mask64(me), ev, sixteen);
    const __m512i od = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
    const __m512i hi = _mm512_mask_add_epi8(od, _cvtu64_mask64(mo), od, sixteen);
    const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sd + 4 * c)));
    const __m512 sv = _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(d4));
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const int8_t* xq = a.xq + m * K + 128 * c;
      __m512i dot = _mm512_loadu_si512(a.corr + m * (K / 8) + 16 * c);
      dot = _mm512_dpbusd_epi32(dot, lo, _mm512_loadu_si512(xq));
      dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
      const __m512 dv = _mm512_loadu_ps(a.dv + (m * (K / 32) + 4 * c) * 4);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}

template <int MT>
inline void group(const Int5Args& a, int64_t n, int64_t cols, int64_t m0) {
  __m512 acc[4][MT];
  for (int j = 0; j < 4; ++j) {
    if (j < cols) {
      tile<MT>(a, n + j, m0, acc[j]);
    } else {
      for (int r = 0; r < MT; ++r) acc[j][r] = _mm512_setzero_ps();
    }
  }
  for (int r = 0; r < MT; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]));
    for (int j = 0; j < cols; ++j) int5_store(a, m0 + r, n + j, t[j]);
  }
}

}  // namespace

void int5_a8_vnni(const Int5Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t cols = std::min<int64_t>(4, n1 - n);
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) group<4>(a, n, cols, m);
    switch (a.M - m) {
      case 3: group<3>(a, n, cols, m); break;
      case 2: group<2>(a, n, cols, m); break;
      case 1: group<1>(a, n, cols, m); break;
      default: break;
    }
  }
}

}  // namespace localchat_cpu
