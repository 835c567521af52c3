// AVX-512 VNNI integer-dot matmul of the int6 layout (qa6.h), through plane_vnni.h. Per
// 128-column chunk one 32-byte qhigh load h; H = [h, h >> 2] (64 bytes) puts the top two bits
// of u beside the nibble bytes: even columns u = (qlow & 15) | ((H & 3) << 4), odd columns
// u = (qlow >> 4) | (H & 0x30); offset 32; lane scales d * sc (lanes 2 j, 2 j + 1 = sub-block
// j of the chunk). Design after llama.cpp's Q6_K x Q8_K dot product (the -32 offset as a
// subtracted activation sum); own code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa6.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // reduce4

inline void store(const Int6Args& a, int64_t m, int64_t n, float v) { int6_store(a, m, n, v); }

struct Row {
  typedef Int6Args Args;
  const uint8_t* wh;
  const int8_t* sc;
  const uint16_t* sd;
  Row(const Int6Args& a, int64_t n)
      : wh(a.qhigh + n * (a.K / 4)), sc(a.scales + n * (a.K / 16)),
        sd(a.ssc + n * (a.K / 256)) {}
  void prefetch(int64_t c) const;
  void unpack(int64_t c, __m512i w, __m512i* lo, __m512i* hi) const {
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 32 * c));
    const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
    *lo = _mm512_or_si512(_mm512_and_si512(w, nib),
                          _mm512_and_si512(_mm512_slli_epi16(H, 4), top));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w, 4), nib),
                          _mm512_and_si512(H, top));
  }
  // 8 sub-block scales -> 16 lanes (lanes 2 j and 2 j + 1 <- scale j)
  __m512 scales(int64_t c) const {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i s8 = _mm_shuffle_epi8(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * c)), dup);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                         _mm512_set1_ps(_cvtsh_ss(sd[c / 2])));
  }
};

#include "plane_vnni.h"

inline void Row::prefetch(int64_t c) const {
  _mm_prefetch(reinterpret_cast<const char*>(wh + 32 * c + kPrefetch / 2), _MM_HINT_T0);
}

}  // namespace

void int6_a8_vnni(const Int6Args& a, int64_t n0, int64_t n1) { plane_a8_vnni<Row>(a, n0, n1); }

}  // namespace localchat_cpu
