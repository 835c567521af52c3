// The AVX-512 VNNI integer-dot matmul shared by the bit-plane layouts (int5: qa5_vnni.cpp,
// int6: qa6_vnni.cpp). Per 128-column chunk one 64-byte qlow load; the layout's Row turns it
// and the chunk's qhigh bits into the unsigned bytes u of the even columns (lo) and the odd
// columns (hi), and gives the 16 lane scales. Two chained `vpdpbusd` (u8 x s8 -> 16 int32
// lanes) against the even and odd halves of the chunk's activations (qa8.h's int4 layout),
// started from corr = -offset * (sum of the lane's 8 activations), give each lane's exact dot
// of q = u - offset; then one convert and one FMA with the lane's weight scale times dact.
// Output columns in groups of four (one transposed reduction), activation rows in tiles of up
// to four sharing each unpacked chunk, so row m of an M-row call equals the 1-row call bit for
// bit. Included inside the anonymous namespace of each TU, after immintrin.h, <algorithm>,
// avx512_common.h (reduce4) and the layout's Row and store (qa5_row.h, qa6_row.h).

constexpr int64_t kPrefetch = 1024;  // bytes of qlow ahead (qhigh: in proportion)

template <class Row, int MT>
inline void plane_tile(const typename Row::Args& a, int64_t n, int64_t m0, __m512* out) {
  const int64_t K = a.K, nc = K / 128;
  const uint8_t* wl = a.qlow + n * (K / 2);
  const Row row(a, n);
  __m512 acc[MT];  // in registers (through `out` the compiler stored them every chunk)
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(wl + 64 * c + kPrefetch), _MM_HINT_T0);
    row.prefetch(c, kPrefetch);
    __m512i lo, hi;
    row.unpack(c, _mm512_loadu_si512(wl + 64 * c), &lo, &hi);
    const __m512 sv = row.lane_scales(c);
    for (int r = 0; r < MT; ++r) {
      const int64_t m = m0 + r;
      const int8_t* xq = a.xq + m * K + 128 * c;
      __m512i dot = _mm512_loadu_si512(a.corr + m * (K / 8) + 16 * c);
      dot = _mm512_dpbusd_epi32(dot, lo, _mm512_loadu_si512(xq));
      dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
      const __m512 dv = _mm512_loadu_ps(a.dv + (m * (K / 32) + 4 * c) * 4);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, dv), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}

template <class Row, int MT>
inline void plane_group(const typename Row::Args& a, int64_t n, int64_t cols, int64_t m0) {
  __m512 acc[4][MT];
  for (int j = 0; j < 4; ++j) {
    if (j < cols) {
      plane_tile<Row, MT>(a, n + j, m0, acc[j]);
    } else {
      for (int r = 0; r < MT; ++r) acc[j][r] = _mm512_setzero_ps();
    }
  }
  for (int r = 0; r < MT; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]));
    for (int j = 0; j < cols; ++j) store(a, m0 + r, n + j, t[j]);
  }
}

// Output columns [n0, n1) for every activation row.
template <class Row>
void plane_a8_vnni(const typename Row::Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t cols = std::min<int64_t>(4, n1 - n);
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) plane_group<Row, 4>(a, n, cols, m);
    switch (a.M - m) {
      case 3: plane_group<Row, 3>(a, n, cols, m); break;
      case 2: plane_group<Row, 2>(a, n, cols, m); break;
      case 1: plane_group<Row, 1>(a, n, cols, m); break;
      default: break;
    }
  }
}
