// AVX-512 VNNI integer-dot matmuls (qa8.h) and the AVX-512 activation quantizer.
// int4: per 128-column chunk one 64-byte weight load; its low nibbles (the even columns of
// four 32-column blocks) and high nibbles (the odd columns) meet the two halves of the
// chunk's activations (qa8.h's layout) in two chained `vpdpbusd` (u8 x s8 -> 16 int32 lanes,
// lanes 4b..4b+3 = block b), then one convert and one FMA with the per-lane combined scale.
// int8: per 64-column chunk one `vpdpbusd` (lanes 0-7 = the chunk's first block, 8-15 the
// second) on weights XOR 0x80 (= q + 128, unsigned) starting from -128 * sum(xq) per lane
// (ncorr), so every dot is exact. The weights' min term is a second vector accumulated over
// groups. Tails (K % 128 != 0) are masked loads. Design after llama.cpp's AVX-512 VNNI
// q4 / q8 dot products (own code).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa8.h"
#include "qa8_layout.h"

namespace localchat_cpu {
namespace {
#include "a8_store.h"

// Bytes ahead of the weight stream prefetched (the hardware prefetcher alone left the loads
// waiting on memory: the hottest instruction in `perf annotate`).
constexpr int64_t kPrefetch = 1024;

inline float ld1(const float* p) { return *p; }
inline float ld1(const uint16_t* p) { return _cvtsh_ss(*p); }

template <class ST>
inline __m128 ld4(const ST* p) {
  if constexpr (sizeof(ST) == 2)
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  else
    return _mm_loadu_ps(reinterpret_cast<const float*>(p));
}

template <class ST>
inline __m128 ld2(const ST* p) {
  if constexpr (sizeof(ST) == 2) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
  } else {
    return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
  }
}

// 16 lanes of sum_g mins[g] * xs[g] (reduced with the main accumulator).
template <class ST>
inline __m512 min_vec(const ST* mn, const float* xs, int64_t ng) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; g += 16) {
    const __mmask16 k = ng - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (ng - g)) - 1);
    __m512 m;
    if constexpr (sizeof(ST) == 2)
      m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, mn + g));
    else
      m = _mm512_maskz_loadu_ps(k, reinterpret_cast<const float*>(mn + g));
    acc = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(k, xs + g), acc);
  }
  return acc;
}

// min_vec for two-level scales (ST uint8_t, qa8.h's `super`): the same lanes hold the same
// values, -dmin (fp16, exact) times the uint8 m in one exact product.
inline __m512 min_vec_k(const uint8_t* mn, const uint16_t* sup, const float* xs, int64_t ng) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; g += 16) {  // ng % 8 == 0: 16 or 8 groups (1 or 2 super-blocks)
    const bool two = ng - g >= 16;
    const __mmask16 k = two ? 0xFFFF : 0x00FF;
    const __m512 mi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, mn + g)));
    const __m512 dm = _mm512_insertf32x8(
        _mm512_set1_ps(_cvtsh_ss(sup[(g / 8) * 2 + 1])),
        _mm256_set1_ps(two ? _cvtsh_ss(sup[(g / 8) * 2 + 3]) : 0.0f), 1);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(mi, dm), _mm512_maskz_loadu_ps(k, xs + g), acc);
  }
  return acc;
}

// acc[r] += the weights' min term of row n for activation row m0 + r.
template <int MT, class ST>
inline void add_mins(const A8Args& a, int64_t n, int64_t m0, __m512* acc) {
  if (!a.mins) return;
  const int64_t ng = a.ngroups;
  for (int r = 0; r < MT; ++r) {
    __m512 mv;
    if constexpr (sizeof(ST) == 1)
      mv = min_vec_k(static_cast<const uint8_t*>(a.mins) + n * ng, a.super + n * (ng / 8) * 2,
                     a.xs + (m0 + r) * ng, ng);
    else
      mv = min_vec(static_cast<const ST*>(a.mins) + n * ng, a.xs + (m0 + r) * ng, ng);
    acc[r] = _mm512_add_ps(acc[r], mv);
  }
}

#include "avx512_common.h"  // reduce4

