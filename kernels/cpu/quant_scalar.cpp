// Portable scalar quantized matmuls (any x86 or other CPU): each output row is dequantized
// once into a buffer, then dotted with every activation row in k order (batch invariant).
#include <cstring>
#include <vector>

#include "half_bits.h"
#include "quant.h"

namespace localchat_cpu {
namespace {

float half_to_float(uint16_t h) { return f16_bits_to_f32(h); }

float ldsc(const QuantArgs& a, const void* p, int64_t i) {
  return a.half ? half_to_float(static_cast<const uint16_t*>(p)[i])
                : static_cast<const float*>(p)[i];
}

}  // namespace

void int4_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1) {
  const uint8_t* qw = static_cast<const uint8_t*>(a.qweight);
  std::vector<float> w(a.K);
  int src[32];
  for (int i = 0; i < 32; ++i) src[i] = int4_src_col(i);
  for (int64_t n = n0; n < n1; ++n) {
    // x is permuted per 32-column block (quant.h); lay w out the same way
    for (int64_t kb = 0; kb < a.K; kb += 32) {
      const int64_t g = kb / a.group_size;
      float s, m;
      if (a.super) {  // two-level scales (quant.h): exact products of the two levels
        const uint16_t* sup = a.super + (n * (a.ngroups / 8) + g / 8) * 2;
        s = half_to_float(sup[0]) *
            static_cast<float>(static_cast<const uint8_t*>(a.scales)[n * a.ngroups + g]);
        m = half_to_float(sup[1]) *
            static_cast<float>(static_cast<const uint8_t*>(a.mins)[n * a.ngroups + g]);
      } else {
        s = ldsc(a, a.scales, n * a.ngroups + g);
        m = ldsc(a, a.mins, n * a.ngroups + g);
      }
      const uint8_t* b = qw + n * (a.K / 2) + kb / 2;
      for (int i = 0; i < 32; ++i) {
        const int c = src[i];
        const int q = (b[c / 2] >> (4 * (c % 2))) & 0x0F;
        w[kb + i] = static_cast<float>(q) * s + m;
      }
    }
    for (int64_t r = 0; r < a.M; ++r) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < a.K; kb += 32) {
        const float* xr = a.x + (kb / 32 * a.M + r) * 32;  // [K / 32][M][32]
        for (int i = 0; i < 32; ++i) acc += w[kb + i] * xr[i];
      }
      a.out[r * a.N + n] = acc;
    }
  }
}

void int8_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1) {
  const int8_t* qw = static_cast<const int8_t*>(a.qweight);
  std::vector<float> w(a.K);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < a.K; ++k) {
      const int64_t g = k / a.group_size;
      const float q = static_cast<float>(qw[n * a.K + k]);
      const float s = ldsc(a, a.scales, n * a.ngroups + g);
      w[k] = a.mins ? q * s + ldsc(a, a.mins, n * a.ngroups + g) : q * s;
    }
    for (int64_t r = 0; r < a.M; ++r) {
      const float* xr = a.x + r * a.K;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.K; ++k) acc += w[k] * xr[k];
      a.out[r * a.N + n] = acc;
    }
  }
}

}  // namespace localchat_cpu
