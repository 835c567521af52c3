// AVX-512 helpers shared by the integer-dot and dequantizing translation units. Included
// INSIDE the anonymous namespace of a TU compiled for AVX-512 (after its `#pragma GCC target`
// and <immintrin.h>), so each TU has its own internal-linkage copy for its ISA.

// The sum of a vector's 16 lanes: 8 + 8, 4 + 4, 2 + 2, 1 + 1 (a fixed order, so a sum's bits
// depend only on its vector).
inline float sum16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// The 16-lane sums of four accumulators (four output columns) in one transposed reduction:
// each column's sum takes the same additions in the same order whatever its neighbours are
// (zero vectors where a group has fewer than four columns), so results are batch invariant.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit lanes: [a0+a2, a1+a3, b0+b2, b1+b3] and the same for c, d
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  // 128-bit lanes: a, b, c, d (four partial sums each)
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(
      _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
}

// 16 fp32 -> 16 bf16 bits, round to nearest even (a NaN becomes the quiet NaN 0x7FC0, as
// c10::BFloat16 does).
inline __m256i to_bf16(__m512 w) {
  const __m512i u = _mm512_castps_si512(w);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}
