// AVX-512 VNNI integer-dot matmul of the int5 layout (qa5.h), through plane_vnni.h. Per
// 128-column chunk two 64-bit masks (the chunk's qhigh bytes) as kmasks: even columns
// u = (qlow & 15) + 16 where the even mask is set, odd columns u = (qlow >> 4) + 16 where the
// odd mask is set (one masked byte add each); offset 16; lane scales d (lanes 4 b .. 4 b + 3 =
// block b of the chunk). Design after llama.cpp's Q5_0 x Q8_0 dot product (high bits as a byte
// mask; the offset as a subtracted activation sum here); own code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qa5.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // reduce4

inline void store(const Int5Args& a, int64_t m, int64_t n, float v) { int5_store(a, m, n, v); }

struct Row {
  typedef Int5Args Args;
  const uint8_t* wh;
  const uint16_t* sd;
  Row(const Int5Args& a, int64_t n) : wh(a.qhigh + n * (a.K / 8)), sd(a.sc + n * (a.K / 32)) {}
  void prefetch(int64_t c) const;
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
  // lane L <- block L / 4 of the chunk
  __m512 scales(int64_t c) const {
    const __m512i rep4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m128 d4 =
        _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sd + 4 * c)));
    return _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(d4));
  }
};

#include "plane_vnni.h"

inline void Row::prefetch(int64_t c) const {
  _mm_prefetch(reinterpret_cast<const char*>(wh + 16 * c + kPrefetch / 4), _MM_HINT_T0);
}

}  // namespace

void int5_a8_vnni(const Int5Args& a, int64_t n0, int64_t n1) { plane_a8_vnni<Row>(a, n0, n1); }

}  // namespace localchat_cpu
