// Shared declarations of the CPU quantized-matmul kernels (no torch headers: the ISA
// translation units include only this file and <immintrin.h>).
//
// Layouts (localchat.kernels.reference): int4 qweight uint8 [N, K/2] (low nibble = even k),
// scales/mins [N, K/G], w = q * s + m; int8 qweight int8 [N, K], scales [N, K/G], mins
// [N, K/G] or null, w = q * s (+ m). Scales and mins are fp32, or fp16 when `half` (read in
// place, widened exactly). Each kernel computes out[m, n] for n in [n0, n1) and every m,
// accumulating in fp32 in an order that depends only on (n, k) and the ISA: row m of an M-row
// call equals the 1-row call bit for bit.
//
// int4 activation layout: the launcher stores x block-major, [K/32][M][32] (a block's rows
// side by side, read sequentially by a tile), and permutes each 32-column block so that position
// i = 16 v + j (v = 0, 1; j = 0..15) holds column k = 8 (j % 4) + 4 v + j / 4 of the block.
// Read as four little-endian 32-bit words d = 0..3, a block's 16 weight bytes hold column
// 8 d + p in nibble p (bits 4p..4p+3) of word d, so a 128-bit broadcast of the bytes shifted
// right by 4 (4 v + j / 4) in lane j puts exactly the weight of position i in the lane's low
// nibble (int4_src_col below; the AVX2 path reads the same layout 8 lanes at a time).
#pragma once
#include <cstdint>

namespace localchat_cpu {

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct QuantArgs {
  const float* x;       // [M, K] fp32; int4: [K/32, M, 32], each block permuted (see above)
  const void* qweight;  // int4: uint8 [N, K/2]; int8: int8 [N, K]
  const void* scales;   // [N, ngroups] fp32, or fp16 when half
  const void* mins;     // [N, ngroups] like scales, or nullptr (int8 only)
  bool half;
  float* out;           // [M, N]
  int64_t M, N, K, group_size, ngroups;
  // int4 with two-level scales (kscales.h, GGUF Q4_K): fp16 bits [N, ngroups / 8, 2] = (d,
  // -dmin), scales / mins then uint8 [N, ngroups] (group_size 32); the kernels form the exact
  // fp32 products d * sc and -dmin * m (the folded values).
  const uint16_t* super = nullptr;
};

// Column (within its 32-column block) whose activation sits at permuted position i (0..31).
inline int int4_src_col(int i) {
  const int v = i / 16, j = i % 16;
  return 8 * (j % 4) + 4 * v + j / 4;
}

void int4_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1);
void int4_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1);
void int4_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1);

}  // namespace localchat_cpu
