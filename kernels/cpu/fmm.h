// Shared declarations of the CPU float-weight matmul (small M: decode and draft verification)
// for fp32 / bf16 / fp16 weights [N, K] (no torch headers: the ISA translation units include
// only this file and <immintrin.h>).
//
// out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), x widened to fp32 by the launcher, weights
// widened exactly (bf16 by a 16-bit shift or mask, fp16 by F16C / c10::Half) and accumulated
// in fp32. Every (n, m) output has ONE accumulator vector of W lanes, reduced by a fixed tree,
// then the k tail added in k order and the bias last: an order that depends only on K and the
// ISA, never on M, the tiling or the thread count, so row m of an M-row call equals the 1-row
// call bit for bit.
//   fp32 / fp16 weights: lane j sums k = j, j + W, ... (one fma each); tail K % W.
//   bf16 weights ("pair order", AVX512_BF16's vdpbf16ps): per block of 2W columns lane j takes
//   k = 2j + 1 then k = 2j (two fmas, each rounded once: a bf16 x bf16 product is exact in
//   fp32); tail K % 2W. For this the launcher stores each full 2W block of x as [W even
//   columns | W odd columns]; the FMAs run under MXCSR DAZ + FTZ (the instruction's denormal
//   handling). With bf16 activations on an AVX512_BF16 CPU one vdpbf16ps can do both fmas
//   (fmm_cols_dot, the op's bf16_dot flag: the same bits; measured no faster here, so off by
//   default).
#pragma once
#include <cstdint>

namespace localchat_cpu {

enum FmmWeight : int { kFmmF32 = 0, kFmmBF16 = 1, kFmmF16 = 2 };

struct FmmArgs {
  const float* x;     // [M, K] fp32, contiguous
  const void* w;      // [N, ldw] of wtype (row n at w + n * ldw elements); transposed:
                      // [K, ldw] (row k at w + k * ldw, column n at + n), fp32 only
  int wtype;          // FmmWeight
  const uint16_t* xbf;  // [M, K] bf16 activations, contiguous (fmm_cols_dot only), or nullptr
  const float* bias;  // [N] fp32 or nullptr
  float* out;         // [M, N] fp32
  int64_t M, N, K, ldw;
};

// Output columns [n0, n1) for every row.
constexpr int64_t kFmmBlock = 8;
void fmm_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1);
void fmm_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1);
void fmm_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1);
// bf16 weights and bf16 activations (a.xbf) on an AVX512_BF16 CPU: the avx512 path's sums,
// with vdpbf16ps.
void fmm_cols_dot(const FmmArgs& a, int64_t n0, int64_t n1);

// The transposed layout (fp32 weight_t [K, N], CPU fp32 layers): each output's lane of a
// W-wide column vector sums k = 0, 1, ..., K-1 in order with one fma per k (a * b + c rounded
// once; twice on the scalar path), the bias added last; columns past the last full vector take
// the same scalar arithmetic, so the result depends on nothing but K. Blocks of
// kFmmBlockT columns per task, K walked in chunks (accumulators parked in out, unchanged).
constexpr int64_t kFmmBlockT = 128;
void fmmt_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1);
void fmmt_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1);
void fmmt_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1);

}  // namespace localchat_cpu
