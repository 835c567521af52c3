// AVX-512 (BW) view of one int6 weight row (qa6.h) for the bit-plane templates
// (plane_vnni.h, plane_avx512.h). Per 128-column chunk one 32-byte qhigh load h; H = [h, h >>
// 2] (64 bytes) puts the top two bits of u beside the nibble bytes: even columns
// u = (qlow & 15) | ((H & 3) << 4), odd columns u = (qlow >> 4) | (H & 0x30). Scales: d * sc
// per 16-column sub-block (one exact fp32 product). Included inside the anonymous namespace of
// an AVX-512 TU, after immintrin.h and qa6.h.

inline void store(const Int6Args& a, int64_t m, int64_t n, float v) { int6_store(a, m, n, v); }

struct Row {
  typedef Int6Args Args;
  static constexpr int kOffset = 32;  // u - q
  const uint8_t* wh;
  const int8_t* sc;
  const uint16_t* sd;
  Row(const Int6Args& a, int64_t n)
      : wh(a.qhigh + n * (a.K / 4)), sc(a.scales + n * (a.K / 16)),
        sd(a.ssc + n * (a.K / 256)) {}
  // the chunk's qhigh bytes, `ahead` bytes of qlow ahead (the same share of the stream)
  void prefetch(int64_t c, int64_t ahead) const {
    _mm_prefetch(reinterpret_cast<const char*>(wh + 32 * c + ahead / 2), _MM_HINT_T0);
  }
  // w: the chunk's 64 qlow bytes -> u of the even (lo) and odd (hi) columns
  void unpack(int64_t c, __m512i w, __m512i* lo, __m512i* hi) const {
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wh + 32 * c));
    const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
    *lo = _mm512_or_si512(_mm512_and_si512(w, nib),
                          _mm512_and_si512(_mm512_slli_epi16(H, 4), top));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w, 4), nib),
                          _mm512_and_si512(H, top));
  }
  // the integer-dot lanes' scales: lanes 2 j and 2 j + 1 <- sub-block j of the chunk
  __m512 lane_scales(int64_t c) const {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i s8 = _mm_shuffle_epi8(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * c)), dup);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                         _mm512_set1_ps(_cvtsh_ss(sd[c / 2])));
  }
  // s[i] <- the scale of the chunk's 16-column vector i (sub-block 8 c + i)
  void vec_scales(int64_t c, float* s) const {
    _mm256_storeu_ps(s, _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * c)))),
        _mm256_set1_ps(_cvtsh_ss(sd[c / 2]))));
  }
};
