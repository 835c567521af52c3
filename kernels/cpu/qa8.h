// Integer-dot (W4A8 / W8A8) CPU quantized matmuls: shared declarations (no torch headers).
//
// Activations are quantized per row and per 32-column block to int8, Q8_0-style (llama.cpp's
// ggml-quants design: d = amax / 127, q = round-to-nearest-even(x / d) in -127..127), by the
// portable a8_quantize_rows (identical on every ISA, so every path sees the same integers).
// Each weight sub-block (the intersection of a weight group and an activation block: 16 or 32
// columns) gives an exact int32 dot product; the kernels then sum, in fp32 and in an order
// that depends only on (n, k) and the ISA,
//   out[m, n] = sum_j float(dot_j) * (w_scale[n, g(j)] * d[m, b(j)])
//             + sum_g w_min[n, g] * xs[m, g],    xs[m, g] = sum_{j in g} d[m, b(j)] * sum(xq_j)
// so row m of an M-row call equals the 1-row call bit for bit (batch invariance).
//
// Activation layout (xq [M, Kp] int8, Kp = K rounded up to 64, zero padded):
//   int4: each 32-column block as (16 even k, 16 odd k), matching the low / high nibbles of the
//         block's 16 weight bytes; int8: natural order.
#pragma once
#include <cstdint>

namespace localchat_cpu {

struct A8Args {
  const int8_t* xq;      // [M, Kp] quantized activations (layout above)
  const int32_t* ncorr;  // [M, Kp / 4]: -128 * sum of each 4 consecutive xq (int8 only)
  const float* d;        // [M, Kp / 32] activation block scales
  const float* dv;       // [M, Kp / 64, 16]: per 64-column chunk, d of block 0 x 8, block 1 x 8
  const float* xs;       // [M, ngroups] or nullptr (no mins)
  const int32_t* blk2grp;  // [Kp / 32] weight group of each activation block (padded: last)
  const void* qweight;   // int4: uint8 [N, K / 2]; int8: int8 [N, K]
  const void* scales;    // [N, ngroups] fp32 or fp16 (half == true)
  const void* mins;      // [N, ngroups] same dtype as scales, or nullptr
  bool half;
  float* out;            // [M, N] fp32
  int64_t M, N, K, Kp, group_size, ngroups;
};

// Quantize x [M, K] fp32 (K % 32 == 0) into the buffers of `a` (int4 layout when `int4`).
void a8_quantize_rows(const float* x, A8Args& a, int8_t* xq, int32_t* ncorr, float* d,
                      float* xs, bool int4);

void int4_a8_scalar(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_scalar(const A8Args& a, int64_t n0, int64_t n1);
void int4_a8_avx2(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_avx2(const A8Args& a, int64_t n0, int64_t n1);
void int4_a8_vnni(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_vnni(const A8Args& a, int64_t n0, int64_t n1);

}  // namespace localchat_cpu
