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
#include <cmath>
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
// (the portable path, dequant_ops.cpp: c10's conversions, no FMA)
void int8_dequant_rows_portable(const Int8DequantArgs& a, int64_t r0, int64_t r1);

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

// out [N, K] fp32 <- q * s + m of the int4 rows qweight [N, K/2] (fp32 or fp16 scales/mins
// [N, K/G]): the same fp32 values every kernel dequantizes to (fma, one rounding; exact for
// GGUF scales), or those values rounded to bf16 (out bf16). For blocks of rows of a prefill
// GEMM (M > CPU_MAX_ROWS); the portable path of int4_dequantize (ops.cpp) and of
// int4_panel_dequantize (panel_repack.cpp).
template <class ST, class OT>
void dequant4_rows(const uint8_t* q, const ST* s, const ST* m, OT* out, int64_t r0,
                   int64_t r1, int64_t K, int64_t G) {
  const int64_t ng = K / G;
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* qr = q + n * (K / 2);
    OT* o = out + n * K;
    for (int64_t g = 0; g < ng; ++g) {
      const float sc = static_cast<float>(s[n * ng + g]), mn = static_cast<float>(m[n * ng + g]);
      OT table[16];
      for (int v = 0; v < 16; ++v)
        table[v] = static_cast<OT>(std::fma(static_cast<float>(v), sc, mn));
      for (int64_t j = g * G / 2; j < (g + 1) * G / 2; ++j) {
        o[2 * j] = table[qr[j] & 0x0F];
        o[2 * j + 1] = table[qr[j] >> 4];
      }
    }
  }
}

}  // namespace localchat_cpu
