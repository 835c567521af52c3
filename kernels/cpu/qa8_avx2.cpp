// AVX2 integer-dot matmuls (qa8.h) and the AVX2 activation quantizer. int4: per two 32-column
// blocks one 32-byte weight load; low nibbles (even columns) and high nibbles (odd columns)
// `maddubs` (u8 x s8 -> pairs of int16) against the two halves of the chunk's activations
// (qa8.h's layout), summed in int16 (8 partials per block, at most 4 * 15 * 127 each); per 8
// blocks (256 columns) two rounds of int16 `hadd` fold them (at most 16 * 15 * 127 = 30480:
// no overflow) and one `madd` with ones gives one exact int32 dot per block, then one
// convert, one scale product and one FMA (tile4).
// int8: per 32-column block, the sign trick (|w| x sign(w) * xq, at most 2 * 128 * 127 per
// int16 pair: no saturation).
// Also the path for AVX-512 CPUs without VNNI. Design after llama.cpp's ggml_vec_dot_q4_1_q8_1
// / q8_0_q8_0 AVX2 kernels (own code).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qa8.h"
#include "qa8_layout.h"

namespace localchat_cpu {
namespace {
#include "a8_store.h"

inline float ld1(const float* p) { return *p; }
inline float ld1(const uint16_t* p) { return _cvtsh_ss(*p); }

inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// fp32 min term: sum_g mins[g] * xs[g] (8 lanes, then the scalar tail).
template <class ST>
inline float min_term(const ST* mn, const float* xs, int64_t ng) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= ng; g += 8) {
    __m256 m;
    if constexpr (sizeof(ST) == 2)
      m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + g)));
    else
      m = _mm256_loadu_ps(reinterpret_cast<const float*>(mn + g));
    acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(xs + g), acc);
  }
  float t = hsum(acc);
  for (; g < ng; ++g) t = __builtin_fmaf(ld1(mn + g), xs[g], t);
  return t;
}

// min_term for two-level scales (qa8.h's `super`): per super-block, 8 uint8 m times its
// -dmin (exact products: the folded values), in min_term's order (ng % 8 == 0: no tail).
inline float min_term_k(const uint8_t* mn, const uint16_t* sup, const float* xs, int64_t ng) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; g += 8) {
    const __m256 mi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + g))));
    const __m256 m = _mm256_mul_ps(mi, _mm256_set1_ps(_cvtsh_ss(sup[(g / 8) * 2 + 1])));
    acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(xs + g), acc);
  }
  return hsum(acc);
}

template <int MT, class ST>
inline void finish(const A8Args& a, int64_t n, int64_t m0, const __m256* acc) {
  const int64_t ng = a.ngroups;
  for (int r = 0; r < MT; ++r) {
    const int64_t m = m0 + r;
    float t = hsum(acc[r]);
    if constexpr (sizeof(ST) == 1)
      t += min_term_k(static_cast<const uint8_t*>(a.mins) + n * ng, a.super + n * (ng / 8) * 2,
                      a.xs + m * ng, ng);
    else if (a.mins)
      t += min_term(static_cast<const ST*>(a.mins) + n * ng, a.xs + m * ng, ng);
    a8_store(a, m, n, t);
  }
}

// Output row n's weight scale pointers, set up once per row.
template <class ST>
struct ScaleRow {
  const ST* s;
  const uint16_t* sup;  // two-level (sizeof(ST) == 1): (d, -dmin) per 256 columns
  ScaleRow(const A8Args& a, int64_t n)
      : s(static_cast<const ST*>(a.scales) + n * a.ngroups),
        sup(sizeof(ST) == 1 ? a.super + n * (a.ngroups / 8) * 2 : nullptr) {}
};

// Whole spans of two-level scales or groups of 32: one vector load (no lane past the end).
template <class ST>
inline __m256 scales8_direct(const ScaleRow<ST>& row, int64_t b8) {
  if constexpr (sizeof(ST) == 1)
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.s + b8)))),
                         _mm256_set1_ps(_cvtsh_ss(row.sup[b8 / 4])));
  else if constexpr (sizeof(ST) == 2)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.s + b8)));
  else
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row.s + b8));
}

