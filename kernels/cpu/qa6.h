// The int6 weight layout (GGUF Q6_K held exactly at the file's 6.5625 bits per weight) and its
// CPU kernels: shared declarations (no torch headers).
//
// Layout, per weight row n (K % 256 == 0; u = q + 32 in 0..63, q the Q6_K value in -32..31):
//   qlow  uint8 [N, K / 2]: the low 4 bits of u, low nibble = even k, high nibble = odd k
//         (the int4 layout's nibble order, so the qa8 int4 activation layout meets it as is:
//         byte i of 128-column chunk c holds columns 128 c + 2 i and 128 c + 2 i + 1).
//   qhigh uint8 [N, K / 4]: the top 2 bits of u, 32 bytes per 128-column chunk c; byte j
//         (0..31): bits 0-1 column 128 c + 2 j, bits 2-3 column 128 c + 2 (j + 32), bits 4-5
//         column 128 c + 2 j + 1, bits 6-7 column 128 c + 2 (j + 32) + 1. So the 64 bytes
//         H = [h, h >> 2] line up with the chunk's 64 qlow bytes: the low-nibble (even) column
//         of byte i gets (H[i] & 3) << 4, the high-nibble (odd) column (H[i] >> 4 & 3) << 4.
//   scales       int8 [N, K / 16]  (Q6_K's sub-block scales sc)
//   super_scales fp16 [N, K / 256] (Q6_K's d)
//   w[n, k] = (u - 32) * (float(d) * float(sc)); the product d * sc is exact in fp32 (11 x 8
//   significant bits), so w is one fp32 rounding of (u - 32) * d * sc (exact unless tiny).
//
// int6_matmul_a8 (the integer-dot decode matmul): activations quantized per row and 32-column
// block to int8 in the int4 layout of qa8.h (a8_quantize_*). Lane L (0..15) of a 128-column
// chunk c is the pair of 4-byte groups {4 L .. 4 L + 3} of the even half and the same of the
// odd half: columns 128 c + 8 L .. 128 c + 8 L + 7, in 16-column sub-block 8 c + L / 2 and
// 32-column activation block 4 c + L / 4. Its exact int32 dot is
//   dot_L = sum u * xq + corr[m, 16 c + L],  corr = -32 * (sum of the lane's 8 xq)
// (llama.cpp's Q6_K design subtracts 32 * sum(xq) the same way), and the kernels sum in fp32
//   out[m, n] = sum_{c, L} float(dot_L) * ((d[c / 2] * sc[8 c + L / 2]) * dact[m, 4 c + L / 4])
// in an order that depends only on (n, k) and the ISA: VNNI 16 lanes across chunks then a
// fixed reduction tree, scalar per 16-column sub-block in k order. AVX2 applies sc in integers
// instead: per 32-column activation block b the exact int32 sum_{L in b} sc * dot_L (at most
// 32 * 32 * 127 * 128 < 2^24), then float(that) * (d * dact[m, b]) into 8 lanes (blocks b % 8)
// and a fixed tree. Row m of an M-row call equals the 1-row call bit for bit.
//
// int6_matmul (exact fp32 activations): each weight dequantized exactly as above into fp32,
// one fma per (n, m, k) into a fixed set of vector accumulators per (n, m) (AVX-512: four of
// 16 lanes, 16-column vector i of a chunk into i % 4; AVX2: two of 8 lanes, 8-column vector j
// of a half chunk into j % 2; scalar: one, k order), then a fixed reduction.
#pragma once
#include <cstdint>
#include <cstring>

#include "half_bits.h"

