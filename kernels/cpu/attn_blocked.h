// The sweep task (decode_task_sweep) with register blocking, for 8-lane vectors (AVX2),
// where a head's 128-dim query or accumulator alone fills the 16 registers: scores of two
// heads x four tokens at a time (8 accumulators, the four K rows and two query vectors in
// registers: each K row is loaded once per head pair), and the V rows of a chunk met by two
// heads' accumulators of 32 dims at a time (8 accumulators, 4 V vectors, a broadcast). Every
// score and every accumulator takes the sweep's operations in the sweep's order (a product
// started by a multiply, then FMAs over the dims; the accumulator scaled by the chunk's alpha,
// a multiply by 1 when the max did not move, then one FMA per token in token order), so the
// results equal decode_task_sweep's bit for bit. One thread, Zen 3, fp32 cache, 1024 tokens,
// best of 30 calls after three interleaved runs, us a layer, sweep / this: the 1.5B's shape
// (2 kv heads x 6 x 128 dims) 206 / 158, the 0.5B's (2 x 7 x 64) 103 / 88, SmolLM2's (3 x 3 x
// 64) 124 / 102. (Microbenchmarks of the two parts on hot data: about 12 cycles per token and
// head for the scores and 14 for the V sums, against the 8 that two FMAs a cycle allow.)
// Included by attn_kernels.h inside the TU's anonymous namespace.

// s[h][t .. t + 3] for heads g, g + 1 (HP = 2) or g alone (HP = 1) over K rows kr[t .. t + 3].
template <int HP, int NV>
inline void scores_block(const float* qs, int64_t D, int64_t nv, const float* const* kr,
                         float (*s)[kChunk], int64_t g, int64_t t) {
  const float *k0 = kr[t], *k1 = kr[t + 1], *k2 = kr[t + 2], *k3 = kr[t + 3];
  const float* q0p = qs + g * D;
  const float* q1p = qs + (g + HP - 1) * D;
  V q0 = vld_f32(q0p), q1 = vld_f32(q1p);
  V x0 = vld_f32(k0), x1 = vld_f32(k1), x2 = vld_f32(k2), x3 = vld_f32(k3);
  V a0 = vmul(q0, x0), a1 = vmul(q0, x1), a2 = vmul(q0, x2), a3 = vmul(q0, x3);
  V b0 = vmul(q1, x0), b1 = vmul(q1, x1), b2 = vmul(q1, x2), b3 = vmul(q1, x3);
  const int64_t n = NV > 0 ? NV : nv;
  for (int64_t v = 1; v < n; ++v) {
    const int64_t o = v * W;
    q0 = vld_f32(q0p + o);
    x0 = vld_f32(k0 + o);
    x1 = vld_f32(k1 + o);
    x2 = vld_f32(k2 + o);
    x3 = vld_f32(k3 + o);
    a0 = vfma(q0, x0, a0);
    a1 = vfma(q0, x1, a1);
    a2 = vfma(q0, x2, a2);
    a3 = vfma(q0, x3, a3);
    if constexpr (HP == 2) {
      q1 = vld_f32(q1p + o);
      b0 = vfma(q1, x0, b0);
      b1 = vfma(q1, x1, b1);
      b2 = vfma(q1, x2, b2);
      b3 = vfma(q1, x3, b3);
    }
  }
  vsum4(a0, a1, a2, a3, &s[g][t]);
  if constexpr (HP == 2) vsum4(b0, b1, b2, b3, &s[g + 1][t]);
}

