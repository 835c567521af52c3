// Portable scalar quantized matmuls (any x86 or other CPU): each output row is dequantized
// once into a buffer, then dotted with every activation row in k order (batch invariant).
#include <vector>

#include "quant.h"

namespace localchat_cpu {

void int4_rows_scalar(const QuantArgs& a, int64_t n0, int64_t n1) {
  const uint8_t* qw = static_cast<const uint8_t*>(a.qweight);
  std::vector<float> w(a.K);
  for (int64_t n = n0; n < n1; ++n) {
    // x is permuted per 32-column block: (16 even k, 16 odd k); lay w out the same way
    for (int64_t kb = 0; kb < a.K; kb += 32) {
      const int64_t g = kb / a.group_size;
      const float s = a.scales[n * a.ngroups + g], m = a.mins[n * a.ngroups + g];
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = qw[n * (a.K / 2) + kb / 2 + j];
        w[kb + j] = static_cast<float>(b & 0x0F) * s + m;
        w[kb + 16 + j] = static_cast<float>(b >> 4) * s + m;
      }
    }
    for (int64_t r = 0; r < a.M; ++r) {
      const float* xr = a.x + r * a.K;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.K; ++k) acc += w[k] * xr[k];
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
      w[k] = a.mins ? q * a.scales[n * a.ngroups + g] + a.mins[n * a.ngroups + g]
                    : q * a.scales[n * a.ngroups + g];
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
