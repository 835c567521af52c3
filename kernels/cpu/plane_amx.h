// The bit-plane layouts' rows as bf16 for the AMX prefill GEMM (amx.h): plane_avx512.h's chunk
// decode (fp32, exact), rounded to nearest even by vcvtne2ps2bf16 (one instruction per 32
// values, where avx512_common.h's integer to_bf16 takes five per 16) into rows 0.. of the
// strip. Included inside amx_fill_planes.cpp's per-layout namespaces (within its anonymous
// one), after plane_avx512.h and the layout's Row.

// Rows [r0, r1) of the weight in `a` -> out [r1 - r0, K] bf16 bits.
template <class Row>
void plane_rows_bf16_hw(const typename Row::Args& a, int64_t r0, int64_t r1, uint16_t* out) {
  const int64_t K = a.K;
  for (int64_t n = r0; n < r1; ++n) {
    const Row row(a, n);
    const uint8_t* wl = a.qlow + n * (K / 2);
    uint16_t* o = out + (n - r0) * K;
    for (int64_t c = 0; c < K / 128; ++c) {
      __m512 w[8];
      plane_decode_chunk(row, wl, c, w);
      for (int j = 0; j < 4; ++j)  // low half: w[2 j], high half: w[2 j + 1]
        _mm512_storeu_si512(o + 128 * c + 32 * j,
                            reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w[2 * j + 1], w[2 * j])));
    }
  }
}
