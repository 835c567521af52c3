// ISA-generic attention / norm / rope / SiLU kernels, included by attn_scalar.cpp,
// attn_avx2.cpp and attn_avx512.cpp INSIDE an anonymous namespace, after each defines
//   float h2f(uint16_t)   fp16 bits -> fp32
//   uint16_t f2h(float)   fp32 -> fp16 bits, round to nearest even
// for its ISA. The code is plain C++ written in 16-lane strips (one accumulator per lane,
// reduced in a fixed tree at the end) so the compiler vectorizes it for the TU's target
// without reassociating anything: results are deterministic per ISA.
//
// Paged decode attention follows vLLM's paged attention (Kwon et al. 2023, arXiv 2309.06180)
// with the online softmax of Milakov & Gimelshein 2018 (arXiv 1805.02867) applied per chunk of
// kChunk tokens: the GQA group's query heads share every K/V row load.

constexpr int L = 16;          // lanes of a strip
constexpr int64_t kChunk = 32;  // tokens per online-softmax step

inline float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f2bf(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <int T> struct Elem;
template <> struct Elem<kF32> {
  typedef float type;
  static inline float load(float v) { return v; }
  static inline float store(float v) { return v; }
};
template <> struct Elem<kBF16> {
  typedef uint16_t type;
  static inline float load(uint16_t v) { return bf2f(v); }
  static inline uint16_t store(float v) { return f2bf(v); }
};
template <> struct Elem<kF16> {
  typedef uint16_t type;
  static inline float load(uint16_t v) { return h2f(v); }
  static inline uint16_t store(float v) { return f2h(v); }
};

// Row of n (a multiple of L) elements -> fp32 buffer.
template <int T>
inline void load_row(const typename Elem<T>::type* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Elem<T>::load(src[i]);
}

inline float reduce_lanes(const float* acc) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; ++l) t8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// Dot of two fp32 rows of n elements (n a multiple of L), 16 lane accumulators.
inline float dot_rows(const float* a, const float* b, int64_t n) {
  float acc[L] = {0};
  for (int64_t i = 0; i < n; i += L)
    for (int l = 0; l < L; ++l) acc[l] += a[i + l] * b[i + l];
  return reduce_lanes(acc);
}

