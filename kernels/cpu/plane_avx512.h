// AVX-512 (F/BW/VL/DQ) kernels shared by the bit-plane layouts (int5: qa5_avx512.cpp, int6:
// qa6_avx512.cpp) that need no VNNI: the row dequantization and the exact fp32-activation
// matmul. A 128-column chunk decodes into eight 16-column fp32 vectors in column order: the
// layout's Row gives the u bytes of the even and odd columns, unpacklo / unpackhi interleave
// them back (per 128-bit lane l: columns 32 l .. 32 l + 15 and 32 l + 16 .. 32 l + 31), minus
// the offset, widened, times the vector's scale (explicit rounding intrinsic, so no
// contraction: one rounding, exact for int5's d). bf16 out rounds to nearest even by integer
// arithmetic (avx512_common.h's to_bf16). Included inside the anonymous namespace of each TU,
// after immintrin.h, avx512_common.h and the layout's Row and store (qa5_row.h, qa6_row.h).

// Chunk c of the row -> w[j] = columns 128 c + 16 j .. 128 c + 16 j + 15 (fp32).
template <class Row>
inline void plane_decode_chunk(const Row& row, const uint8_t* wl, int64_t c, __m512* w) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i off = _mm512_set1_epi8(Row::kOffset);
  __m512i lo, hi;
  row.unpack(c, _mm512_loadu_si512(wl + 64 * c), &lo, &hi);
  const __m512i e0 = _mm512_sub_epi8(_mm512_unpacklo_epi8(lo, hi), off);
  const __m512i e1 = _mm512_sub_epi8(_mm512_unpackhi_epi8(lo, hi), off);
  alignas(32) float s[8];
  row.vec_scales(c, s);
#define LC_LANE(L)                                                                              \
  w[2 * L] = _mm512_mul_round_ps(                                                               \
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e0, L))),               \
      _mm512_set1_ps(s[2 * L]), kRound);                                                        \
  w[2 * L + 1] = _mm512_mul_round_ps(                                                           \
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(e1, L))),               \
      _mm512_set1_ps(s[2 * L + 1]), kRound);
  LC_LANE(0) LC_LANE(1) LC_LANE(2) LC_LANE(3)
#undef LC_LANE
}

// Rows [r0, r1) into out [N, K] (fp32, or bf16 bits when BF16).
template <class Row, bool BF16>
void plane_dequant_rows(const typename Row::Args& a, void* out, int64_t r0, int64_t r1) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n) {
    const Row row(a, n);
    const uint8_t* wl = a.qlow + n * (K / 2);
    for (int64_t c = 0; c < K / 128; ++c) {
      __m512 w[8];
      plane_decode_chunk(row, wl, c, w);
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

constexpr int64_t kF32Prefetch = 1024;  // bytes of qlow ahead (qhigh: in proportion)

// One output column x MT activation rows, chunk by chunk: four accumulators per row (the
// chunk's 16-column vectors i go to accumulator i % 4, so the fma chains overlap), summed as
// (a0 + a1) + (a2 + a3) and reduced once at the end: the order depends only on k.
template <class Row, int MT>
inline void plane_f32_tile(const typename Row::Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const Row row(a, n);
  __m512 acc[MT][4];
  for (int r = 0; r < MT; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 128; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kF32Prefetch), _MM_HINT_T0);
    row.prefetch(c, kF32Prefetch);
    __m512 w[8];
    plane_decode_chunk(row, wl, c, w);
    for (int r = 0; r < MT; ++r) {
      const float* x = a.x + (m0 + r) * K + 128 * c;
      for (int i = 0; i < 8; ++i)
        acc[r][i & 3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * i), w[i], acc[r][i & 3]);
    }
  }
  for (int r = 0; r < MT; ++r)
    store(a, m0 + r, n, _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]))));
}

template <class Row>
void plane_dequant_avx512(const typename Row::Args& a, void* out, bool bf16, int64_t r0,
                          int64_t r1) {
  if (bf16) plane_dequant_rows<Row, true>(a, out, r0, r1);
  else plane_dequant_rows<Row, false>(a, out, r0, r1);
}

// Output columns [n0, n1) for every activation row.
template <class Row>
void plane_f32_avx512(const typename Row::Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    // tiles of four rows; five rows (the speculative verify shape) in one tile
    for (; a.M - m >= 4 && a.M - m != 5; m += 4) plane_f32_tile<Row, 4>(a, n, m);
    switch (a.M - m) {
      case 5: plane_f32_tile<Row, 5>(a, n, m); break;
      case 3: plane_f32_tile<Row, 3>(a, n, m); break;
      case 2: plane_f32_tile<Row, 2>(a, n, m); break;
      case 1: plane_f32_tile<Row, 1>(a, n, m); break;
      default: break;
    }
  }
}
