// Shared declarations of the row dequantization kernels of the prefill GEMMs (no torch
// headers: the ISA translation units dequant_{avx2,avx512}.cpp include only this file and
// <immintrin.h>; the scalar path and the checking launcher are in dequant_ops.cpp).
//
// int8 group-wise layout (localchat.kernels.reference.dequantize_int8): qweight int8 [N, K],
// scales [N, K/G], mins [N, K/G] or null, fp32, or fp16 when `half` (widened exactly);
// w[n, k] = q[n, k] * s[n, k/G] (+ m[n, k/G]), a product then a sum, each rounded once in
// fp32 (never fused into an fma: the reference rounds twice, and GGUF scales make the product
// exact anyway). A bf16 `out` holds those fp32 values rounded to nearest even (a NaN becomes
// the quiet NaN 0x7FC0, as c10::BFloat16 does).
#pragma once
#include <cstdint>

namespace localchat_cpu {

struct Int8DequantArgs {
  const int8_t* qweight;  // [N, K]
  const void* scales;     // [N, ngroups] fp32, or fp16 bits when half
  const void* mins;       // like scales, or nullptr
  bool half;
  void* out;              // [N, K] fp32, or bf16 bits (uint16_t) when bf16
  bool bf16;
  int64_t K, group_size, ngroups;
};

// Rows [r0, r1) of out.
void int8_dequant_rows_avx2(const Int8DequantArgs& a, int64_t r0, int64_t r1);
void int8_dequant_rows_avx512(const Int8DequantArgs& a, int64_t r0, int64_t r1);

// int4 group-wise layout (reference.dequantize_int4): qweight uint8 [N, K / 2] (low nibble =
// even k), scales / mins [N, K / G] fp32 or fp16 (half), G a multiple of 32;
// w = fma(q, s, m) rounded once in fp32 (the launcher's scalar table computes the same), or
// that rounded to bf16 (nearest even, NaN -> 0x7FC0).
struct Int4DequantArgs {
  const uint8_t* qweight;
  const void* scales;
  const void* mins;
  bool half;
  void* out;
  bool bf16;
  int64_t K, group_size, ngroups;
};

void int4_dequant_rows_avx2(const Int4DequantArgs& a, int64_t r0, int64_t r1);
void int4_dequant_rows_avx512(const Int4DequantArgs& a, int64_t r0, int64_t r1);

}  // namespace localchat_cpu
