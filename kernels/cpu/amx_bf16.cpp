// AMX bf16 tile kernel of the prefill GEMM (contract: amx.h). Per strip pair (32 dequantized
// weight rows) and pair of activation row tiles, 2 x 2 blocking: tmm0 / tmm1 the A operands
// (the two 16-row halves x 32 k), tmm2 / tmm3 the B operands (32 k x 16 activation rows of
// each tile), tmm4..tmm7 the four C accumulators, so consecutive products never wait on one
// another's sums (with one strip and one tile per pass, the products of one accumulator
// serialized and the kernel ran at 1/3 the speed). An odd tile left over takes a pass of its
// own with two accumulators; more tiles take more passes over the same strip (in cache).
// Only the kernel is compiled for AMX; the CPU check (amx_bf16_ready) is in strip_gemm.cpp,
// compiled for the baseline ISA, so nothing here runs before the CPU is known to have AMX.
#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 11)
#define LOCALCHAT_AMX 1
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
#include <immintrin.h>
#endif

#include <cstring>

#include "amx.h"
#include "amx_tiles.h"

namespace localchat_cpu {

#ifdef LOCALCHAT_AMX
namespace {

// One pass over the whole strip pair (weight rows n0 .. n0 + 31: A tiles tmm0 / tmm1) for
// activation row tiles t0 (B tmm2, C tmm4 / tmm6) and, when T == 2, t0 + 1 (B tmm3, C tmm5 /
// tmm7): 2 x T independent accumulators, so consecutive products never wait on one
// another's sums; then the C tiles stored to cbuf [2][T][16][16] (strip, tile, weight row,
// activation row).
template <int T>
void pass(const uint16_t* strip, const AmxGemmArgs& a, int64_t mt, int64_t t0, float* cbuf) {
  const int64_t nks = a.K / 32, astride = a.K * 2;
  const uint16_t* strip1 = strip + 16 * a.K;
  _tile_zero(4);
  _tile_zero(6);
  if (T > 1) { _tile_zero(5); _tile_zero(7); }
  for (int64_t s = 0; s < nks; ++s) {
    const uint32_t* b = a.xp + (s * mt + t0) * 256;
    _tile_loadd(2, b, 64);
    _tile_loadd(0, strip + 32 * s, astride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(1, strip1 + 32 * s, astride);
    _tile_dpbf16ps(6, 1, 2);
    if (T > 1) {
      _tile_loadd(3, b + 256, 64);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  _tile_stored(4, cbuf, 64);
  _tile_stored(6, cbuf + 512, 64);
  if (T > 1) { _tile_stored(5, cbuf + 256, 64); _tile_stored(7, cbuf + 768, 64); }
}

inline uint16_t to_bf16(float v) {  // round to nearest even; NaN -> quiet NaN
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// cbuf [2][2][16][16] -> out[16 (t0 + j) + i, n0 + 16 h + r] for strip h, tile j < nt.
void store(const AmxGemmArgs& a, const float* cbuf, int nt, int64_t t0, int64_t n0) {
  for (int h = 0; h < 2; ++h) {
    const int64_t nb = n0 + 16 * h, rows = a.N - nb < 16 ? a.N - nb : 16;
    for (int j = 0; j < nt; ++j) {
      const int64_t m0 = 16 * (t0 + j);
      const int64_t mm = a.M - m0 < 16 ? a.M - m0 : 16;
      const float* c = cbuf + 512 * h + 256 * j;
      for (int64_t i = 0; i < mm; ++i) {
        if (a.out_bf16) {
          uint16_t* o = static_cast<uint16_t*>(a.out) + (m0 + i) * a.N + nb;
          for (int64_t r = 0; r < rows; ++r) o[r] = to_bf16(c[16 * r + i]);
        } else {
          float* o = static_cast<float*>(a.out) + (m0 + i) * a.N + nb;
          for (int64_t r = 0; r < rows; ++r) o[r] = c[16 * r + i];
        }
      }
    }
  }
}

}  // namespace

bool amx_bf16_built() { return true; }

namespace {

// A scale or min: fp32, or fp16 bits when half (widened exactly).
inline float ld_scale(const void* p, int64_t i, bool half) {
  return half ? _cvtsh_ss(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// One group: the 32 weights of 16 bytes at qg -> o, scale s, min m.
inline void int4_group_bf16(const uint8_t* qg, float s, float m, uint16_t* o) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 t = _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(m));
  // the 16 values twice (words 0-15 and 16-31): vpermw reads only an index's low 5 bits, so
  // byte j itself indexes its low nibble's value whatever its bit 4
  const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(t, t));
  // dword j = byte j (word 0: the low nibble + bits vpermw ignores) | byte j << 12 (word 1:
  // the high nibble): the 32 words in column order
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qg)));
  const __m512i idx = _mm512_or_si512(d, _mm512_slli_epi32(d, 12));
  _mm512_storeu_si512(o, _mm512_permutexvar_epi16(idx, table));
}

}  // namespace

void int4_rows_bf16_amx(const uint8_t* q, const void* s, const void* m, bool half, int64_t K,
                        int64_t rows, uint16_t* out) {
  const int64_t ng = K / 32;
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t g = 0; g < ng; ++g)
      int4_group_bf16(q + n * (K / 2) + 16 * g, ld_scale(s, n * ng + g, half),
                      ld_scale(m, n * ng + g, half), out + n * K + 32 * g);
}