// int4, 128-column chunks: lanes 4b..4b+3 <- scale of block 4c + b's group.
template <int MT, class ST>
inline void tile4(const A8Args& a, int64_t n, int64_t m0, __m512* acc) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nc = (K + 127) / 128;
  const uint8_t* wr = static_cast<const uint8_t*>(a.qweight) + n * (K / 2);
  const ST* s = static_cast<const ST*>(a.scales) + n * ng;
  const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const bool g32 = a.group_size == 32;
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t rem = K - 128 * c;
    __m512i w;
    __m128 s4;
    if (rem >= 128) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + 64 * c + kPrefetch), _MM_HINT_T0);
      w = _mm512_loadu_si512(wr + 64 * c);
      s4 = g32 ? ld4(s + 4 * c) : _mm_setr_ps(ld1(s + a.blk2grp[4 * c]),
                                              ld1(s + a.blk2grp[4 * c + 1]),
                                              ld1(s + a.blk2grp[4 * c + 2]),
                                              ld1(s + a.blk2grp[4 * c + 3]));
    } else {  // 1-3 blocks left: the padded lanes meet zero weights and zero activations
      w = _mm512_maskz_loadu_epi8((1ull << (rem / 2)) - 1, wr + 64 * c);
      s4 = _mm_setr_ps(ld1(s + a.blk2grp[4 * c]), ld1(s + a.blk2grp[4 * c + 1]),
                       ld1(s + a.blk2grp[4 * c + 2]), ld1(s + a.blk2grp[4 * c + 3]));
    }
    const __m512 sv = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(s4));
    const __m512i lo = _mm512_and_si512(w, nib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const int8_t* xq = a.xq + m * Kp + 128 * c;
      __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
      dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
      const __m512 dv = _mm512_loadu_ps(a.dv + (m * (Kp / 32) + 4 * c) * 4);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
    }
  }
  add_mins<MT, ST>(a, n, m0, acc);
}

// int4 with two-level scales (ST uint8_t, qa8.h's `super`; K % 256 == 0): per 256-column
// super-block its 8 uint8 sub-block scales times d, formed once (8 exact fp32 products), then
// its two 128-column chunks as in tile4 (lanes 4b..4b+3 <- sub-block 4h + b of half h).
template <int MT>
inline void tile4k(const A8Args& a, int64_t n, int64_t m0, __m512* acc) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nsb = K / 256;
  const uint8_t* wr = static_cast<const uint8_t*>(a.qweight) + n * (K / 2);
  const uint8_t* s = static_cast<const uint8_t*>(a.scales) + n * ng;
  const uint16_t* sup = a.super + n * (ng / 8) * 2;
  const __m512i idx[2] = {
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4)};
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const __m256 s8 = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8 * sb)))),
        _mm256_set1_ps(_cvtsh_ss(sup[2 * sb])));
    for (int h = 0; h < 2; ++h) {
      const int64_t c = 2 * sb + h;
      _mm_prefetch(reinterpret_cast<const char*>(wr + 64 * c + kPrefetch), _MM_HINT_T0);
      const __m512i w = _mm512_loadu_si512(wr + 64 * c);
      const __m512 sv = _mm512_permutexvar_ps(idx[h], _mm512_castps256_ps512(s8));
      const __m512i lo = _mm512_and_si512(w, nib);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
      for (int r = 0; r < MT; ++r) {
        const int64_t m = m0 + r;
        const int8_t* xq = a.xq + m * Kp + 128 * c;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
        const __m512 dv = _mm512_loadu_ps(a.dv + (m * (Kp / 32) + 4 * c) * 4);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
      }
    }
  }
  add_mins<MT, uint8_t>(a, n, m0, acc);
}

// int8, 64-column chunks (or a trailing 32): weights XOR 0x80, dots from ncorr.
template <int MT, class ST>
inline void tile8(const A8Args& a, int64_t n, int64_t m0, __m512* acc) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nc = (K + 63) / 64;
  const int8_t* wr = static_cast<const int8_t*>(a.qweight) + n * K;
  const ST* s = static_cast<const ST*>(a.scales) + n * ng;
  const __m512i idx2 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    const bool half_chunk = 64 * c + 32 == K;
    _mm_prefetch(reinterpret_cast<const char*>(wr + 64 * c + kPrefetch), _MM_HINT_T0);
    const __m512i w = _mm512_xor_si512(
        half_chunk ? _mm512_zextsi256_si512(_mm256_loadu_si256(
                         reinterpret_cast<const __m256i*>(wr + 64 * c)))
                   : _mm512_loadu_si512(wr + 64 * c),
        flip);
    __m512 sv;
    if (a.group_size == 16) {  // lanes 4j..4j+3 <- group 4c + j
      sv = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(
          half_chunk ? _mm_setr_ps(ld1(s + 4 * c), ld1(s + 4 * c + 1), 0.0f, 0.0f)
                     : ld4(s + 4 * c)));
    } else if (a.group_size == 32 && !half_chunk) {  // GGUF groups: two consecutive scales
      sv = _mm512_permutexvar_ps(idx2, _mm512_castps128_ps512(ld2(s + 2 * c)));
    } else {
      sv = _mm512_insertf32x8(_mm512_set1_ps(ld1(s + a.blk2grp[2 * c])),
                              _mm256_set1_ps(ld1(s + a.blk2grp[2 * c + 1])), 1);
    }
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const __m512i init = _mm512_loadu_si512(a.ncorr + m * (Kp / 4) + c * 16);
      const __m512i dot = _mm512_dpbusd_epi32(init, w,
                                              _mm512_loadu_si512(a.xq + m * Kp + c * 64));
      const __m512 dv = _mm512_loadu_ps(a.dv + (m * (Kp / 64) + c) * 16);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
    }
  }
  add_mins<MT, ST>(a, n, m0, acc);
}

