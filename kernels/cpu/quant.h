// Shared declarations of the CPU quantized-matmul kernels (no torch headers: the ISA
// translation units include only this file and <immintrin.h>).
//
// Layouts (localchat.kernels.reference): int4 qweight uint8 [N, K/2] (low nibble = even k),
// scales/mins fp32 [N, K/G], w = q * s + m; int8 qweight int8 [N, K], scales [N, K/G], mins
// [N, K/G] or null, w = q * s (+ m). Each kernel computes out[m, n] for n in [n0, n1) and every
// m, accumulating in fp32 in an order that depends only on (n, k) and the ISA: row m of an
// M-row call equals the 1-row call bit for bit.
#pragma once
#include <cstdint>

namespace localchat_cpu {

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct QuantArgs {
  const float* x;      // [M, K] fp32; for int4: each 32-column block permuted to
                       // (16 even k, 16 odd k)
  const void* qweight;  // int4: uint8 [N, K/2]; int8: int8 [N, K]
  const float* scales;  // [N, ngroups]
  const float* mins;    // [N, ngroups] or nullptr (int8 only)
  float* out;           // [M, N]
  int64_t M, N, K, group_size, ngroups;
};

void int4_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1);
void int4_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1);
void int4_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_avx2(const QuantArgs& a, int64_t n0, int64_t n1);
void int8_rows_avx512(const QuantArgs& a, int64_t n0, int64_t n1);

}  // namespace localchat_cpu
