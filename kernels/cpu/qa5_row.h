// AVX-512 (BW) view of one int5 weight row (qa5.h) for the bit-plane templates
// (plane_vnni.h, plane_avx512.h). Per 128-column chunk two 64-bit masks (the chunk's qhigh
// bytes) as kmasks: even columns u = (qlow & 15) + 16 where the even mask is set, odd columns
// u = (qlow >> 4) + 16 where the odd mask is set (one masked byte add each). Scales: Q5_0's d
// per 32-column block. Included inside the anonymous namespace of an AVX-512 TU, after
// immintrin.h, <cstring> and qa5.h.

inline void store(const Int5Args& a, int64_t m, int64_t n, float v) { int5_store(a, m, n, v); }

struct Row {
  typedef Int5Args Args;
  static constexpr int kOffset = 16;  // u - q
  const uint8_t* wh;
  const uint16_t* sd;
  Row(const Int5Args& a, int64_t n) : wh(a.qhigh + n * (a.K / 8)), sd(a.sc + n * (a.K / 32)) {}
  // the chunk's qhigh bytes, `ahead` bytes of qlow ahead (the same share of the stream)
  void prefetch(int64_t c, int64_t ahead) const {
    _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * c + ahead / 4), _MM_HINT_T0);
  }
  // w: the chunk's 64 qlow bytes -> u of the even (lo) and odd (hi) columns
  void unpack(int64_t c, __m512i w, __m512i* lo, __m512i* hi) const {
    const __m512i nib = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    uint64_t me, mo;
    std::memcpy(&me, wh + 16 * c, 8);
    std::memcpy(&mo, wh + 16 * c + 8, 8);
    const __m512i ev = _mm512_and_si512(w, nib);
    *lo = _mm512_mask_add_epi8(ev, _cvtu64_mask64(me), ev, sixteen);
    const __m512i od = _mm512_and_si512(_mm512_srli_epi16(w, 4), nib);
    *hi = _mm512_mask_add_epi8(od, _cvtu64_mask64(mo), od, sixteen);
  }
  // the integer-dot lanes' scales: lanes 4 b .. 4 b + 3 <- block b of the chunk
  __m512 lane_scales(int64_t c) const {
    const __m512i rep4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m128 d4 =
        _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sd + 4 * c)));
    return _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(d4));
  }
  // s[i] <- the scale of the chunk's 16-column vector i (block 4 c + i / 2)
  void vec_scales(int64_t c, float* s) const {
    for (int b = 0; b < 4; ++b) s[2 * b] = s[2 * b + 1] = _cvtsh_ss(sd[4 * c + b]);
  }
};