// accs[h] (dims o .. o + 31) = accs[h] * alpha[h] + sum over the chunk's tokens of
// p[h][t] * v_t, for heads g, g + 1 (HP = 2) or g alone.
template <int HP>
inline void pv_block(float* accs, int64_t D, const float* const* vr, const float (*s)[kChunk],
                     const float* alpha, int64_t cn, int64_t g, int64_t o) {
  V a[HP][4];
  for (int h = 0; h < HP; ++h) {
    const V al = vset1(alpha[g + h]);
    for (int j = 0; j < 4; ++j) a[h][j] = vmul(vld_f32(accs + (g + h) * D + o + j * W), al);
  }
  for (int64_t t = 0; t < cn; ++t) {
    const float* vp = vr[t] + o;
    const V v0 = vld_f32(vp), v1 = vld_f32(vp + W), v2 = vld_f32(vp + 2 * W);
    const V v3 = vld_f32(vp + 3 * W);
    for (int h = 0; h < HP; ++h) {
      const V p = vset1(s[g + h][t]);
      a[h][0] = vfma(p, v0, a[h][0]);
      a[h][1] = vfma(p, v1, a[h][1]);
      a[h][2] = vfma(p, v2, a[h][2]);
      a[h][3] = vfma(p, v3, a[h][3]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int j = 0; j < 4; ++j) vst(accs + (g + h) * D + o + j * W, a[h][j]);
}

// decode_task_sweep's contract and results; head_dim a multiple of 4 W.
template <int T, int C, int NV>
void decode_task_blocked(const DecodeArgs& a, int64_t task) {
  typedef typename Elem<C>::type E;  // the caches' elements (the query's: Elem<T>)
  const int64_t D = a.head_dim, G = a.num_heads / a.num_kv_heads;
  const int64_t nv = NV > 0 ? NV : D / W;
  const DecodeSpan span(a, task);
  const int64_t seq = span.seq, kvh = span.kvh, n_tok = span.n_tok, t0 = span.t0, t1 = span.t1;
  const int64_t* bt = span.bt;
  const E* kc = static_cast<const E*>(a.key_cache);
  const E* vc = static_cast<const E*>(a.value_cache);
  alignas(64) float qs[kMaxGroup * kMaxHeadDim];   // scale * q, fp32
  alignas(64) float accs[kMaxGroup * kMaxHeadDim]; // unnormalized outputs
  alignas(64) float kf[kChunk * kMaxHeadDim];      // a 16-bit cache's chunk rows, fp32
  alignas(64) float vf[kChunk * kMaxHeadDim];
  alignas(64) static const float zrow[kMaxHeadDim] = {};  // padding rows' keys
  alignas(64) float s[kMaxGroup][kChunk];
  float mx[kMaxGroup], den[kMaxGroup], alpha[kMaxGroup];
  sweep_init<T>(a, seq, kvh, G, D, nv, qs, accs, mx, den);
  ChunkRows<E> rows(a, bt, kc, vc, kvh, t1);
  int cur = 0;
  int64_t cn = t0 < t1 ? rows.fill(t0, 0) : 0;
  for (int64_t c0 = t0; c0 < t1; c0 += kChunk, cur ^= 1) {
    const int64_t next_cn = c0 + kChunk < t1 ? rows.fill(c0 + kChunk, cur ^ 1) : 0;
    rows.prefetch(cur ^ 1, next_cn);
    const int64_t cn4 = (cn + 3) / 4 * 4;
    const float* kr[kChunk];  // the chunk's fp32 rows: in place for an fp32 cache
    const float* vr[kChunk];
    for (int64_t t = 0; t < cn; ++t) {
      if constexpr (C == kF32) {
        kr[t] = rows.k[cur][t];
        vr[t] = rows.v[cur][t];
      } else {
        for (int64_t v = 0; v < nv; ++v) {
          vst(kf + t * D + v * W, vld<C>(rows.k[cur][t] + v * W));
          vst(vf + t * D + v * W, vld<C>(rows.v[cur][t] + v * W));
        }
        kr[t] = kf + t * D;
        vr[t] = vf + t * D;
      }
    }
    for (int64_t t = cn; t < cn4; ++t) kr[t] = zrow;
    int64_t g = 0;
    for (; g + 2 <= G; g += 2)
      for (int64_t t = 0; t < cn4; t += 4) scores_block<2, NV>(qs, D, nv, kr, s, g, t);
    for (; g < G; ++g)
      for (int64_t t = 0; t < cn4; t += 4) scores_block<1, NV>(qs, D, nv, kr, s, g, t);
    for (g = 0; g < G; ++g) alpha[g] = chunk_softmax(s[g], cn, &mx[g], &den[g]);
    for (int64_t o = 0; o < D; o += 4 * W) {
      for (g = 0; g + 2 <= G; g += 2) pv_block<2>(accs, D, vr, s, alpha, cn, g, o);
      for (; g < G; ++g) pv_block<1>(accs, D, vr, s, alpha, cn, g, o);
    }
    cn = next_cn;
  }
  decode_task_finish<T>(a, task, seq, kvh, n_tok, G, D, nv, accs, mx, den);
}
