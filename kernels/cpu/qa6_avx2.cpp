// AVX2 kernels of the int6 layout (qa6.h); also the integer-dot path of AVX-512 CPUs without
// VNNI. Per half chunk bp the u bytes as in qa6_row.h (the chunk's 32 qhigh bytes, shifted
// right by 2 for the second half); offset 32. The integer-dot matmul is int6_tile below (sc
// in integers); the fp32-activation matmul and the dequantizer are plane_avx2.h's over Row2
// (scales d * sc per 16-column sub-block). Design after llama.cpp's AVX2 Q6_K x Q8_K dot
// product (own code).
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

// int6 x int8 activations with the sub-block scales applied in integers (an AVX2 order of
// its own): per half chunk (64 columns) the u bytes `maddubs` the activations (int16 lanes t:
// 4 columns of sub-block 4 bp + t / 4), `madd` with sc -> 8 int32 lanes (8 columns each);
// per 256 columns (one Q6_K super-block, 8 activation blocks) two rounds of `hadd` fold the
// four half chunks into one int32 per activation block (lanes: blocks 0 2 4 6 1 3 5 7), then
// the offset's share, 32 * sum_s sc_s * (sum of sub-block s's xq), is subtracted: one `madd`
// of the row's sub-block sums (Int6Args::put_avx2_sums, in that lane order) with the sc bytes
// shuffled to match. The result is exact (|sum| <= 32 * 32 * 127 * 128 < 2^24, so its convert
// too), then one FMA with d * dact. Design after llama.cpp's AVX2 Q6_K x Q8_K dot product,
// which also applies sc in integers and subtracts the offset once per super-block from block
// sums (own code).
template <int MT>
inline void int6_tile(const Int6Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const Row2 row(a, n);
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m128i idx[2] = {_mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                          _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
  const __m128i sub_order =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(Int6Args::kSubSumOrder));
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < K / 128; c += 2) {  // one super-block: chunks c, c + 1
    __m256i h[2][MT];
    for (int cc = 0; cc < 2; ++cc) {
      const int64_t ch = c + cc;
      _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * ch + kPrefetch), _MM_HINT_T0);
      row.prefetch(ch, kPrefetch);
      const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.sc + 8 * ch));
      __m256i dt[2][MT];
      for (int bp = 0; bp < 2; ++bp) {
        __m256i lo, hi;
        plane_u_half(row, wl, ch, bp, &lo, &hi);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, idx[bp]));
        for (int r = 0; r < MT; ++r) {
          const int8_t* xe = a.xq + (m0 + r) * K + 128 * ch + 32 * bp;
          dt[bp][r] = _mm256_madd_epi16(plane_pairs(lo, hi, xe), sc16);
        }
      }
      for (int r = 0; r < MT; ++r) h[cc][r] = _mm256_hadd_epi32(dt[0][r], dt[1][r]);
    }
    // the super-block's 16 sc in the sums' order (Int6Args::kSubSumOrder)
    const __m256i scb = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.sc + 8 * c)), sub_order));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(row.sd[c / 2]));
    for (int r = 0; r < MT; ++r) {
      const __m256i off = _mm256_slli_epi32(
          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                static_cast<const int16_t*>(a.avx2_sums) + (m0 + r) * (K / 16) +
                                8 * c)),
                            scb),
          5);
      const __m256i d8 = _mm256_sub_epi32(_mm256_hadd_epi32(h[0][r], h[1][r]), off);
      const __m256 dact = _mm256_permutevar8x32_ps(
          _mm256_loadu_ps(a.dact + (m0 + r) * (K / 32) + 4 * c), order);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d8), _mm256_mul_ps(d, dact), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) store(a, m0 + r, n, hsum(acc[r]));
}

}  // namespace

// Activation rows per pass up to 4 (M split evenly: 5 -> 3 + 2, 8 -> 4 + 4).
void int6_a8_avx2(const Int6Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < a.M;) {
      const int64_t passes = (a.M - m + 3) / 4, mt = (a.M - m + passes - 1) / passes;
      switch (mt) {
        case 1: int6_tile<1>(a, n, m); break;
        case 2: int6_tile<2>(a, n, m); break;
        case 3: int6_tile<3>(a, n, m); break;
        default: int6_tile<4>(a, n, m); break;
      }
      m += mt;
    }
}

void int6_f32_avx2(const Int6Args& a, int64_t n0, int64_t n1) { plane_f32_avx2<Row2>(a, n0, n1); }

void int6_dequant_rows_avx2(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  plane_dequant_avx2<Row2>(a, out, bf16, r0, r1);
}

}  // namespace localchat_cpu
