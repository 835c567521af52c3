// Portable scalar integer-dot matmuls (qa8.h): per sub-block an exact int32 dot, summed in k
// order in fp32, then the min term in group order.
#include <cstring>

#include "half_bits.h"
#include "qa8.h"

namespace localchat_cpu {
namespace {

inline float f16_to_f32(uint16_t h) { return f16_bits_to_f32(h); }

inline float ld(const A8Args& a, const void* p, int64_t i) {
  return a.half ? f16_to_f32(static_cast<const uint16_t*>(p)[i])
                : static_cast<const float*>(p)[i];
}

// Scale (which = 0) or min (1) of group g of row n: read, or with two-level scales (qa8.h's
// `super`) the exact product of the uint8 sc / m and the super-block's d / -dmin.
inline float group_value(const A8Args& a, int which, int64_t n, int64_t g) {
  const void* p = which ? a.mins : a.scales;
  const int64_t ng = a.ngroups;
  if (!a.super) return ld(a, p, n * ng + g);
  return f16_to_f32(a.super[(n * (ng / 8) + g / 8) * 2 + which]) *
         static_cast<float>(static_cast<const uint8_t*>(p)[n * ng + g]);
}

template <bool INT4>
void rows(const A8Args& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups, sub = a.group_size == 16 ? 16 : 32;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* xq = a.xq + m * Kp;
      const float* d = a.d + m * (Kp / 32);
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += sub) {
        int32_t dot = 0;
        if (INT4) {  // sub == 32; even / odd columns at their chunk halves (qa8.h)
          const uint8_t* w = static_cast<const uint8_t*>(a.qweight) + n * (K / 2) + k0 / 2;
          const int8_t* xe = xq + (k0 / 128) * 128 + ((k0 / 32) % 4) * 16;
          for (int j = 0; j < 16; ++j)
            dot += (w[j] & 0x0F) * xe[j] + (w[j] >> 4) * xe[64 + j];
        } else {
          const int8_t* w = static_cast<const int8_t*>(a.qweight) + n * K + k0;
          for (int j = 0; j < sub; ++j) dot += w[j] * xq[k0 + j];
        }
        const float sd = group_value(a, 0, n, k0 / a.group_size) * d[k0 / 32];
        acc += static_cast<float>(dot) * sd;
      }
      float accm = 0.0f;
      if (a.mins)
        for (int64_t g = 0; g < ng; ++g) accm += group_value(a, 1, n, g) * a.xs[m * ng + g];
      a8_store(a, m, n, acc + accm);
    }
  }
}

}  // namespace

void int4_a8_scalar(const A8Args& a, int64_t n0, int64_t n1) { rows<true>(a, n0, n1); }
void int8_a8_scalar(const A8Args& a, int64_t n0, int64_t n1) { rows<false>(a, n0, n1); }

}  // namespace localchat_cpu
