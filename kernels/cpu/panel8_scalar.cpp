// Portable kernel of the int8 panel layout (panel8.h): the VNNI kernel's operations in the
// same order, one output at a time (bit-equal to it; the oracle of the C++ tests and the path
// of CPUs without VNNI when a panel weight is given).
#include <cmath>

#include "half_bits.h"
#include "panel8.h"

namespace localchat_cpu {

void int8_panel_a8_scalar(const A8Args& a, int64_t t0, int64_t t1) {
  const int64_t K = a.K, Kp = a.Kp, nq = K / 4, ng = K / 32;
  const int8_t* pq = static_cast<const int8_t*>(a.qweight);
  const uint16_t* ps = static_cast<const uint16_t*>(a.scales);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* x = a.xq + m * Kp;
      for (int j = 0; j < 16; ++j) {
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; ++g) {
          int32_t dot = panel8_offset(a, m, g);
          for (int64_t c = 8 * g; c < 8 * g + 8; ++c) {
            const int8_t* w = pq + (t * nq + c) * 64 + 4 * j;
            for (int b = 0; b < 4; ++b) dot += (w[b] + 128) * x[4 * c + b];
          }
          const float s = f16_bits_to_f32(ps[(t * ng + g) * 16 + j]);
          acc = std::fma(static_cast<float>(dot), s * a.d[m * (Kp / 32) + g], acc);
        }
        a8_store(a, m, t * 16 + j, acc);
      }
    }
  }
}

}  // namespace localchat_cpu