namespace localchat_cpu {

struct Int6Args {
  const uint8_t* qlow;    // [N, K / 2]
  const uint8_t* qhigh;   // [N, K / 4]
  const int8_t* scales;   // [N, K / 16]
  const uint16_t* ssc;    // [N, K / 256] fp16 bits
  // int6_matmul_a8's activation buffers (qa8.h's int4 layout; K == Kp)
  const int8_t* xq;       // [M, K]
  const int32_t* corr;    // [M, K / 8]: lane L of chunk c at 16 c + L (above; not AVX2)
  const void* avx2_sums;  // AVX2 only, instead of corr: put_avx2_sums' int16 [M, K / 16]
  const float* dact;      // [M, K / 32] activation block scales
  const float* dv;        // [M, K / 32, 4] the same, repeated per lane
  // int6_matmul's activations
  const float* x;         // [M, K] fp32, contiguous
  void* out;              // [M, N] fp32, or bf16 bits when out_bf16
  bool out_bf16;
  int64_t M, N, K;
  // The AVX2 kernel's offset sums, instead of corr: per row, per 256 columns, the 16 int16
  // sums of each 16-column sub-block's xq, position 2 i, 2 i + 1 holding the two sub-blocks
  // of 32-column block B = (0 2 4 6 1 3 5 7)[i] (the kernel's block lanes), so one `madd`
  // with sc in the same order (kSubSumOrder, also its pshufb indices) and a shift by 5 give
  // each block's 32 * sum sc * (sub-block sum). lane[L]: the sum of the 8 xq lane L of chunk c
  // meets; out: [M, K / 16] int16 (in the [M, K / 8] int32 corr buffer).
  alignas(16) static constexpr int8_t kSubSumOrder[16] = {0, 1, 4, 5, 8,  9,  12, 13,
                                                          2, 3, 6, 7, 10, 11, 14, 15};
  static void put_avx2_sums(const int32_t* lane, int64_t m, int64_t c, int64_t K, void* out) {
    int16_t* ss = static_cast<int16_t*>(out) + m * (K / 16) + 16 * (c / 2);
    for (int p = 0; p < 16; ++p) {
      const int s = kSubSumOrder[p] - 8 * static_cast<int>(c % 2);  // sub-block of chunk c
      if (s >= 0 && s < 8) ss[p] = static_cast<int16_t>(lane[2 * s] + lane[2 * s + 1]);
    }
  }
};

// Output columns [n0, n1) for every row.
void int6_a8_scalar(const Int6Args& a, int64_t n0, int64_t n1);
void int6_a8_avx2(const Int6Args& a, int64_t n0, int64_t n1);
void int6_a8_vnni(const Int6Args& a, int64_t n0, int64_t n1);
void int6_f32_scalar(const Int6Args& a, int64_t n0, int64_t n1);
void int6_f32_avx2(const Int6Args& a, int64_t n0, int64_t n1);
void int6_f32_avx512(const Int6Args& a, int64_t n0, int64_t n1);

// Rows [r0, r1) of out [N, K] (fp32, or bf16 bits rounded to nearest even when bf16).
void int6_dequant_rows_scalar(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1);
void int6_dequant_rows_avx2(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1);
void int6_dequant_rows_avx512(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1);


// fp32 -> bf16 bits, round to nearest even (a NaN becomes a quiet NaN).
inline uint16_t int6_bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline void int6_store(const Int6Args& a, int64_t m, int64_t n, float v) {
  if (a.out_bf16) static_cast<uint16_t*>(a.out)[m * a.N + n] = int6_bf16_bits(v);
  else static_cast<float*>(a.out)[m * a.N + n] = v;
}

// u (0..63) of column k of weight row n (portable; the layout above).
inline int int6_u(const Int6Args& a, int64_t n, int64_t k) {
  const uint8_t lo = a.qlow[n * (a.K / 2) + k / 2];
  const int64_t c = k / 128, i = (k % 128) / 2;
  const int odd = static_cast<int>(k & 1);
  const uint8_t h = a.qhigh[n * (a.K / 4) + 32 * c + i % 32];
  const int shift = 2 * static_cast<int>(i / 32) + 4 * odd;
  return ((odd ? lo >> 4 : lo & 0x0F) | (((h >> shift) & 3) << 4));
}

// Q6_K's d * sc of 16-column sub-block g of row n (exact in fp32).
inline float int6_scale(const Int6Args& a, int64_t n, int64_t g) {
  return f16_bits_to_f32(a.ssc[n * (a.K / 256) + g / 16]) *
         static_cast<float>(a.scales[n * (a.K / 16) + g]);
}

}  // namespace localchat_cpu
