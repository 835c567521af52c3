// AVX-512 VNNI integer-dot matmul of the int6 layout (qa6.h). Per 128-column chunk: one
// 64-byte qlow load and one 32-byte qhigh load h; H = [h, h >> 2] (64 bytes) puts the top two
// bits of u beside the nibble bytes: even columns u = (qlow & 15) | ((H & 3) << 4), odd
// columns u = (qlow >> 4) | (H & 0x30). Two chained `vpdpbusd` (u8 x s8 -> 16 int32 lanes)
// against the even and odd halves of the chunk's activations (qa8.h's int4 layout), started
// from corr = -32 * (sum of the lane's 8 activations), give each lane's exact dot of q = u - 32;
// then one convert and one FMA with the lane's d * sc * dact (lanes 2 j, 2 j + 1 = sub-block
// j of the chunk). Output columns in groups of four (one transposed reduction), activation rows
// in tiles of up to four sharing each unpacked chunk. Design after llama.cpp's Q6_K x Q8_K dot
// product (the -32 offset as a subtracted activation sum); own code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa6.h"

namespace localchat_cpu {
namespace {

constexpr int64_t kPrefetch = 1024;  // bytes of qlow ahead (qhigh: half that)

#include "avx512_common.h"  // reduce4

template <int MT>
inline void tile(const Int6Args& a, int64_t n, int64_t m0, __m512* out) {
  const int64_t K = a.K, nc = K / 128;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const uint8_t* wh = a.qhigh + n * (K / 4);
  const int8_t* sc = a.scales + n * (K / 16);
  const uint16_t* sd = a.ssc + n * (K / 256);
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  // 8 sub-block scales -> 16 lanes (lanes 2 j and 2 j + 1 <- scale j)
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512 acc[MT];  // in registers (through `out` the compiler stored them every chunk)
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wh + 32 * c + kPrefetch / 2), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(wl + 64 * c);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 32 * c));
    const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(w, nib),
                                       _mm512_and_si512(_mm512_slli_epi16(H, 4), top));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w, 4), nib),
                                       _mm512_and_si512(H, top));
    const __m128i s8 = _mm_shuffle_epi8(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * c)), dup);
    const __m512 sv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                                    _mm512_set1_ps(_cvtsh_ss(sd[c / 2])));
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
inline void group(const Int6Args& a, int64_t n, int64_t cols, int64_t m0) {
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
    for (int j = 0; j < cols; ++j) int6_store(a, m0 + r, n + j, t[j]);
  }
}

}  // namespace

void int6_a8_vnni(const Int6Args& a, int64_t n0, int64_t n1) {
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
