// Exact fp32 matmuls over the one-level int4 (GGUF Q4_0 / Q4_1), int5 (Q5_0) and int8 (Q8_0)
// panel layouts (panel4.h, panel5.h, panel8.h), for rows whose activations stay fp32: an fp32
// engine's short prompt steps and logits rows, which the integer-dot kernels (int8
// activations) must not compute (their values would then depend on how a prompt is chunked,
// and SmolLM2's first answer token to "What is the capital of France?" is a 0.085-logit
// near-tie that int8 activations flip).
// Before these kernels such rows took a GEMM over every tile dequantized into a float scratch:
// a 49152 x 576 Q8_0 output layer wrote 113 MB of floats for one logits row.
//
// Every output (m, n) is ONE fp32 accumulator, in lane n of a vector of outputs, updated for
// k = 0, 1, ..., K - 1 in order by one fused multiply-add:
//   acc = fma(w[n, k], x[m, k], acc),  starting from 0
// with w the row layout's dequantized value (int4: fma(float(q), scale, min); int5:
// float(u - 16) * d; int8: float(q) * scale; all exact, as int4_dequantize / int8_dequantize write them). The order
// depends on nothing but K: row m of an M-row call equals the 1-row call bit for bit (batch
// invariant), and the portable kernel (std::fma) equals the AVX2 one bit for bit. A sequential
// sum over K = 8960 fp32 products loses at most ~K ulp in the worst case, ~sqrt(K) typically,
// as a GEMM's blocked sum does. No torch headers.
#pragma once
#include <cstdint>

namespace localchat_cpu {

struct PanelF32Args {
  const float* x;         // [M, K] fp32, contiguous
  const void* qweight;    // int4 / int5: uint8 [N/16, K/8, 64] (panel4.h, panel5.h's plow);
                          // int8: int8 [N/16, K/4, 64]
  const uint16_t* scales;  // fp16 [N/16, K/32, 16]
  const uint16_t* mins;    // fp16 [N/16, K/32, 16] (int4), nullptr (int5, int8)
  const uint8_t* qhigh;    // int5: uint8 [N/16, K/32, 64] (panel5.h's phigh), else nullptr
  float* out;             // [M, N] fp32
  int64_t M, N, K;
};

// Tiles [t0, t1) (outputs 16 t0 .. 16 t1 - 1) for every row.
void int4_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1);
void int4_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1);
void int5_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1);
void int5_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1);
void int8_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1);
void int8_panel_f32_avx2(const PanelF32Args& a, int64_t t0, int64_t t1);

}  // namespace localchat_cpu
