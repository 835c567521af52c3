// Portable activation quantization for the integer-dot matmuls (qa8.h), and the layout
// helpers every ISA's quantizer shares. Source: llama.cpp's Q8_0 activation blocks
// (d = amax / 127); the vector versions (qa8_avx2.cpp, qa8_vnni.cpp) give the same integers.
#include <cmath>
#include <cstring>

#include "qa8.h"
#include "qa8_layout.h"

namespace localchat_cpu {

void a8_quantize_scalar(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                        const A8Buffers& b, bool int4) {
  const int64_t K = a.K;
  a8_zero_fill(a, b, int4);
  for (int64_t m = 0; m < a.M; ++m) {
    float row[32];
    for (int64_t bl = 0; bl < K / 32; ++bl) {
      for (int j = 0; j < 32; ++j) {
        const int64_t i = m * x_stride + bl * 32 + j;
        if (x_bf16) {
          const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16;
          std::memcpy(&row[j], &u, 4);
        } else {
          row[j] = static_cast<const float*>(x)[i];
        }
      }
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(row[j]));
      const float db = amax / 127.0f;
      const float id = db != 0.0f ? 1.0f / db : 0.0f;
      int8_t q[32];
      for (int j = 0; j < 32; ++j) {
        float v = std::nearbyint(row[j] * id);
        v = std::fmin(127.0f, std::fmax(-127.0f, v));
        q[j] = static_cast<int8_t>(v);
      }
      a8_put_block(a, b, int4, m, bl, q, db);
    }
    a8_row_sums(a, b, int4, m);
  }
}

}  // namespace localchat_cpu
