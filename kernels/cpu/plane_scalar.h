// Portable scalar kernels shared by the bit-plane layouts (int5: qa5_scalar.cpp, int6:
// qa6_scalar.cpp): the integer-dot matmul (per weight group an exact int32 dot, summed in k
// order in fp32), the exact fp32-activation matmul (k order, one multiply and one add per
// weight) and the row dequantization. Each weight row is first unpacked once into a per-thread
// buffer (q = u - offset and the group scales), then used by every activation row. Included
// inside the anonymous namespace of each TU after the layout's
//   struct Scalar {
//     typedef ... Args;                  // Int5Args / Int6Args
//     static constexpr int64_t kGroup;   // columns per weight scale (32 / 16)
//     static constexpr int kOffset;      // u - q (16 / 32)
//     static int u(const Args&, int64_t n, int64_t k);      // qa5.h int5_u / qa6.h int6_u
//     static float scale(const Args&, int64_t n, int64_t g);
//     static void store(const Args&, int64_t m, int64_t n, float v);
//     static uint16_t bf16_bits(float v);
//   };

// Row n's weights q = u - offset [K] and group scales [K / kGroup].
template <class L>
void plane_unpack_row(const typename L::Args& a, int64_t n, std::vector<int8_t>& q,
                      std::vector<float>& s) {
  q.resize(a.K);
  s.resize(a.K / L::kGroup);
  for (int64_t k = 0; k < a.K; ++k) q[k] = static_cast<int8_t>(L::u(a, n, k) - L::kOffset);
  for (int64_t g = 0; g < a.K / L::kGroup; ++g) s[g] = L::scale(a, n, g);
}

// Where column k of an activation row lies in qa8.h's int4 layout (even / odd halves).
inline int64_t a8_int4_pos(int64_t k) {
  return (k / 128) * 128 + (k % 2) * 64 + (k % 128) / 2;
}

template <class L>
void plane_a8_scalar(const typename L::Args& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K, G = L::kGroup;
  std::vector<int8_t> q;
  std::vector<float> s;
  for (int64_t n = n0; n < n1; ++n) {
    plane_unpack_row<L>(a, n, q, s);
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* xq = a.xq + m * K;
      const float* d = a.dact + m * (K / 32);
      float acc = 0.0f;
      for (int64_t g = 0; g < K / G; ++g) {
        int32_t dot = 0;
        for (int64_t k = G * g; k < G * g + G; ++k) dot += q[k] * xq[a8_int4_pos(k)];
        const float sd = s[g] * d[G * g / 32];
        acc += static_cast<float>(dot) * sd;
      }
      L::store(a, m, n, acc);
    }
  }
}

template <class L>
void plane_f32_scalar(const typename L::Args& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<float> w(K);
  for (int64_t n = n0; n < n1; ++n) {
    plane_unpack_row<L>(a, n, q, s);
    for (int64_t k = 0; k < K; ++k) w[k] = static_cast<float>(q[k]) * s[k / L::kGroup];
    for (int64_t m = 0; m < a.M; ++m) {
      const float* x = a.x + m * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float p = x[k] * w[k];
        acc += p;
      }
      L::store(a, m, n, acc);
    }
  }
}

template <class L>
void plane_dequant_scalar(const typename L::Args& a, void* out, bool bf16, int64_t r0,
                          int64_t r1) {
  const int64_t K = a.K;
  std::vector<int8_t> q;
  std::vector<float> s;
  for (int64_t n = r0; n < r1; ++n) {
    plane_unpack_row<L>(a, n, q, s);
    for (int64_t k = 0; k < K; ++k) {
      const float w = static_cast<float>(q[k]) * s[k / L::kGroup];
      if (bf16) static_cast<uint16_t*>(out)[n * K + k] = L::bf16_bits(w);
      else static_cast<float*>(out)[n * K + k] = w;
    }
  }
}
