// AVX2 kernels shared by the bit-plane layouts (int5: qa5_avx2.cpp, int6: qa6_avx2.cpp); also
// the integer-dot path of AVX-512 CPUs without VNNI. Per half chunk bp (64 columns: 32 qlow
// bytes) the layout's Row2 gives the u bytes of the even (lo) and odd (hi) columns.
//   integer dot (int5; int6 has its own, qa6_avx2.cpp): `maddubs` (u8 x s8 -> int16 pairs, at
//   most 2 * 31 * 127 each, the even and odd halves summed: no saturation), `madd` with ones
//   -> 8 int32 lanes (lane i = lane 8 bp + i of qa5.h), folded per 256 columns into one int32
//   per 32-column block plus -offset * (the block's activation sum) (plane_a8_tile),
//   converted and FMA'd with the block's weight scale times dact; one 8-lane accumulator per
//   (column, row), a fixed horizontal sum at the end.
//   fp32 decode: the even / odd columns interleaved back by unpacklo / unpackhi (per 128-bit
//   lane), minus the offset, widened, times the 16-column unit's scale; the fp32 matmul does
//   one fma per weight into two 8-lane accumulators per (column, row) (vector j into j % 2), in
//   k order.
// Included inside the anonymous namespace of each TU, after immintrin.h and the layout's
//   struct Row2 {
//     typedef ... Args;  static constexpr int kOffset;
//     Row2(const Args& a, int64_t n);
//     void prefetch(int64_t c, int64_t ahead) const;   // the chunk's qhigh bytes
//     void u_half(int64_t c, int bp, __m256i q, __m256i* lo, __m256i* hi) const;  // q: qlow
//     void lane_scales(int64_t c, __m256* sv) const;   // sv[bp] lane i's weight scale
//     __m256 block_scales8(int64_t c, bool two) const;  // blocks 4c..4c+7 (4c+3 if !two)
//     void unit_scales(int64_t c, int bp, float* s) const;  // s[u]: 16-column unit u
//   };
// and store(a, m, n, v).

// Bytes ahead of the qlow stream prefetched (qhigh: in proportion), as qa8_vnni.cpp.
constexpr int64_t kPrefetch = 1024;

inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// int16 lanes of a half chunk's integer dot: the u bytes of its even (lo) and odd (hi)
// columns `maddubs` the activations at xe (even columns) and xe + 64 (odd), summed (no
// saturation for u <= 63: at most 4 * 63 * 127).
inline __m256i plane_pairs(__m256i lo, __m256i hi, const int8_t* xe) {
  return _mm256_add_epi16(
      _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xe))),
      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xe + 64))));
}

template <class Row2>
inline void plane_u_half(const Row2& row, const uint8_t* wl, int64_t c, int bp, __m256i* lo,
                         __m256i* hi) {
  row.u_half(c, bp,
             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wl + 64 * c + 32 * bp)), lo,
             hi);
}

// Integer dot, per 256 columns (chunks c, c + 1: 8 activation blocks): each half chunk's 8
// int32 lanes (4 per block), two rounds of `hadd` fold the four half chunks into one int32 per
// block (lanes: blocks 0 2 4 6 1 3 5 7), plus the offset's share of each block from the row's
// block sums (Args::put_avx2_sums, in that lane order): exact; then one convert, one product
// of the block scales (Row2::block_scales8, permuted to that order) with dact and one FMA; a last
// single chunk (K % 256 == 128) folds with zeros. For layouts with one weight scale per
// 32-column block (int5).
template <class Row2, int MT>
inline void plane_a8_tile(const typename Row2::Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, nc = K / 128;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const uint8_t* wl = a.qlow + n * (K / 2);
  const Row2 row(a, n);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < nc; c += 2) {
    __m256i h[2][MT];
    for (int cc = 0; cc < 2; ++cc) {
      const int64_t ch = c + cc;
      if (ch >= nc) {
        for (int r = 0; r < MT; ++r) h[cc][r] = _mm256_setzero_si256();
        continue;
      }
      _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * ch + kPrefetch), _MM_HINT_T0);
      row.prefetch(ch, kPrefetch);
      __m256i dt[2][MT];
      for (int bp = 0; bp < 2; ++bp) {
        __m256i lo, hi;
        plane_u_half(row, wl, ch, bp, &lo, &hi);
        for (int r = 0; r < MT; ++r) {
          const int8_t* xe = a.xq + (m0 + r) * K + 128 * ch + 32 * bp;
          dt[bp][r] = _mm256_madd_epi16(plane_pairs(lo, hi, xe), ones);
        }
      }
      for (int r = 0; r < MT; ++r) h[cc][r] = _mm256_hadd_epi32(dt[0][r], dt[1][r]);
    }
    const bool two = c + 1 < nc;
    const __m256 sv = _mm256_permutevar8x32_ps(row.block_scales8(c, two), order);
    const __m256i dmask = _mm256_setr_epi32(-1, -1, -1, -1, two ? -1 : 0, two ? -1 : 0,
                                            two ? -1 : 0, two ? -1 : 0);
    for (int r = 0; r < MT; ++r) {
      const __m256i d8 = _mm256_add_epi32(
          _mm256_hadd_epi32(h[0][r], h[1][r]),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              static_cast<const int32_t*>(a.avx2_sums) + (m0 + r) * (K / 8) + 4 * c)));
      const __m256 dact = _mm256_permutevar8x32_ps(
          _mm256_maskload_ps(a.dact + (m0 + r) * (K / 32) + 4 * c, dmask), order);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d8), _mm256_mul_ps(sv, dact), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) store(a, m0 + r, n, hsum(acc[r]));
}

