// Portable kernel of the int4 panel layout (panel4.h): the VNNI kernel's operations in the
// same order, one output at a time (bit-equal to it; the oracle of the C++ tests and the
// path of CPUs without VNNI when a panel weight is given).
#include <cmath>
#include <cstring>

#include "half_bits.h"
#include "panel4.h"

namespace localchat_cpu {

void int4_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t K = a.K, Kp = a.Kp, ng = a.ngroups;
  const uint8_t* qp = static_cast<const uint8_t*>(a.qweight);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* x = a.xq + m * Kp;
      for (int j = 0; j < 16; ++j) {
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; ++g) {
          int32_t dot = 0;
          for (int o = 0; o < 4; ++o) {
            const int64_t oct = g * 4 + o;
            const uint8_t* w = qp + (t * (K / 8) + oct) * 64 + 4 * j;
            for (int b = 0; b < 4; ++b) {
              dot += (w[b] & 0x0F) * x[8 * oct + b];
              dot += (w[b] >> 4) * x[8 * oct + 4 + b];
            }
          }
          const int64_t at = (t * ng + g) * 16 + j;
          float s, mv;
          if (a.super) {  // two-level: uint8 sc / m times the super-block's d / -dmin
            const uint16_t* sp = a.super + ((t * (ng / 8) + g / 8) * 2) * 16;
            s = static_cast<float>(static_cast<const uint8_t*>(a.scales)[at]) *
                f16_bits_to_f32(sp[j]);
            mv = static_cast<float>(static_cast<const uint8_t*>(a.mins)[at]) *
                 f16_bits_to_f32(sp[16 + j]);
          } else {  // fp16 scales and mins
            s = f16_bits_to_f32(static_cast<const uint16_t*>(a.scales)[at]);
            mv = f16_bits_to_f32(static_cast<const uint16_t*>(a.mins)[at]);
          }
          acc = std::fma(static_cast<float>(dot), s * a.d[m * (Kp / 32) + g], acc);
          acc = std::fma(mv, a.xs[m * ng + g], acc);
        }
        a8_store(a, m, t * 16 + j, acc);
      }
    }
  }
}

}  // namespace localchat_cpu
