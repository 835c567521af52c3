// Portable scalar kernels of the int5 layout (qa5.h): the integer-dot matmul (per 32-column
// block an exact int32 dot, summed in k order in fp32), the exact fp32-activation matmul (k
// order, one multiply and one add per weight) and the row dequantization. Each weight row is
// first unpacked once into a per-thread buffer (u - 16 and the block scales d), then used by
// every activation row.
#include <vector>

#include "qa5.h"

namespace localchat_cpu {
namespace {

// Row n's weights q = u - 16 [K] and block scales d [K / 32].
void unpack_row(const Int5Args& a, int64_t n, std::vector<int8_t>& q, std::vector<float>& s) {
  q.resize(a.K);
  s.resize(a.K / 32);
  for (int64_t k = 0; k < a.K; ++k) q[k] = static_cast<int8_t>(int5_u(a, n, k) - 16);
  for (int64_t b = 0; b < a.K / 32; ++b) s[b] = int5_scale(a, n, b);
}

// Where column k of an activation row lies in qa8.h's int4 layout (even / odd halves).
inline int64_t a8_int4_pos(int64_t k) {
  return (k / 128) * 128 + (k % 2) * 64 + (k % 128) / 2;
}

}  // namespace

void int5_a8_scalar(const Int5Args& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  std::vector<int8_t> q;
  std::vector<float> s;
  for (int64_t n = n0; n < n1; ++n) {
    unpack_row(a, n, q, s);
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* xq = a.xq + m * K;
      const float* d = a.dact + m * (K / 32);
      float acc = 0.0f;
      for (int64_t b = 0; b < K / 32; ++b) {
        int32_t dot = 0;
        for (int64_t k = 32 * b; k < 32 * b + 32; ++k) dot += q[k] * xq[a8_int4_pos(k)];
        const float sd = s[b] * d[b];
        acc += static_cast<float>(dot) * sd;
      }
      int5_store(a, m, n, acc);
    }
  }
}

void int5_f32_scalar(const Int5Args& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<float> w(K);
  for (int64_t n = n0; n < n1; ++n) {
    unpack_row(a, n, q, s);
    for (int64_t k = 0; k < K; ++k) w[k] = static_cast<float>(q[k]) * s[k / 32];
    for (int64_t m = 0; m < a.M; ++m) {
      const float* x = a.x + m * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float p = x[k] * w[k];
        acc += p;
      }
      int5_store(a, m, n, acc);
    }
  }
}

void int5_dequant_rows_scalar(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  const int64_t K = a.K;
  std::vector<int8_t> q;
  std::vector<float> s;
  for (int64_t n = r0; n < r1; ++n) {
    unpack_row(a, n, q, s);
    for (int64_t k = 0; k < K; ++k) {
      const float w = static_cast<float>(q[k]) * s[k / 32];
      if (bf16) static_cast<uint16_t*>(out)[n * K + k] = int5_bf16_bits(w);
      else static_cast<float*>(out)[n * K + k] = w;
    }
  }
}

}  // namespace localchat_cpu