// Half bp of chunk c -> w[j] = columns 128 c + 64 bp + 8 j .. + 7 (fp32).
template <class Row2>
inline void plane_decode_half(const Row2& row, const uint8_t* wl, int64_t c, int bp,
                              __m256* w) {
  __m256i lo, hi;
  plane_u_half(row, wl, c, bp, &lo, &hi);
  const __m256i off = _mm256_set1_epi8(Row2::kOffset);
  // per 128-bit lane l: e0 = columns 32 l .. 32 l + 15, e1 = 32 l + 16 .. 32 l + 31
  const __m256i e0 = _mm256_sub_epi8(_mm256_unpacklo_epi8(lo, hi), off);
  const __m256i e1 = _mm256_sub_epi8(_mm256_unpackhi_epi8(lo, hi), off);
  alignas(16) float s[4];
  row.unit_scales(c, bp, s);
  const __m128i unit[4] = {_mm256_castsi256_si128(e0), _mm256_castsi256_si128(e1),
                           _mm256_extracti128_si256(e0, 1), _mm256_extracti128_si256(e1, 1)};
  for (int u = 0; u < 4; ++u) {
    const __m256 sv = _mm256_set1_ps(s[u]);
    w[2 * u] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unit[u])), sv);
    w[2 * u + 1] = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(unit[u], 8))), sv);
  }
}

// One output column x MT activation rows: two accumulators per row (the half chunk's
// 8-column vectors j go to accumulator j % 2), summed once at the end: the order depends only
// on k. The compiler keeps the weights in the registers the accumulators leave.
template <class Row2, int MT>
inline void plane_f32_tile(const typename Row2::Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const Row2 row(a, n);
  __m256 acc[MT][2];
  for (int r = 0; r < MT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kPrefetch), _MM_HINT_T0);
    row.prefetch(c, kPrefetch);
    for (int bp = 0; bp < 2; ++bp) {
      __m256 w[8];
      plane_decode_half(row, wl, c, bp, w);
      for (int r = 0; r < MT; ++r) {
        const float* x = a.x + (m0 + r) * K + 128 * c + 64 * bp;
        for (int j = 0; j < 8; ++j)
          acc[r][j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * j), w[j], acc[r][j & 1]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) store(a, m0 + r, n, hsum(_mm256_add_ps(acc[r][0], acc[r][1])));
}

// 16 fp32 -> 16 bf16 bits (round to nearest even, NaN -> 0x7FC0).
inline __m256i plane_to_bf16(__m256 a, __m256 b) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                qnan = _mm256_set1_epi32(0x7fc0);
  __m256i r[2];
  const __m256 v[2] = {a, b};
  for (int i = 0; i < 2; ++i) {
    const __m256i u = _mm256_castps_si256(v[i]);
    __m256i t = _mm256_add_epi32(
        u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    t = _mm256_srli_epi32(t, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    r[i] = _mm256_blendv_epi8(t, qnan, nan);
  }
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
}

// Activation rows per pass up to 4 (M split evenly: 5 -> 3 + 2, 8 -> 4 + 4).
template <class Row2>
void plane_a8_avx2(const typename Row2::Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < a.M;) {
      const int64_t passes = (a.M - m + 3) / 4, mt = (a.M - m + passes - 1) / passes;
      switch (mt) {
        case 1: plane_a8_tile<Row2, 1>(a, n, m); break;
        case 2: plane_a8_tile<Row2, 2>(a, n, m); break;
        case 3: plane_a8_tile<Row2, 3>(a, n, m); break;
        default: plane_a8_tile<Row2, 4>(a, n, m); break;
      }
      m += mt;
    }
}

template <class Row2>
void plane_f32_avx2(const typename Row2::Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) plane_f32_tile<Row2, 4>(a, n, m);
    switch (a.M - m) {
      case 3: plane_f32_tile<Row2, 3>(a, n, m); break;
      case 2: plane_f32_tile<Row2, 2>(a, n, m); break;
      case 1: plane_f32_tile<Row2, 1>(a, n, m); break;
      default: break;
    }
  }
}

template <class Row2>
void plane_dequant_avx2(const typename Row2::Args& a, void* out, bool bf16, int64_t r0,
                        int64_t r1) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* wl = a.qlow + n * (K / 2);
    const Row2 row(a, n);
    for (int64_t c = 0; c < K / 128; ++c)
      for (int bp = 0; bp < 2; ++bp) {
        __m256 w[8];
        plane_decode_half(row, wl, c, bp, w);
        const int64_t at = n * K + 128 * c + 64 * bp;
        for (int j = 0; j < 8; j += 2) {
          if (bf16) {
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at + 8 * j),
                plane_to_bf16(w[j], w[j + 1]));
          } else {
            _mm256_storeu_ps(static_cast<float*>(out) + at + 8 * j, w[j]);
            _mm256_storeu_ps(static_cast<float*>(out) + at + 8 * j + 8, w[j + 1]);
          }
        }
      }
  }
}
