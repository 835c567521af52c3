// The bf16-weight tiles of the float-weight matmul with AVX512_BF16's vdpbf16ps (fmm.h "pair
// order"), for bf16 activations on CPUs that have it: each instruction does the two fmas per
// lane that fmm_avx512.cpp does with FMAs under DAZ + FTZ, with the same rounding, so the
// results are the same bits (tested); twice the multiply throughput for verification rows.
// Compiled for that ISA by the pragma below; no torch headers.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

#include "fmm.h"

#define FMM_DOT 1

namespace localchat_cpu {
namespace {

typedef __m512 VF;
typedef __m512i VW;
constexpr int W = 16;
constexpr int kMaxRows = 16;
constexpr int nt_for(int rows) { return rows == 1 ? 8 : rows <= 4 ? 4 : rows <= 8 ? 2 : 1; }
constexpr int nt_pair_for(int rows) { return rows == 1 ? 8 : rows <= 5 ? 4 : rows <= 10 ? 2 : 1; }

inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
#include "avx512_common.h"  // sum16
inline float vsum(VF v) { return sum16(v); }
inline VW wraw(const uint16_t* p) { return _mm512_loadu_si512(p); }
// lane j: acc + w[2j+1] * x[2j+1] + w[2j] * x[2j] (odd first), each add rounded once
inline VF vdot(VF acc, VW w, VW x) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(w), reinterpret_cast<__m512bh&>(x));
}

template <int WT>
VF wload(const void* w, int64_t i);  // (declared for fmm_tiles.h's fp32/fp16 tile, unused)

template <int WT>
inline float wone(const void* w, int64_t i) {
  static_assert(WT == kFmmBF16, "the dot TU serves bf16 weights only");
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

#include "fmm_tiles.h"

}  // namespace

void fmm_cols_dot(const FmmArgs& a, int64_t n0, int64_t n1) { fmm_cols<kFmmBF16>(a, n0, n1); }

}  // namespace localchat_cpu
