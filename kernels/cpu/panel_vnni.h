// Helpers shared by the panel layouts' AVX-512 VNNI kernels (panel4_vnni.cpp,
// panel6_vnni.cpp, panel8_vnni.cpp). Included inside the anonymous namespace of such a TU,
// after immintrin.h, <algorithm>, <cstring>, <type_traits>, qa8.h (A8Args) and
// avx512_common.h (to_bf16).

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

#include "panel_pass.h"

// Rows [m0, m1) (1 to 8) of tile t in one pass: run(std::integral_constant<int, MT>{}, t,
// m0), the kernel's pass over MT rows.
template <class Pass>
inline void pass_rows(const Pass& run, int64_t t, int64_t m0, int64_t m1) {
  run_pass<8>(run, t, m0, m1 - m0);
}

// All M rows of tiles [t0, t1): blocks of 16 rows, each over the whole tile range (its
// weights then come from the cache for the next block); a block of more than 8 rows takes two
// passes per tile. Every output takes the same operations whatever the blocking.
template <class Pass>
inline void pass_tiles(const Pass& run, int64_t M, int64_t t0, int64_t t1) {
  for (int64_t mb = 0; mb < M; mb += 16) {
    const int64_t me = std::min<int64_t>(M, mb + 16), half = (me - mb + 1) / 2;
    for (int64_t t = t0; t < t1; ++t) {
      if (me - mb <= 8) {
        pass_rows(run, t, mb, me);
      } else {
        pass_rows(run, t, mb, mb + half);
        pass_rows(run, t, mb + half, me);
      }
    }
  }
}