// The weight scales of blocks b8 .. b8 + 7 (b8 % 8 == 0) of a row as fp32, lanes past the last
// block zero: two-level d * sc (exact products; K % 256 == 0), else each block's group scale
// (one vector load for whole spans of groups of 32).
template <class ST>
inline __m256 scales8(const A8Args& a, const ScaleRow<ST>& row, int64_t b8, int64_t nb) {
  if constexpr (sizeof(ST) == 1) {
    return scales8_direct(row, b8);
  } else {
    if (a.group_size == 32 && b8 + 8 <= nb) return scales8_direct(row, b8);
    alignas(32) float t[8];
    for (int j = 0; j < 8; ++j) t[j] = b8 + j < nb ? ld1(row.s + a.blk2grp[b8 + j]) : 0.0f;
    return _mm256_load_ps(t);
  }
}

// The activation block scales d[m, b8 .. b8 + 7] (lanes past Kp / 32 zero, never read).
inline __m256 dact8(const A8Args& a, int64_t m, int64_t b8) {
  const int64_t nbp = a.Kp / 32;
  const float* dp = a.d + m * nbp + b8;
  if (b8 + 8 <= nbp) return _mm256_loadu_ps(dp);
  return _mm256_maskload_ps(dp, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nbp - b8)),
                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// int4, per 8 blocks (256 columns): four steps of two blocks (one 32-byte weight load, low
// nibbles against the chunk's even-column half, high nibbles against the odd one, two
// `maddubs` summed -> 16 int16 partial dots, 8 per block), then two rounds of int16 `hadd`
// and one `madd` with ones fold the four steps' 64 partials into one exact int32 dot per
// block (lanes: blocks 0 2 4 6 1 3 5 7; a madd per 256 columns, not one per 64), and
// one convert, one product of the weight and activation scales (permuted to that lane order)
// and one FMA per 8 blocks; so each lane sums the blocks b = lane's b % 8 in block order, and
// the 8 lanes are summed at the end (then the min term). The float work and the FMA chain
// are once per 256 columns, not per 64. The same order for every MT: batch invariant.
template <int MT, class ST>
inline void tile4(const A8Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, nb = K / 32;
  const uint8_t* wr = static_cast<const uint8_t*>(a.qweight) + n * (K / 2);
  const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0F);
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  // steps 2q and 2q + 1 of a span (blocks b8 + 4q .. b8 + 4q + 3; nw0 / nw1 of each step's 32
  // weight bytes real: 16 for a last odd block, 0 past the end) for every row: 16 int16
  // partial dots per step (two maddubs summed), the two steps folded at once (int16 hadd) so
  // each row holds one vector per pair
  const auto pair = [&](int64_t b8, int q, int nw0, int nw1, __m256i* hq) {
    if (nw0 == 0) {  // no block of this 128-column chunk exists: nothing to read (past Kp)
      for (int r = 0; r < MT; ++r) hq[r] = _mm256_setzero_si256();
      return;
    }
    __m256i lo[2], hi[2];
    for (int t = 0; t < 2; ++t) {
      const uint8_t* wp = wr + 16 * b8 + 64 * q + 32 * t;
      const int nwt = t ? nw1 : nw0;
      const __m256i w = nwt == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp))
          : nwt == 16
              ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp)))
              : _mm256_setzero_si256();
      lo[t] = _mm256_and_si256(w, nib);
      hi[t] = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
    }
    const int64_t xo = 32 * b8 + 128 * q;
    for (int r = 0; r < MT; ++r) {
      const int8_t* xe = a.xq + (m0 + r) * Kp + xo;
      __m256i dt[2];
      for (int t = 0; t < 2; ++t) {
        const int8_t* x = xe + 32 * t;
        dt[t] = _mm256_add_epi16(
            _mm256_maddubs_epi16(lo[t], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))),
            _mm256_maddubs_epi16(hi[t], _mm256_loadu_si256(
                                            reinterpret_cast<const __m256i*>(x + 64))));
      }
      hq[r] = _mm256_hadd_epi16(dt[0], dt[1]);
    }
  };
  // one span's fold: the block scales s8 and each row's activation block scales dact(r), both
  // in block order, permuted to the lanes' order
  const auto fold_rows = [&](__m256 s8, auto dact, const __m256i* h01, const __m256i* h23) {
    const __m256 sv = _mm256_permutevar8x32_ps(s8, order);
    for (int r = 0; r < MT; ++r) {
      const __m256i d8 = _mm256_madd_epi16(_mm256_hadd_epi16(h01[r], h23[r]), ones);
      const __m256 d = _mm256_permutevar8x32_ps(dact(r), order);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d8), _mm256_mul_ps(sv, d), acc[r]);
    }
  };
  const ScaleRow<ST> srow(a, n);
  const auto fold = [&](int64_t b8, const __m256i* h01, const __m256i* h23) {
    fold_rows(scales8<ST>(a, srow, b8, nb), [&](int r) { return dact8(a, m0 + r, b8); }, h01,
              h23);
  };
  // whole spans of two-level scales or groups of 32: the scales' and each row's activation
  // scales' pointers set up once (no index arithmetic, tail test or mask per span: 4-11% less
  // time at M = 1 in L2)
  const bool direct = sizeof(ST) == 1 || a.group_size == 32;
  const float* drow[MT];
  for (int r = 0; r < MT; ++r) drow[r] = a.d + (m0 + r) * (Kp / 32);
  const auto fold_span = [&](int64_t b8, const __m256i* h01, const __m256i* h23) {
    fold_rows(scales8_direct(srow, b8), [&](int r) { return _mm256_loadu_ps(drow[r] + b8); },
              h01, h23);
  };
  __m256i h01[MT], h23[MT];
  int64_t b8 = 0;
  for (; b8 + 8 <= nb; b8 += 8) {
    pair(b8, 0, 32, 32, h01);
    pair(b8, 1, 32, 32, h23);
    if (direct) fold_span(b8, h01, h23);
    else fold(b8, h01, h23);
  }
  if (b8 < nb) {  // 1..7 blocks left
    const int64_t left = nb - b8;
    const auto nw = [&](int h) { return 2 * h + 1 < left ? 32 : (2 * h < left ? 16 : 0); };
    pair(b8, 0, nw(0), nw(1), h01);
    pair(b8, 1, nw(2), nw(3), h23);
    fold(b8, h01, h23);
  }
  finish<MT, ST>(a, n, m0, acc);
}

