// AVX-512 (F/BW/VL/DQ) kernels of the int5 layout (qa5.h) that need no VNNI: the row
// dequantization and the exact fp32-activation matmul. A 128-column chunk decodes into eight
// 16-column fp32 vectors in column order: u bytes as in qa5_vnni.cpp (a masked byte add of 16
// per qhigh bit), the even / odd columns interleaved back by unpacklo / unpackhi (per 128-bit
// lane l: columns 32 l .. 32 l + 15 and 32 l + 16 .. 32 l + 31, block l of the chunk), minus
// 16, widened, times the block's d (exact). bf16 out rounds to nearest even by integer
// arithmetic (avx512_common.h's to_bf16).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa5.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // to_bf16

// Chunk c of row n -> w[j] = columns 128 c + 16 j .. 128 c + 16 j + 15 (fp32, exact values).
inline void decode_chunk(const Int5Args& a, int64_t n, int64_t c, __m512* w) {
  const int64_t K = a.K;
  const __m512i nib = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(16);
  const __m512i q = _mm512_loadu_si512(a.qlow + n * (K / 2) + 64 * c);
  const uint8_t* h = a.qhigh + n * (K / 8) + 16 * c;
  uint64_t me, mo;
  std::memcpy(&me, h, 8);
  std::memcpy(&mo, h + 8, 8);
  const __m512i ev = _mm512_and_si512(q, nib);
  const __m512i od = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
  const __m512i lo = _mm512_mask_add_epi8(ev, _cvtu64_mask64(me), ev, off);
  const __m512i hi = _mm512_mask_add_epi8(od, _cvtu64_mask64(mo), od, off);
  const __m512i e0 = _mm512_sub_epi8(_mm512_unpacklo_epi8(lo, hi), off);
  const __m512i e1 = _mm512_sub_epi8(_mm512_unpackhi_epi8(lo, hi), off);
  const uint16_t* sd = a.sc + n * (K / 32) + 4 * c;
#define LC_LANE(L)                                                                              \
  {                                                                                             \
    const __m512 s = _mm512_set1_ps(_cvtsh_ss(sd[L]));                                          \
    w[2 * L] = _mm512_mul_ps(                                                                   \
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e0, L))), s);         \
    w[2 * L + 1] = _mm512_mul_ps(                                                               \
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e1, L))), s);         \
  }
  LC_LANE(0) LC_LANE(1) LC_LANE(2) LC_LANE(3)
#undef LC_LANE
}

template <bool BF16>
void dequant_rows(const Int5Args& a, void* out, int64_t r0, int64_t r1) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n) {
    for (int64_t c = 0; c < K / 128; ++c) {
      __m512 w[8];
      decode_chunk(a, n, c, w);
      for (int j = 0; j < 8; ++j) {
        const int64_t at = n * K + 128 * c + 16 * j;
        if constexpr (BF16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at),
                              to_bf16(w[j]));
        else
          _mm512_storeu_ps(static_cast<float*>(out) + at, w[j]);
      }
    }
  }
}

constexpr int64_t kPrefetch = 1024;  // bytes of qlow ahead (qhigh: a quarter of that)

// One output column x MT activation rows, chunk by chunk: four accumulators per row (the
// chunk's 16-column vectors i go to accumulator i % 4), summed as (a0 + a1) + (a2 + a3) and
// reduced once at the end: the order depends only on k.
template <int MT>
inline void f32_tile(const Int5Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const uint8_t* wh = a.qhigh + n * (K / 8);
  __m512 acc[MT][4];
  for (int r = 0; r < MT; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * c + kPrefetch / 4), _MM_HINT_T0);
    __m512 w[8];
    decode_chunk(a, n, c, w);
    for (int r = 0; r < MT; ++r) {
      const float* x = a.x + (m0 + r) * K + 128 * c;
      for (int i = 0; i < 8; ++i)
        acc[r][i & 3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * i), w[i], acc[r][i & 3]);
    }
  }
  for (int r = 0; r < MT; ++r)
    int5_store(a, m0 + r, n, _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]))));
}

}  // namespace

void int5_dequant_rows_avx512(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  if (bf16) dequant_rows<true>(a, out, r0, r1);
  else dequant_rows<false>(a, out, r0, r1);
}

void int5_f32_avx512(const Int5Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    // tiles of four rows; five rows (the speculative verify shape) in one tile
    for (; a.M - m >= 4 && a.M - m != 5; m += 4) f32_tile<4>(a, n, m);
    switch (a.M - m) {
      case 5: f32_tile<5>(a, n, m); break;
      case 3: f32_tile<3>(a, n, m); break;
      case 2: f32_tile<2>(a, n, m); break;
      case 1: f32_tile<1>(a, n, m); break;
      default: break;
    }
  }
}

}  // namespace localchat_cpu