void int4k_rows_bf16_amx(const uint8_t* q, const uint8_t* sc, const uint8_t* mn,
                         const uint16_t* sup, int64_t K, int64_t rows, uint16_t* out) {
  const int64_t ng = K / 32, nsb = ng / 8;
  float s[kAmxMaxGroups], m[kAmxMaxGroups];  // one row's folded scales and mins
  for (int64_t n = 0; n < rows; ++n) {
    // 8 groups (one super-block) per step: widened bytes times the broadcast fp16 d / -dmin
    for (int64_t b = 0; b < nsb; ++b) {
      const uint16_t* sp = sup + (n * nsb + b) * 2;
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(sp[0]));
      const __m256 neg_dmin = _mm256_set1_ps(_cvtsh_ss(sp[1]));
      const int64_t g = n * ng + 8 * b;
      const __m256 scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + g))));
      const __m256 mnv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + g))));
      _mm256_storeu_ps(s + 8 * b, _mm256_mul_ps(d, scv));
      _mm256_storeu_ps(m + 8 * b, _mm256_mul_ps(neg_dmin, mnv));
    }
    for (int64_t g = 0; g < ng; ++g)
      int4_group_bf16(q + n * (K / 2) + 16 * g, s[g], m[g], out + n * K + 32 * g);
  }
}

void int8_rows_bf16_amx(const int8_t* q, const void* scales, const void* mins, bool half,
                        int64_t K, int64_t G, int64_t rows, uint16_t* out) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const int64_t ng = K / G;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < K; k += 32) {  // two 16-column halves, each inside one group
      const int64_t g0 = n * ng + k / G, g1 = n * ng + (k + 16) / G;
      const int8_t* qk = q + n * K + k;
      __m512 w0 = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qk))));
      __m512 w1 = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qk + 16))));
      // product then sum, each rounded once (explicit rounding: never contracted to an fma)
      w0 = _mm512_mul_round_ps(w0, _mm512_set1_ps(ld_scale(scales, g0, half)), kRound);
      w1 = _mm512_mul_round_ps(w1, _mm512_set1_ps(ld_scale(scales, g1, half)), kRound);
      if (mins) {
        w0 = _mm512_add_round_ps(w0, _mm512_set1_ps(ld_scale(mins, g0, half)), kRound);
        w1 = _mm512_add_round_ps(w1, _mm512_set1_ps(ld_scale(mins, g1, half)), kRound);
      }
      _mm512_storeu_si512(out + n * K + k,
                          reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1, w0)));
    }
  }
}

void amx_bf16_strips(const AmxGemmArgs& a, int64_t s0, int64_t s1, uint16_t* strip) {
  TileConfig cfg = tile_config();
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t mt = (a.M + 15) / 16;
  alignas(64) float cbuf[4 * 256];
  for (int64_t s = s0; s < s1; ++s) {  // strip pair s: weight rows 32 s .. 32 s + 31
    const int64_t n0 = 32 * s, rows = a.N - n0 < 32 ? a.N - n0 : 32;
    if (rows < 32) std::memset(strip, 0, sizeof(uint16_t) * 32 * a.K);
    a.fill(a.fill_ctx, n0, n0 + rows, strip);
    for (int64_t t0 = 0; t0 < mt; t0 += 2) {
      if (mt - t0 >= 2) {
        pass<2>(strip, a, mt, t0, cbuf);
        store(a, cbuf, 2, t0, n0);
      } else {
        pass<1>(strip, a, mt, t0, cbuf);
        store(a, cbuf, 1, t0, n0);
      }
    }
  }
  _tile_release();
}

#else  // no AMX in this compiler or architecture: amx_bf16_ready() is false, never called

bool amx_bf16_built() { return false; }

void int4_rows_bf16_amx(const uint8_t*, const void*, const void*, bool, int64_t, int64_t,
                        uint16_t*) {}

void int4k_rows_bf16_amx(const uint8_t*, const uint8_t*, const uint8_t*, const uint16_t*,
                         int64_t, int64_t, uint16_t*) {}

void int8_rows_bf16_amx(const int8_t*, const void*, const void*, bool, int64_t, int64_t,
                        int64_t, uint16_t*) {}

void amx_bf16_strips(const AmxGemmArgs&, int64_t, int64_t, uint16_t*) {}

#endif

}  // namespace localchat_cpu
