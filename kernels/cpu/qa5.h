// The int5 weight layout (GGUF Q5_0 held exactly at the file's 5.5 bits per weight) and its
// CPU kernels: shared declarations (no torch headers).
//
// Layout, per weight row n (K % 128 == 0; u = q + 16 in 0..31, q the Q5_0 value in -16..15):
//   qlow   uint8 [N, K / 2]: the low 4 bits of u, low nibble = even k, high nibble = odd k
//          (the int4 layout's nibble order, so the qa8 int4 activation layout meets it as is:
//          byte i of 128-column chunk c holds columns 128 c + 2 i and 128 c + 2 i + 1).
//   qhigh  uint8 [N, K / 8]: the top bit of u, 16 bytes per chunk c: bytes 0..7 a
//          little-endian 64-bit mask whose bit i is the top bit of column 128 c + 2 i (the low
//          nibble of qlow byte i), bytes 8..15 the same for column 128 c + 2 i + 1 (the high
//          nibble). AVX-512 loads each as a kmask over the chunk's 64 qlow bytes; AVX2 expands
//          32 bits at a time to 32 bytes (shuffle + compare).
//   scales fp16 [N, K / 32] (Q5_0's d per 32 columns)
//   w[n, k] = (u - 16) * float(d), exact in fp32 (5 x 11 significant bits).
//
// int5_matmul_a8 (the integer-dot decode matmul): activations quantized per row and 32-column
// block to int8 in the int4 layout of qa8.h (a8_quantize_*). Lane L (0..15) of a 128-column
// chunk c is the pair of 4-byte groups {4 L .. 4 L + 3} of the even half and the same of the
// odd half: columns 128 c + 8 L .. 128 c + 8 L + 7, in 32-column block 4 c + L / 4 (of the
// weights and of the activations alike). Its exact int32 dot is
//   dot_L = sum u * xq + corr[m, 16 c + L],  corr = -16 * (sum of the lane's 8 xq)
// (llama.cpp's Q5_0 x Q8_0 design subtracts the offset from the weights instead; here it is
// folded into the lane's start, like int6's -32), and the kernels sum in fp32
//   out[m, n] = sum_{c, L} float(dot_L) * (d[4 c + L / 4] * dact[m, 4 c + L / 4])
// in an order that depends only on (n, k) and the ISA: VNNI 16 lanes across chunks then a
// fixed reduction tree, AVX2 8 lanes (two 32-column blocks at a time) then a fixed tree, scalar
// per 32-column block in k order. Row m of an M-row call equals the 1-row call bit for bit.
//
// int5_matmul (exact fp32 activations): each weight dequantized exactly into fp32, one fma per
// (n, m, k) into a fixed set of vector accumulators per (n, m) (AVX-512: four of 16 lanes,
// 16-column vector i of a chunk into i % 4; AVX2: two of 8 lanes, 8-column vector j of a half
// chunk into j % 2; scalar: one, k order), then a fixed reduction.
#pragma once
#include <cstdint>
#include <cstring>

#include "half_bits.h"

namespace localchat_cpu {

struct Int5Args {
  const uint8_t* qlow;    // [N, K / 2]
  const uint8_t* qhigh;   // [N, K / 8]
  const uint16_t* sc;     // [N, K / 32] fp16 bits
  // int5_matmul_a8's activation buffers (qa8.h's int4 layout; K == Kp)
  const int8_t* xq;       // [M, K]
  const int32_t* corr;    // [M, K / 8]: lane L of chunk c at 16 c + L (above; not AVX2)
  const void* avx2_sums;  // AVX2 only, instead of corr: put_avx2_sums' int32 [M, K / 8]
  const float* dact;      // [M, K / 32] activation block scales
  const float* dv;        // [M, K / 32, 4] the same, repeated per lane
  // int5_matmul's activations
  const float* x;         // [M, K] fp32, contiguous
  void* out;              // [M, N] fp32, or bf16 bits when out_bf16
  bool out_bf16;
  int64_t M, N, K;
  // The AVX2 kernel's offset sums, instead of corr: per row, per 256 columns (a last 128
  // alone: its blocks 4..7 zero), 8 int32 = -16 * (the sum of each 32-column block's xq) in
  // the kernel's block-lane order 0 2 4 6 1 3 5 7, added once per span. lane[L]: the sum of
  // the 8 xq lane L of chunk c meets; out: [M, K / 8] int32 (the corr buffer).
  static void put_avx2_sums(const int32_t* lane, int64_t m, int64_t c, int64_t K, void* out) {
    int32_t* bs = static_cast<int32_t*>(out) + m * (K / 8) + 8 * (c / 2);
    if (c % 2 == 0)  // the span's second chunk, if any, overwrites these
      for (int j = 4; j < 8; ++j) bs[j / 2 + 4 * (j % 2)] = 0;
    for (int b = 0; b < 4; ++b) {
      const int j = 4 * static_cast<int>(c % 2) + b;  // block of the span
      bs[j / 2 + 4 * (j % 2)] =
          -16 * (lane[4 * b] + lane[4 * b + 1] + lane[4 * b + 2] + lane[4 * b + 3]);
    }
  }
};

// Output columns [n0, n1) for every row.
void int5_a8_scalar(const Int5Args& a, int64_t n0, int64_t n1);
void int5_a8_avx2(const Int5Args& a, int64_t n0, int64_t n1);
void int5_a8_vnni(const Int5Args& a, int64_t n0, int64_t n1);
void int5_f32_scalar(const Int5Args& a, int64_t n0, int64_t n1);
void int5_f32_avx2(const Int5Args& a, int64_t n0, int64_t n1);
void int5_f32_avx512(const Int5Args& a, int64_t n0, int64_t n1);

// Rows [r0, r1) of out [N, K] (fp32, or bf16 bits rounded to nearest even when bf16).
void int5_dequant_rows_scalar(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1);
void int5_dequant_rows_avx2(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1);
void int5_dequant_rows_avx512(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1);

// fp32 -> bf16 bits, round to nearest even (a NaN becomes a quiet NaN).
inline uint16_t int5_bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline void int5_store(const Int5Args& a, int64_t m, int64_t n, float v) {
  if (a.out_bf16) static_cast<uint16_t*>(a.out)[m * a.N + n] = int5_bf16_bits(v);
  else static_cast<float*>(a.out)[m * a.N + n] = v;
}

// u (0..31) of column k of weight row n (portable; the layout above).
inline int int5_u(const Int5Args& a, int64_t n, int64_t k) {
  const uint8_t lo = a.qlow[n * (a.K / 2) + k / 2];
  const int64_t c = k / 128, i = (k % 128) / 2;
  const int odd = static_cast<int>(k & 1);
  const uint8_t h = a.qhigh[n * (a.K / 8) + 16 * c + 8 * odd + i / 8];
  return ((odd ? lo >> 4 : lo & 0x0F) | (((h >> (i % 8)) & 1) << 4));
}

// Q5_0's d of 32-column block b of row n.
inline float int5_scale(const Int5Args& a, int64_t n, int64_t b) {
  return f16_bits_to_f32(a.sc[n * (a.K / 32) + b]);
}

}  // namespace localchat_cpu
