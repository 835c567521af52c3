// Portable kernel of the int6 panel layout (panel6.h): the VNNI kernel's operations in the
// same order, one output at a time (bit-equal to it; the oracle of the C++ tests and the path
// of CPUs without VNNI when a panel weight is given).
#include <cmath>

#include "half_bits.h"
#include "panel6.h"

namespace localchat_cpu {

void int6_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t K = a.K, Kp = a.Kp, ns = K / 16;
  const uint8_t* pl = static_cast<const uint8_t*>(a.qweight);
  const uint8_t* ph = static_cast<const uint8_t*>(a.qhigh);
  const int8_t* ps = static_cast<const int8_t*>(a.scales);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* x = a.xq + m * Kp;
      for (int j = 0; j < 16; ++j) {
        float acc = 0.0f;
        for (int64_t g = 0; g < K / 32; ++g) {
          int32_t isum = 0;
          for (int64_t s = 2 * g; s < 2 * g + 2; ++s) {
            const uint8_t* hb = ph + (t * ns + s) * 64 + 4 * j;
            int32_t dot = panel6_offset(a, m, s);
            for (int oo = 0; oo < 2; ++oo) {
              const uint8_t* w = pl + (t * (K / 8) + 2 * s + oo) * 64 + 4 * j;
              for (int b = 0; b < 4; ++b) {
                const int lo = (w[b] & 0x0F) | (((hb[b] >> (4 * oo)) & 3) << 4);
                const int hi = (w[b] >> 4) | (((hb[b] >> (4 * oo + 2)) & 3) << 4);
                dot += lo * x[16 * s + 8 * oo + b] + hi * x[16 * s + 8 * oo + 4 + b];
              }
            }
            isum += dot * ps[(t * ns + s) * 16 + j];
          }
          const float d = f16_bits_to_f32(a.super[(t * (K / 256) + g / 8) * 16 + j]);
          acc = std::fma(static_cast<float>(isum), d * a.d[m * (Kp / 32) + g], acc);
        }
        a8_store(a, m, t * 16 + j, acc);
      }
    }
  }
}

}  // namespace localchat_cpu
