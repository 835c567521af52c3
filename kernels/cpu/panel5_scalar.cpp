// Portable kernel of the int5 panel layout (panel5.h): the AVX2 kernel's operations in the
// same order, one output at a time (bit-equal to it; the oracle of the C++ tests and the path
// of CPUs below AVX2 when a panel weight is given).
#include <cmath>

#include "half_bits.h"
#include "panel5.h"

namespace localchat_cpu {

void int5_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t K = a.K, Kp = a.Kp, ng = K / 32;
  const uint8_t* pl = static_cast<const uint8_t*>(a.qweight);
  const uint8_t* ph = static_cast<const uint8_t*>(a.qhigh);
  const uint16_t* ps = static_cast<const uint16_t*>(a.scales);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* x = a.xq + m * Kp;
      for (int j = 0; j < 16; ++j) {
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; ++g) {
          const uint8_t* hb = ph + (t * ng + g) * 64 + 4 * j;
          int32_t dot = panel5_offset(a, m, g);
          for (int v = 0; v < 8; ++v) {
            const uint8_t* w = pl + (t * (K / 8) + 4 * g + v / 2) * 64 + 4 * j;
            for (int b = 0; b < 4; ++b) {
              const int u = ((w[b] >> (4 * (v % 2))) & 0x0F) | (((hb[b] >> v) & 1) << 4);
              dot += u * x[32 * g + 4 * v + b];
            }
          }
          const float d = f16_bits_to_f32(ps[(t * ng + g) * 16 + j]);
          acc = std::fma(static_cast<float>(dot), d * a.d[m * (Kp / 32) + g], acc);
        }
        a8_store(a, m, t * 16 + j, acc);
      }
    }
  }
}

}  // namespace localchat_cpu