// ---------------------------------------------------------------- paged decode attention
template <int T>
void decode_t(const DecodeArgs& a, int64_t task0, int64_t task1) {
  typedef typename Elem<T>::type E;
  const int64_t D = a.head_dim, HKV = a.num_kv_heads, G = a.num_heads / a.num_kv_heads;
  alignas(64) float q[kMaxGroup * kMaxHeadDim];
  alignas(64) float acc[kMaxGroup * kMaxHeadDim];
  alignas(64) float s[kMaxGroup * kChunk];
  alignas(64) float krow[kMaxHeadDim], vrow[kMaxHeadDim];
  float mx[kMaxGroup], den[kMaxGroup];
  const E* qbase = static_cast<const E*>(a.query);
  const E* kc = static_cast<const E*>(a.key_cache);
  const E* vc = static_cast<const E*>(a.value_cache);
  E* out = static_cast<E*>(a.out);
  for (int64_t task = task0; task < task1; ++task) {
    const int64_t seq = task / HKV, kvh = task % HKV;
    const int64_t n_tok = a.seq_lens[seq];
    const int64_t* bt = a.block_tables + seq * a.bt_s0;
    for (int64_t g = 0; g < G; ++g) {
      load_row<T>(qbase + seq * a.q_s0 + (kvh * G + g) * a.q_s1, q + g * D, D);
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] = 0.f;
      mx[g] = -__builtin_inff();
      den[g] = 0.f;
    }
    for (int64_t c0 = 0; c0 < n_tok; c0 += kChunk) {
      const int64_t cn = n_tok - c0 < kChunk ? n_tok - c0 : kChunk;
      // scores of the chunk: s[g, t] = scale * q_g . k_t
      for (int64_t t = 0; t < cn; ++t) {
        const int64_t tok = c0 + t;
        const E* kp = kc + bt[tok / a.block_size] * a.k_s0 + (tok % a.block_size) * a.k_s1 +
                      kvh * a.k_s2;
        const float* kr;
        if (T == kF32) {
          kr = reinterpret_cast<const float*>(kp);
        } else {
          load_row<T>(kp, krow, D);
          kr = krow;
        }
        for (int64_t g = 0; g < G; ++g) s[g * kChunk + t] = dot_rows(q + g * D, kr, D) * a.scale;
      }
      // online softmax: new running max, rescale what was accumulated, exponentiate
      for (int64_t g = 0; g < G; ++g) {
        float m = mx[g];
        for (int64_t t = 0; t < cn; ++t) m = s[g * kChunk + t] > m ? s[g * kChunk + t] : m;
        const float alpha = mx[g] == -__builtin_inff() ? 0.f : __builtin_expf(mx[g] - m);
        if (alpha != 1.f) {
          den[g] *= alpha;
          for (int64_t d = 0; d < D; ++d) acc[g * D + d] *= alpha;
        }
        float sum = 0.f;
        for (int64_t t = 0; t < cn; ++t) {
          const float p = __builtin_expf(s[g * kChunk + t] - m);
          s[g * kChunk + t] = p;
          sum += p;
        }
        den[g] += sum;
        mx[g] = m;
      }
      // acc[g] += p[g, t] * v_t
      for (int64_t t = 0; t < cn; ++t) {
        const int64_t tok = c0 + t;
        const E* vp = vc + bt[tok / a.block_size] * a.v_s0 + (tok % a.block_size) * a.v_s1 +
                      kvh * a.v_s2;
        const float* vr;
        if (T == kF32) {
          vr = reinterpret_cast<const float*>(vp);
        } else {
          load_row<T>(vp, vrow, D);
          vr = vrow;
        }
        for (int64_t g = 0; g < G; ++g) {
          const float p = s[g * kChunk + t];
          float* ag = acc + g * D;
          for (int64_t d = 0; d < D; ++d) ag[d] += p * vr[d];
        }
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      const float inv = den[g] > 0.f ? 1.f / den[g] : 0.f;
      E* o = out + (seq * a.num_heads + kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = Elem<T>::store(acc[g * D + d] * inv);
    }
  }
}

// ---------------------------------------------------------------- (fused add +) RMSNorm
template <int T>
void norm_t(const NormArgs& a, int64_t r0, int64_t r1) {
  typedef typename Elem<T>::type E;
  const int64_t H = a.hidden, Hv = H / L * L;
  const E* w = static_cast<const E*>(a.weight);
  for (int64_t r = r0; r < r1; ++r) {
    const E* x = static_cast<const E*>(a.x) + r * H;
    const E* res = a.residual ? static_cast<const E*>(a.residual) + r * H : nullptr;
    E* ro = a.res_out ? static_cast<E*>(a.res_out) + r * H : nullptr;
    E* o = static_cast<E*>(a.out) + r * H;
    float acc[L] = {0};
    // pass 1: (residual add, stored rounded to E) and the sum of squares of the E values
    for (int64_t i = 0; i < Hv; i += L) {
      for (int l = 0; l < L; ++l) {
        float v = Elem<T>::load(x[i + l]);
        if (res) {
          const E sum = Elem<T>::store(v + Elem<T>::load(res[i + l]));
          ro[i + l] = sum;
          v = Elem<T>::load(sum);
        }
        acc[l] += v * v;
      }
    }
    float tail = 0.f;
    for (int64_t i = Hv; i < H; ++i) {
      float v = Elem<T>::load(x[i]);
      if (res) {
        const E sum = Elem<T>::store(v + Elem<T>::load(res[i]));
        ro[i] = sum;
        v = Elem<T>::load(sum);
      }
      tail += v * v;
    }
    const float ms = (reduce_lanes(acc) + tail) / static_cast<float>(H);
    const float rstd = 1.f / __builtin_sqrtf(ms + a.eps);
    const E* src = res ? ro : x;
    // pass 2: weight * E(x * rstd), the product rounded to E (HF Llama's order)
    for (int64_t i = 0; i < H; ++i) {
      const float n = Elem<T>::load(Elem<T>::store(Elem<T>::load(src[i]) * rstd));
      o[i] = Elem<T>::store(Elem<T>::load(w[i]) * n);
    }
  }
}

// ---------------------------------------------------------------- rotary embedding (neox)
template <int T>
inline void rope_heads(const typename Elem<T>::type* x, int64_t s1, typename Elem<T>::type* o,
                       int64_t heads, int64_t D, const float* cs) {
  const int64_t h2 = D / 2;
  const float* cs_cos = cs;
  const float* cs_sin = cs + h2;
  for (int64_t h = 0; h < heads; ++h) {
    const typename Elem<T>::type* xh = x + h * s1;
    typename Elem<T>::type* oh = o + h * D;
    for (int64_t i = 0; i < h2; ++i) {
      const float x1 = Elem<T>::load(xh[i]), x2 = Elem<T>::load(xh[i + h2]);
      const float c = cs_cos[i], s = cs_sin[i];
      const float a1 = x1 * c, b1 = x2 * s, a2 = x2 * c, b2 = x1 * s;  // separate roundings,
      oh[i] = Elem<T>::store(a1 - b1);                                 // as the reference
      oh[i + h2] = Elem<T>::store(a2 + b2);
    }
  }
}

template <int T>
void rope_t(const RopeArgs& a, int64_t t0, int64_t t1) {
  typedef typename Elem<T>::type E;
  const int64_t D = a.head_dim;
  for (int64_t t = t0; t < t1; ++t) {
    const float* cs = a.cos_sin + a.positions[t] * D;
    rope_heads<T>(static_cast<const E*>(a.q) + t * a.q_s0, a.q_s1,
                  static_cast<E*>(a.q_out) + t * a.num_heads * D, a.num_heads, D, cs);
    rope_heads<T>(static_cast<const E*>(a.k) + t * a.k_s0, a.k_s1,
                  static_cast<E*>(a.k_out) + t * a.num_kv_heads * D, a.num_kv_heads, D, cs);
  }
}

// ---------------------------------------------------------------- SiLU(gate) * up
template <int T>
void silu_t(const SiluArgs& a, int64_t r0, int64_t r1) {
  typedef typename Elem<T>::type E;
  const int64_t I = a.inter;
  for (int64_t r = r0; r < r1; ++r) {
    const E* g = static_cast<const E*>(a.x) + r * a.x_s0;
    const E* u = g + I;
    E* o = static_cast<E*>(a.out) + r * I;
    for (int64_t i = 0; i < I; ++i) {
      const float x = Elem<T>::load(g[i]);
      // silu rounded to E first, then the product (the reference's F.silu(gate) * up)
      const float sl = Elem<T>::load(Elem<T>::store(x / (1.f + __builtin_expf(-x))));
      o[i] = Elem<T>::store(sl * Elem<T>::load(u[i]));
    }
  }
}


void decode_any(const DecodeArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32) decode_t<kF32>(a, i0, i1);
  else if (a.dtype == kBF16) decode_t<kBF16>(a, i0, i1);
  else decode_t<kF16>(a, i0, i1);
}
void norm_any(const NormArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32) norm_t<kF32>(a, i0, i1);
  else if (a.dtype == kBF16) norm_t<kBF16>(a, i0, i1);
  else norm_t<kF16>(a, i0, i1);
}
void rope_any(const RopeArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32) rope_t<kF32>(a, i0, i1);
  else if (a.dtype == kBF16) rope_t<kBF16>(a, i0, i1);
  else rope_t<kF16>(a, i0, i1);
}
void silu_any(const SiluArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32) silu_t<kF32>(a, i0, i1);
  else if (a.dtype == kBF16) silu_t<kBF16>(a, i0, i1);
  else silu_t<kF16>(a, i0, i1);
}

const AttnKernels kKernels = {decode_any, norm_any, rope_any, silu_any};
