// The int6 "panel" layout (GGUF Q6_K weights) and its W6A8 kernels (no torch headers).
//
// The int6 row layout (qa6.h) keeps each weight row's bytes together; its VNNI kernel dots one
// row against the activations, 16 lanes of 8 columns, then scales every lane, so each 128
// columns of each output pay converts, scale multiplies and a horizontal reduction (the int4
// row layout measured compute bound at one row for that reason, panel4.h). The panel layout
// interleaves 16 outputs as panel4.h does for int4: one `vpdpbusd` lane is one output, the
// two top bits of u sit in their own 64-byte plane beside the nibbles, and the sub-block
// scales apply in integers, 16 outputs at once. Design after llama.cpp's interleaved K-quant
// GEMVs (ggml-cpu's repacked blocks) and its Q6_K x Q8 dot (the -32 offset as a subtracted
// activation sum); own code.
//
// Layout, for a weight [N, K] with N % 16 == 0 and K % 256 == 0 (tile t = outputs 16t..16t+15,
// lane j = output 16t + j, u = q + 32 in 0..63, q the Q6_K value):
//   plow    uint8 [N / 16, K / 8, 64]: byte 4j + b of (t, octet o) holds the low 4 bits of
//           u[16t + j, 8o + b] (low nibble) and of u[16t + j, 8o + 4 + b] (high nibble): the
//           int4 panel's qpanel (panel4.h) of the row layout's qlow;
//   phigh   uint8 [N / 16, K / 16, 64]: byte 4j + b of (t, 16-column sub-block s) holds the
//           top 2 bits of u[16t + j, c] for c = 16s + b (bits 0-1), 16s + 4 + b (bits 2-3),
//           16s + 8 + b (bits 4-5), 16s + 12 + b (bits 6-7);
//   pscales int8 [N / 16, K / 16, 16]: sc of (16t + j, sub-block s) at [t, s, j];
//   psuper  fp16 [N / 16, K / 256, 16]: d of (16t + j, super-block) at [t, sb, j].
// The row layout's bytes, permuted: 210 per 256 weights, as in the file.
//
// Activations: qa8.h's int8 layout (natural column order, int8 per 32-column block with scale
// d_act; the launcher's ncorr gives -128 times each 4 columns' sum, so a sub-block's
// -32 * sum(xq) is a quarter of four of them). Each output (m, n) is, for g = 0 .. K/32 - 1 in
// order (fp32 fused multiply-add):
//   idot = sum over the group's two sub-blocks s of sc[s] * (sum_{k in s} u * xq - 32 sum xq)
//          (exact int32: |idot| <= 2 * 128 * 16 * 32 * 127 < 2^24, so exact in fp32 too)
//   acc  = fma(float(idot), d * d_act[m, g], acc)
// the same operations for every M, thread split and ISA (the portable kernel equals the VNNI
// one bit for bit).
#pragma once
#include <cstdint>

#include "qa8.h"

namespace localchat_cpu {

// Tiles [t0, t1) of `a` (A8Args with qweight = plow, qhigh = phigh, scales = pscales, super =
// psuper; xq / ncorr / d the int8-layout activations; group_size 32; no mins) for all a.M rows.
void int6_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1);
void int6_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1);  // panel6_avx2.cpp
void int6_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1);

// -32 * sum of xq over 16-column sub-block s of row m, from the int8 layout's ncorr (-128 *
// each 4 columns' sum): exact.
inline int32_t panel6_offset(const A8Args& a, int64_t m, int64_t s) {
  const int32_t* nc = a.ncorr + m * (a.Kp / 4) + 4 * s;
  return (nc[0] + nc[1] + nc[2] + nc[3]) / 4;
}

}  // namespace localchat_cpu
