// The vector quantizers' store of one 32-column activation block into qa8.h's int4 or int8
// layout (a8_pos's placement, vectorized). Included inside the anonymous namespace of the
// AVX2 and AVX-512 quantizer TUs (qa8_avx2.cpp, qa8_vnni.cpp), after immintrin.h, so each is
// compiled for its TU's ISA.

// nat: the block's 32 int8 values in column order; qr: row m of xq; bl: the block.
inline void a8_store_block(int8_t* qr, bool int4, int64_t bl, __m256i nat) {
  if (!int4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + bl * 32), nat);
    return;
  }
  // per 128-bit lane: the 8 even bytes, then the 8 odd bytes; then the evens of both lanes,
  // the odds of both lanes
  const __m256i deint = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(nat, deint), 0xD8);
  int8_t* p = qr + (bl / 4) * 128 + (bl % 4) * 16;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(eo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 64), _mm256_extracti128_si256(eo, 1));
}
