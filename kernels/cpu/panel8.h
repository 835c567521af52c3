// The int8 "panel" layout (GGUF Q8_0 weights) and its W8A8 kernels (no torch headers).
//
// The row layout (qa8.h: qweight int8 [N, K], fp16 scales [N, K / 32]) keeps each output's
// bytes together, so its VNNI kernel reduces 16 lanes per output and pays the scale multiply
// per output. The panel layout interleaves 16 outputs, as the int4 one does (panel4.h): one
// `vpdpbusd` lane is one output (16 outputs x 4 columns per instruction against 4 activation
// bytes broadcast), and the group scales apply once per 32 columns for 16 outputs at once.
//
// Layout, for a weight [N, K] with N % 16 == 0 and K % 32 == 0 (tile t = outputs 16t..16t+15,
// quad c = columns 4c..4c+3, lane j = output 16t + j):
//   qpanel  int8 [N / 16, K / 4, 64]: byte 4j + b of (t, c) holds q[16t + j, 4c + b];
//   pscales fp16 [N / 16, K / 32, 16]: the scale of (output 16t + j, group g) at [t, g, j].
// The file's bytes, permuted: 34 per 32 weights. Activations: qa8.h's int8 layout (natural
// column order, Q8_0-style per 32 columns: xq, d; ncorr = -128 x each 4 columns' sum).
//
// `vpdpbusd` multiplies unsigned by signed bytes: the kernels feed u = q + 128 (q xor 0x80)
// and start each group's int32 sum at -128 * sum(xq), so it is the exact dot of q and xq
// (|dot| <= 32 * 128 * 127 < 2^24: exact in fp32 too). Each output (m, n) is, for
// g = 0 .. K/32 - 1 in order (fp32 fused multiply-add):
//   acc = fma(float(dot[m, n, g]), scale * d_act[m, g], acc)
// the same operations for every M, thread split and ISA here (batch invariant; the portable
// kernel equals the VNNI one bit for bit).
#pragma once
#include <cstdint>

#include "qa8.h"

namespace localchat_cpu {

// Tiles [t0, t1) of `a` (A8Args with qweight = qpanel, scales = pscales (half); xq / ncorr /
// d the int8-layout activations; group_size 32; no mins) for all a.M rows.
void int8_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1);
void int8_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1);  // panel8_avx2.cpp
void int8_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1);

// -128 * sum of xq over 32-column group g of row m, from the int8 layout's ncorr: exact.
inline int32_t panel8_offset(const A8Args& a, int64_t m, int64_t g) {
  const int32_t* nc = a.ncorr + m * (a.Kp / 4) + 8 * g;
  return nc[0] + nc[1] + nc[2] + nc[3] + nc[4] + nc[5] + nc[6] + nc[7];
}

}  // namespace localchat_cpu
