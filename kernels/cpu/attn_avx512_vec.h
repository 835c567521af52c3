// The AVX-512 vectors of the attention kernels (attn_kernels.h's V, W, vld_*, vfma, vsum4,
// vexp, ...), included INSIDE the anonymous namespace of a TU compiled for AVX-512 (after its
// `#pragma GCC target`, <immintrin.h> and bf16_bits.h): attn_avx512.cpp, and attn_dot.cpp, which
// adds AVX512_BF16's dot product for the decode scores.
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

// 16-lane vectors for the decode attention (attn_kernels.h).
typedef __m512 V;
constexpr int W = 16;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float f) { return _mm512_set1_ps(f); }
inline V vld_f32(const float* p) { return _mm512_loadu_ps(p); }
inline V vld_bf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline V vld_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vst(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
#include "avx512_common.h"  // sum16, reduce4
inline float vsum(V v) { return sum16(v); }
// The sums of four vectors, stored to o[0..3] (one transposed reduction).
inline void vsum4(V a, V b, V c, V d, float* o) { _mm_storeu_ps(o, reduce4(a, b, c, d)); }
// exp(x), x clamped to [-87.3, 88.3] (Cephes expf's range reduction and polynomial; about
// 2 ulp; inputs below -87.3 give about 1e-38 rather than 0, which the softmax's padding
// handles itself).
inline V vexp(V x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  V p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
inline V vround_bf16(V v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);  // quiet NaN, as f2bf
  r = _mm512_mask_mov_epi32(r, nan, _mm512_and_si512(
      _mm512_or_si512(u, _mm512_set1_epi32(0x400000)), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  return _mm512_castsi512_ps(r);
}
inline void vst_bf16(uint16_t* p, V v) {
  const __m512i r = _mm512_srli_epi32(_mm512_castps_si512(vround_bf16(v)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline V vround_f16(V v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void vst_f16(uint16_t* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
