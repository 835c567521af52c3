// AVX2 kernels of the int5 layout (qa5.h): plane_avx2.h over Row2 below; also the
// integer-dot path of AVX-512 CPUs without VNNI. Per half chunk bp the u bytes: the 32 bits of
// each qhigh mask expanded to 32 bytes (broadcast, byte shuffle, AND with each byte's bit,
// compare), AND 16, OR the nibbles; offset 16; scales Q5_0's d per 32-column block. Design
// after llama.cpp's AVX2 Q5_0 x Q8_0 dot product (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "qa5.h"

namespace localchat_cpu {
namespace {

inline void store(const Int5Args& a, int64_t m, int64_t n, float v) { int5_store(a, m, n, v); }

// 32 bits -> 32 bytes: byte j = 16 when bit j is set, else 0.
inline __m256i bits_to_16(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(x)),
      _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

struct Row2 {
  typedef Int5Args Args;
  static constexpr int kOffset = 16;
  const uint8_t* wh;
  const uint16_t* sd;
  Row2(const Int5Args& a, int64_t n) : wh(a.qhigh + n * (a.K / 8)), sd(a.sc + n * (a.K / 32)) {}
  void prefetch(int64_t c, int64_t ahead) const {
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * c + ahead / 4), _MM_HINT_T0);
  }
  // q: qlow bytes 32 bp .. 32 bp + 31 of chunk c
  void u_half(int64_t c, int bp, __m256i q, __m256i* lo, __m256i* hi) const {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const uint8_t* h = wh + 16 * c + 4 * bp;
    *lo = _mm256_or_si256(_mm256_and_si256(q, nib), bits_to_16(h));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nib), bits_to_16(h + 8));
  }
  // half bp: lanes 0-3 <- block 4 c + 2 bp, lanes 4-7 <- the next
  void lane_scales(int64_t c, __m256* sv) const {
    for (int bp = 0; bp < 2; ++bp)
      sv[bp] = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(sd[4 * c + 2 * bp + 1])),
                               _mm_set1_ps(_cvtsh_ss(sd[4 * c + 2 * bp])));
  }
  // blocks 4 c .. 4 c + 7 (the last 4 zero unless `two`: chunk c + 1 exists)
  __m256 block_scales8(int64_t c, bool two) const {
    const __m128i h = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(sd + 4 * c))
                          : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sd + 4 * c));
    return _mm256_cvtph_ps(h);
  }
  // unit u (16 columns) of half bp lies in block 4 c + 2 bp + u / 2
  void unit_scales(int64_t c, int bp, float* s) const {
    for (int u = 0; u < 4; ++u) s[u] = _cvtsh_ss(sd[4 * c + 2 * bp + u / 2]);
  }
};

#include "plane_avx2.h"

}  // namespace

void int5_a8_avx2(const Int5Args& a, int64_t n0, int64_t n1) { plane_a8_avx2<Row2>(a, n0, n1); }

void int5_f32_avx2(const Int5Args& a, int64_t n0, int64_t n1) { plane_f32_avx2<Row2>(a, n0, n1); }

void int5_dequant_rows_avx2(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  plane_dequant_avx2<Row2>(a, out, bf16, r0, r1);
}

}  // namespace localchat_cpu
