// Shared declarations of the CPU float-weight matmul (small M: decode and draft verification)
// for fp32 / bf16 / fp16 weights [N, K] (no torch headers: the ISA translation units include
// only this file and <immintrin.h>).
//
// out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), x widened to fp32 by the launcher, weights
// widened exactly (bf16 by a 16-bit shift, fp16 by F16C / c10::Half) and accumulated in fp32.
// Every (n, m) output has ONE accumulator vector of W lanes (lane j sums k = j, j + W, ... in k
// order), reduced by a fixed tree, then the k tail (K % W columns) added in k order and the
// bias last: an order that depends only on K and the ISA, never on M, the tiling or the
// thread count, so row m of an M-row call equals the 1-row call bit for bit.
#pragma once
#include <cstdint>

namespace localchat_cpu {

enum FmmWeight : int { kFmmF32 = 0, kFmmBF16 = 1, kFmmF16 = 2 };

struct FmmArgs {
  const float* x;     // [M, K] fp32, contiguous
  const void* w;      // [N, ldw] of wtype (row n at w + n * ldw elements); transposed:
                      // [K, ldw] (row k at w + k * ldw, column n at + n), fp32 only
  int wtype;          // FmmWeight
  const float* bias;  // [N] fp32 or nullptr
  float* out;         // [M, N] fp32
  int64_t M, N, K, ldw;
};

// Output columns [n0, n1) for every row.
constexpr int64_t kFmmBlock = 8;
void fmm_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1);
void fmm_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1);
void fmm_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1);

// The transposed layout (fp32 weight_t [K, N], CPU fp32 layers): each output's lane of a
// W-wide column vector sums k = 0, 1, ..., K-1 in order with one fma per k (a * b + c rounded
// once; twice on the scalar path), the bias added last; columns past the last full vector take
// the same scalar arithmetic, so the result depends on nothing but K. Blocks of
// kFmmBlockT columns per task.
constexpr int64_t kFmmBlockT = 128;
void fmmt_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1);
void fmmt_cols_avx2(const FmmArgs& a, int64_t n0, int64_t n1);
void fmmt_cols_avx512(const FmmArgs& a, int64_t n0, int64_t n1);

}  // namespace localchat_cpu
