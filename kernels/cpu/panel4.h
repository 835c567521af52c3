// The int4 "panel" layout (GGUF Q4_K, Q4_0, Q4_1 weights) and its W4A8 kernels (no torch
// headers).
//
// The row layout (qa8.h, kscales.h) keeps each weight row's bytes together, so a VNNI dot
// product of one row covers 4 blocks x 4 lanes and every 128 columns pay a convert, a scale
// multiply and an FMA per output (about 12 cycles a 128-column chunk at one activation row on
// a Zen 4 core, compute bound below the memory bandwidth). The panel layout interleaves 16
// output rows instead, so one `vpdpbusd` lane is one output: 16 outputs x 4 columns per
// instruction against 4 activation bytes broadcast to every lane, and the scales are applied
// once per 32-column group for 16 outputs at once (about 4.5 cycles per 128 columns of one
// output at one row, 2.9 per row at 4 rows). Design after llama.cpp's repacked Q4_K x Q8_K
// GEMV (ggml-cpu's interleaved `block_q4_Kx8`) and oneDNN's VNNI weight panels (own code).
//
// Layout, for a weight [N, K] with N % 16 == 0 (tile t = outputs 16t..16t+15, octet o =
// columns 8o..8o+7, lane j = output 16t + j):
//   qpanel   uint8 [N / 16, K / 8, 64]: byte 4j + b of (t, o) holds w[16t + j, 8o + b] in its
//            low nibble and w[16t + j, 8o + 4 + b] in its high nibble (b = 0..3);
//   two levels (GGUF Q4_K, K % 256 == 0):
//     pscales  uint8 [N / 16, K / 32, 16]: sc of (output 16t + j, group g) at [t, g, j];
//     pmins    uint8 [N / 16, K / 32, 16]: m, likewise;
//     psuper   fp16  [N / 16, K / 256, 2, 16]: (d, -dmin) of (16t + j, super-block s) at
//              [t, s, 0, j] and [t, s, 1, j];
//   one level (GGUF Q4_0 / Q4_1, K % 32 == 0): pscales / pmins fp16 [N / 16, K / 32, 16],
//     the group's scale and min, no psuper.
// The same bytes as the row layout, permuted. Activations: qa8.h's int8 layout (natural
// column order, Q8_0-style per 32 columns: xq, d, xs).
//
// Each output (m, n) is, in this order for g = 0 .. K/32 - 1 (fp32, fused multiply-adds):
//   acc = fma(float(dot[m, n, g]), scale * d_act[m, g], acc)
//   acc = fma(min, xs[m, g], acc)
// with dot the exact int32 dot product of the group's 32 weights and activations, scale =
// float(sc) * float(d) and min = float(m) * float(-dmin) (two levels; both exact) or the fp16
// values; the same operations for every M, every thread split and every ISA here (batch
// invariant; the scalar kernel equals the VNNI one bit for bit).
#pragma once
#include <cstdint>

#include "qa8.h"

namespace localchat_cpu {

// Outputs per tile and the alignment the panel layout needs.
constexpr int64_t kPanelRows = 16;

// Tiles [t0, t1) of `a` (A8Args with qweight / scales / mins / super pointing at the panel
// tensors, super null for one level, xq / d / xs the int8-layout activations, group_size 32) for all a.M rows.
void int4_panel_a8_vnni(const A8Args& a, int64_t t0, int64_t t1);
void int4_panel_a8_avx2(const A8Args& a, int64_t t0, int64_t t1);  // panel4_avx2.cpp
void int4_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1);

}  // namespace localchat_cpu