// Output columns in groups of four (one reduce4 per activation row), activation rows in
// tiles of up to four sharing each unpacked weight chunk.
template <bool INT4, int MT, class ST>
inline void group(const A8Args& a, int64_t n, int64_t cols, int64_t m0) {
  __m512 acc[4][MT];
  for (int j = 0; j < 4; ++j) {
    if (j < cols) {
      if constexpr (INT4 && sizeof(ST) == 1) tile4k<MT>(a, n + j, m0, acc[j]);
      else if constexpr (INT4) tile4<MT, ST>(a, n + j, m0, acc[j]);
      else tile8<MT, ST>(a, n + j, m0, acc[j]);
    } else {
      for (int r = 0; r < MT; ++r) acc[j][r] = _mm512_setzero_ps();
    }
  }
  for (int r = 0; r < MT; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]));
    for (int j = 0; j < cols; ++j) a8_store(a, m0 + r, n + j, t[j]);
  }
}

template <bool INT4, class ST>
void rows(const A8Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t cols = std::min<int64_t>(4, n1 - n);
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) group<INT4, 4, ST>(a, n, cols, m);
    switch (a.M - m) {
      case 3: group<INT4, 3, ST>(a, n, cols, m); break;
      case 2: group<INT4, 2, ST>(a, n, cols, m); break;
      case 1: group<INT4, 1, ST>(a, n, cols, m); break;
      default: break;
    }
  }
}

inline __m512 load16(const void* x, bool bf16, int64_t i) {
  if (bf16) {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(static_cast<const float*>(x) + i);
}

}  // namespace

void int4_a8_vnni(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.super) rows<true, uint8_t>(a, n0, n1);
  else if (a.half) rows<true, uint16_t>(a, n0, n1);
  else rows<true, float>(a, n0, n1);
}
void int8_a8_vnni(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<false, uint16_t>(a, n0, n1);
  else rows<false, float>(a, n0, n1);
}

void a8_quantize_avx512(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                        const A8Buffers& b, bool int4) {
  const int64_t K = a.K, Kp = a.Kp;
  a8_zero_fill(a, b, int4);
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  for (int64_t m = 0; m < a.M; ++m) {
    int8_t* qr = b.xq + m * Kp;
    for (int64_t bl = 0; bl < K / 32; ++bl) {
      const __m512 v0 = load16(x, x_bf16, m * x_stride + bl * 32);
      const __m512 v1 = load16(x, x_bf16, m * x_stride + bl * 32 + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0),
                                                            _mm512_abs_ps(v1)));
      const float db = amax / 127.0f;
      const float id = db != 0.0f ? 1.0f / db : 0.0f;
      const __m512 iv = _mm512_set1_ps(id);
      const __m512i q0 = _mm512_max_epi32(nlim, _mm512_min_epi32(
          lim, _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv))));
      const __m512i q1 = _mm512_max_epi32(nlim, _mm512_min_epi32(
          lim, _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv))));
      a8_store_block(qr, int4, bl,
                     _mm256_inserti128_si256(
                         _mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                         _mm512_cvtepi32_epi8(q1), 1));
      a8_put_scale(a, b, int4, m, bl, db);
      if (b.xs) a8_add_xs(a, b, m, bl, db, _mm512_reduce_add_epi32(q0),
                          _mm512_reduce_add_epi32(q1));
    }
    a8_row_sums(a, b, int4, m);
  }
}

}  // namespace localchat_cpu