// int8, groups of 32 or more: per 8 blocks (256 columns) the blocks' 8-lane partial dots
// (sign trick, `maddubs` + `madd`) folded by `hadd` and one 128-bit half add into one exact
// int32 per block in block order, then one convert, scale product and FMA (lane j sums the
// blocks b % 8 == j).
template <int MT, class ST>
inline void tile8_fold(const A8Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, nb = K / 32;
  const int8_t* wr = static_cast<const int8_t*>(a.qweight) + n * K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b8 = 0; b8 < nb; b8 += 8) {
    const int64_t left = std::min<int64_t>(8, nb - b8);
    __m256i y[2][MT];
    for (int half = 0; half < 2; ++half) {
      __m256i x[2][MT];
      for (int pr = 0; pr < 2; ++pr) {
        __m256i v[2][MT];
        for (int t = 0; t < 2; ++t) {
          const int64_t j = 4 * half + 2 * pr + t;
          if (j >= left) {
            for (int r = 0; r < MT; ++r) v[t][r] = _mm256_setzero_si256();
            continue;
          }
          const int64_t b = b8 + j;
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + 32 * b));
          const __m256i ax = _mm256_sign_epi8(w, w);
          for (int r = 0; r < MT; ++r) {
            const __m256i xq = _mm256_sign_epi8(_mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(a.xq + (m0 + r) * Kp + 32 * b)), w);
            v[t][r] = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, xq), ones);
          }
        }
        for (int r = 0; r < MT; ++r) x[pr][r] = _mm256_hadd_epi32(v[0][r], v[1][r]);
      }
      for (int r = 0; r < MT; ++r) y[half][r] = _mm256_hadd_epi32(x[0][r], x[1][r]);
    }
    const __m256 sv = scales8<ST>(a, ScaleRow<ST>(a, n), b8, nb);
    for (int r = 0; r < MT; ++r) {
      const __m256i d8 = _mm256_add_epi32(_mm256_permute2x128_si256(y[0][r], y[1][r], 0x20),
                                          _mm256_permute2x128_si256(y[0][r], y[1][r], 0x31));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d8), _mm256_mul_ps(sv, dact8(a, m0 + r, b8)),
                               acc[r]);
    }
  }
  finish<MT, ST>(a, n, m0, acc);
}

