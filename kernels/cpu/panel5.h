// The int5 "panel" layout (GGUF Q5_0 weights) and its W5A8 kernels (no torch headers).
//
// The int5 row layout (qa5.h) keeps each weight row's bytes together; its kernels dot one
// row against the activations in lanes of 8 columns, then scale and reduce every lane of every
// output, so several activation rows cost nearly as many of those steps again (Zen 3, 2
// threads, a 4864 x 896 layer: 0.18 ms at one row, 0.63 ms at 8). The panel layout
// interleaves 16 outputs as panel4.h does for int4: one 32-bit lane is one output, the top bit
// of u sits in a 64-byte plane of its own per 32 columns, and Q5_0's scale applies once per
// group for 16 outputs at once. Design after llama.cpp's interleaved Q4_0 GEMV and its
// Q5_0 x Q8_0 dot (the top bit ORed into the nibbles; the -16 here an activation sum, as the
// row layout folds it); own code.
//
// Layout, for a weight [N, K] with N % 16 == 0 and K % 32 == 0 (the kernels' need; the
// conversions from and back to the row layout need its K % 128 == 0) (tile t = outputs
// 16t..16t+15, lane j = output 16t + j, u = q + 16 in 0..31, q the Q5_0 value):
//   plow    uint8 [N / 16, K / 8, 64]: byte 4j + b of (t, octet o) holds the low 4 bits of
//           u[16t + j, 8o + b] (low nibble) and of u[16t + j, 8o + 4 + b] (high nibble): the
//           int4 panel's qpanel (panel4.h) of the row layout's qlow;
//   phigh   uint8 [N / 16, K / 32, 64]: bit v (0..7) of byte 4j + b of (t, group g) is the top
//           bit of u[16t + j, 32g + 4v + b], the column nibble v % 2 of octet 4g + v / 2
//           holds; so "u vector" v of a group (one nibble of every lane of one octet) takes
//           its top bits from bit v of each byte, one shift and one mask;
//   pscales fp16 [N / 16, K / 32, 16]: d of (16t + j, group g) at [t, g, j].
// The row layout's bytes, permuted: 22 per 32 weights, as in the file.
//
// Activations: qa8.h's int8 layout (natural column order, int8 per 32-column block with scale
// d_act). Each output (m, n) is, for g = 0 .. K/32 - 1 in order (fp32 fused multiply-add):
//   idot = sum_{k in g} u * xq - 16 * sum_{k in g} xq      (exact int32, |idot| < 2^18)
//   acc  = fma(float(idot), d * d_act[m, g], acc)
// the same operations for every M, thread split and ISA (the portable kernel equals the AVX2
// one bit for bit). The ncorr of the launcher's quantizer (-128 times each 4 columns' sum)
// gives the portable kernel -16 * sum(xq) as an eighth of a group's eight.
#pragma once
#include <cstdint>

#include "qa8.h"

namespace localchat_cpu {

// Tiles [t0, t1) of `a` (A8Args with qweight = plow, qhigh = phigh, scales = pscales (fp16);
// xq / ncorr / d the int8-layout activations; group_size 32; no mins) for all a.M rows. The
// AVX2 kernel sums the activations itself (no ncorr needed); CPUs with AVX-512 run it too.
void int5_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1);  // panel5_avx2.cpp
void int5_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1);

// -16 * sum of xq over 32-column group g of row m, from the int8 layout's ncorr: exact.
inline int32_t panel5_offset(const A8Args& a, int64_t m, int64_t g) {
  const int32_t* nc = a.ncorr + m * (a.Kp / 4) + 8 * g;
  int32_t s = 0;
  for (int i = 0; i < 8; ++i) s += nc[i];
  return s / 8;
}

}  // namespace localchat_cpu
