// Portable kernels of the exact fp32 panel matmuls (panelf.h): the definition of their values,
// which the AVX2 kernels (panelf_avx2.cpp) equal bit for bit.
#include <cmath>
#include <cstring>

#include "half_bits.h"
#include "panelf.h"

namespace localchat_cpu {

namespace {

// w[16 t + j, k] of the int4 panel: byte 4 j + (k % 4) of octet k / 8, nibble (k % 8) / 4.
inline float int4_weight(const PanelF32Args& a, int64_t t, int j, int64_t k) {
  const auto* qp = static_cast<const uint8_t*>(a.qweight) + (t * (a.K / 8) + k / 8) * 64;
  const int q = (qp[4 * j + k % 4] >> (4 * ((k % 8) / 4))) & 0xF;
  const int64_t at = (t * (a.K / 32) + k / 32) * 16 + j;
  return std::fma(static_cast<float>(q), f16_bits_to_f32(a.scales[at]),
                  f16_bits_to_f32(a.mins[at]));
}

// w[16 t + j, k] of the int5 panel: u's low bits as the int4 panel's nibble, its top bit bit
// (k % 32) / 4 of byte 4 j + (k % 4) of group k / 32 (panel5.h); w = (u - 16) * d.
inline float int5_weight(const PanelF32Args& a, int64_t t, int j, int64_t k) {
  const auto* qp = static_cast<const uint8_t*>(a.qweight) + (t * (a.K / 8) + k / 8) * 64;
  const int64_t at = (t * (a.K / 32) + k / 32) * 16 + j;
  const uint8_t top = a.qhigh[(t * (a.K / 32) + k / 32) * 64 + 4 * j + k % 4];
  const int u = ((qp[4 * j + k % 4] >> (4 * ((k % 8) / 4))) & 0xF) |
                (((top >> ((k % 32) / 4)) & 1) << 4);
  return static_cast<float>(u - 16) * f16_bits_to_f32(a.scales[at]);
}

// w[16 t + j, k] of the int8 panel: byte 4 j + (k % 4) of quad k / 4.
inline float int8_weight(const PanelF32Args& a, int64_t t, int j, int64_t k) {
  const auto* qp = static_cast<const int8_t*>(a.qweight) + (t * (a.K / 4) + k / 4) * 64;
  const int64_t at = (t * (a.K / 32) + k / 32) * 16 + j;
  return static_cast<float>(qp[4 * j + k % 4]) * f16_bits_to_f32(a.scales[at]);
}

template <class Weight>
void tiles(const PanelF32Args& a, int64_t t0, int64_t t1, Weight weight) {
  for (int64_t t = t0; t < t1; ++t)
    for (int j = 0; j < 16; ++j)
      for (int64_t m = 0; m < a.M; ++m) {
        const float* x = a.x + m * a.K;
        float acc = 0.0f;
        for (int64_t k = 0; k < a.K; ++k) acc = std::fma(weight(a, t, j, k), x[k], acc);
        a.out[m * a.N + 16 * t + j] = acc;
      }
}

}  // namespace

void int4_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1) {
  tiles(a, t0, t1, int4_weight);
}

void int5_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1) {
  tiles(a, t0, t1, int5_weight);
}

void int8_panel_f32_scalar(const PanelF32Args& a, int64_t t0, int64_t t1) {
  tiles(a, t0, t1, int8_weight);
}

}  // namespace localchat_cpu
