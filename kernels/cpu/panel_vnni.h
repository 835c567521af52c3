// Helpers shared by the panel layouts' AVX-512 VNNI kernels (panel4_vnni.cpp,
// panel6_vnni.cpp). Included inside the anonymous namespace of such a TU, after immintrin.h,
// <cstring>, qa8.h (A8Args) and avx512_common.h (to_bf16).

constexpr int64_t kPrefetch = 2048;  // bytes ahead in a tile's weight stream

// Four activation bytes broadcast to every 32-bit lane (the `vpdpbusd` operand of one row).
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The 16 outputs n .. n + 15 of row m, fp32 or bf16 (round to nearest even) as a.out_bf16 says.
inline void store16(const A8Args& a, int64_t m, int64_t n, __m512 v) {
  if (a.out_bf16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(a.out) + m * a.N + n),
                        to_bf16(v));
  else
    _mm512_storeu_ps(static_cast<float*>(a.out) + m * a.N + n, v);
}