// int8, groups of 16 (two scales per 32-column block): per block one 8-lane FMA.
template <int MT, class ST>
inline void tile8(const A8Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, nb = K / 32;
  const ST* s = static_cast<const ST*>(a.scales) + n * ng;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const int8_t*>(a.qweight) + n * K + b * 32));
    const __m256i ax = _mm256_sign_epi8(w, w);
    __m256 sv;
    if (a.group_size == 16)
      sv = _mm256_set_m128(_mm_set1_ps(ld1(s + 2 * b + 1)), _mm_set1_ps(ld1(s + 2 * b)));
    else
      sv = _mm256_set1_ps(ld1(s + a.blk2grp[b]));
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + m * Kp + b * 32));
      xq = _mm256_sign_epi8(xq, w);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, xq), ones);
      const __m256 sd = _mm256_mul_ps(sv, _mm256_set1_ps(a.d[m * (Kp / 32) + b]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[r]);
    }
  }
  finish<MT, ST>(a, n, m0, acc);
}

// Activation rows per pass: int4 up to 6 (M split evenly: 5 -> 5, 8 -> 4 + 4, 16 -> 6 + 5
// + 5), int8 up to 4.
template <bool INT4, class ST>
void rows(const A8Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t kMax = INT4 ? 6 : 4;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < a.M;) {
      const int64_t passes = (a.M - m + kMax - 1) / kMax;
      const int64_t mt = (a.M - m + passes - 1) / passes;
#define LC_TILE(MT)                                   \
  case MT:                                            \
    if constexpr (INT4) tile4<MT, ST>(a, n, m);       \
    else if constexpr (MT <= 4) {                     \
      if (a.group_size == 16) tile8<MT, ST>(a, n, m); \
      else tile8_fold<MT, ST>(a, n, m);               \
    }                                                 \
    break;
      switch (mt) { LC_TILE(1) LC_TILE(2) LC_TILE(3) LC_TILE(4) LC_TILE(5) LC_TILE(6) default: break; }
#undef LC_TILE
      m += mt;
    }
  }
}

inline int32_t hsum_i32(__m256i v) {
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 1));
  return _mm_cvtsi128_si32(q);
}

inline __m256 load8(const void* x, bool bf16, int64_t i) {
  if (bf16) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(x) + i);
}

}  // namespace

// The AVX2 kernels (sign trick) read no ncorr, so it is not written here (VNNI's quantizer
// writes it for its own kernels).
void a8_quantize_avx2(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                      const A8Buffers& b, bool int4) {
  a8_zero_fill(a, b, int4);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  // packs' dword order (per 128-bit lane: 4 of each source vector) back to column order
  const __m256i unlane = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int64_t K = a.K, Kp = a.Kp;
  for (int64_t m = 0; m < a.M; ++m) {
    int8_t* qr = b.xq + m * Kp;
    for (int64_t bl = 0; bl < K / 32; ++bl) {
      __m256 v[4];
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = load8(x, x_bf16, m * x_stride + bl * 32 + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      const float db = _mm_cvtss_f32(h) / 127.0f;
      const float id = db != 0.0f ? 1.0f / db : 0.0f;
      __m256i q[4];
      for (int i = 0; i < 4; ++i)
        q[i] = _mm256_max_epi32(nlim, _mm256_min_epi32(
            lim, _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)))));
      // 32 int8 in column order (the values fit: packs never saturates)
      const __m256i nat = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
          unlane);
      a8_store_block(qr, int4, bl, nat);
      a8_put_scale(a, b, int4, m, bl, db);
      if (b.xs) a8_add_xs(a, b, m, bl, db, hsum_i32(_mm256_add_epi32(q[0], q[1])),
                          hsum_i32(_mm256_add_epi32(q[2], q[3])));
    }
  }
}

void int4_a8_avx2(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.super) return rows<true, uint8_t>(a, n0, n1);
  if (a.half) rows<true, uint16_t>(a, n0, n1);
  else rows<true, float>(a, n0, n1);
}
void int8_a8_avx2(const A8Args& a, int64_t n0, int64_t n1) {
  if (a.half) rows<false, uint16_t>(a, n0, n1);
  else rows<false, float>(a, n0, n1);
}

}  // namespace localchat_cpu
