// AVX2 kernels of the int6 layout (qa6.h): plane_avx2.h over Row2 below; also the
// integer-dot path of AVX-512 CPUs without VNNI. Per half chunk bp the u bytes as in
// qa6_row.h (the chunk's 32 qhigh bytes, shifted right by 2 for the second half); offset 32;
// scales d * sc per 16-column sub-block. Design after llama.cpp's AVX2 Q6_K x Q8_K dot product
// (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "qa6.h"

namespace localchat_cpu {
namespace {

inline void store(const Int6Args& a, int64_t m, int64_t n, float v) { int6_store(a, m, n, v); }

struct Row2 {
  typedef Int6Args Args;
  static constexpr int kOffset = 32;
  const uint8_t* wh;
  const int8_t* sc;
  const uint16_t* sd;
  Row2(const Int6Args& a, int64_t n)
      : wh(a.qhigh + n * (a.K / 4)), sc(a.scales + n * (a.K / 16)),
        sd(a.ssc + n * (a.K / 256)) {}
  void prefetch(int64_t c, int64_t ahead) const {
    _mm_prefetch(reinterpret_cast<const char*>(wh + 32 * c + ahead / 2), _MM_HINT_T0);
  }
  // q: qlow bytes 32 bp .. 32 bp + 31 of chunk c
  void u_half(int64_t c, int bp, __m256i q, __m256i* lo, __m256i* hi) const {
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 32 * c));
    if (bp) H = _mm256_srli_epi16(H, 2);
    *lo = _mm256_or_si256(_mm256_and_si256(q, nib),
                          _mm256_and_si256(_mm256_slli_epi16(H, 4), top));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), nib),
                          _mm256_and_si256(H, top));
  }
  // half bp: lanes i <- sub-block 8 c + 4 bp + i / 2
  void lane_scales(int64_t c, __m256* sv) const {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i s8 = _mm_shuffle_epi8(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * c)), dup);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(sd[c / 2]));
    sv[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)), d);
    sv[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8))), d);
  }
  // unit u (16 columns) of half bp is sub-block 8 c + 4 bp + u: d * sc
  void unit_scales(int64_t c, int bp, float* s) const {
    const float d = _cvtsh_ss(sd[c / 2]);
    for (int u = 0; u < 4; ++u) s[u] = d * static_cast<float>(sc[8 * c + 4 * bp + u]);
  }
};

#include "plane_avx2.h"

}  // namespace

void int6_a8_avx2(const Int6Args& a, int64_t n0, int64_t n1) { plane_a8_avx2<Row2>(a, n0, n1); }

void int6_f32_avx2(const Int6Args& a, int64_t n0, int64_t n1) { plane_f32_avx2<Row2>(a, n0, n1); }

void int6_dequant_rows_avx2(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  plane_dequant_avx2<Row2>(a, out, bf16, r0, r1);
}

}  // namespace localchat_cpu
