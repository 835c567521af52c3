// Portable activation quantization for the integer-dot matmuls (qa8.h): the same integers
// and block scales on every ISA. Source: llama.cpp's Q8_0 activation blocks (d = amax / 127).
#include <cmath>
#include <cstring>

#include "qa8.h"

namespace localchat_cpu {

void a8_quantize_rows(const float* x, A8Args& a, int8_t* xq, int32_t* ncorr, float* d,
                      float* xs, bool int4) {
  const int64_t K = a.K, Kp = a.Kp, G = a.group_size, ng = a.ngroups;
  std::memset(xq, 0, a.M * Kp);
  std::memset(d, 0, sizeof(float) * a.M * (Kp / 32));
  if (ncorr) std::memset(ncorr, 0, sizeof(int32_t) * a.M * (Kp / 4));
  if (xs) std::memset(xs, 0, sizeof(float) * a.M * ng);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* xr = x + m * K;
    int8_t* qr = xq + m * Kp;
    for (int64_t b = 0; b < K / 32; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xr[b * 32 + j]));
      const float db = amax / 127.0f;
      const float id = db != 0.0f ? 1.0f / db : 0.0f;
      d[m * (Kp / 32) + b] = db;
      int32_t sum[2] = {0, 0};  // per 16 columns (natural order)
      for (int j = 0; j < 32; ++j) {
        float v = std::nearbyint(xr[b * 32 + j] * id);
        v = std::fmin(127.0f, std::fmax(-127.0f, v));
        const int q = static_cast<int>(v);
        sum[j / 16] += q;
        const int pos = int4 ? (j % 2) * 16 + j / 2 : j;
        qr[b * 32 + pos] = static_cast<int8_t>(q);
      }
      if (xs) {
        if (G == 16) {
          xs[m * ng + 2 * b] = db * static_cast<float>(sum[0]);
          xs[m * ng + 2 * b + 1] = db * static_cast<float>(sum[1]);
        } else {
          xs[m * ng + b * 32 / G] += db * static_cast<float>(sum[0] + sum[1]);
        }
      }
    }
    if (ncorr)
      for (int64_t j = 0; j < K / 4; ++j)
        ncorr[m * (Kp / 4) + j] =
            -128 * (qr[4 * j] + qr[4 * j + 1] + qr[4 * j + 2] + qr[4 * j + 3]);
  }
}

}  // namespace localchat_cpu
