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
constexpr int64_t kChunk = 16;  // tokens per online-softmax step (a multiple of W)

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
// One task per (sequence, kv head, partition of kDecodePart tokens); the partition size is
// fixed, so how a sequence is split depends only on its own length (never on the batch or
// the thread count). A task attends the GQA group's query heads to its tokens in chunks of
// kChunk with an online softmax, in the TU's vectors (V, W lanes: vld_*, vfma, vsum, vsum4, vexp),
// and either normalizes into `out` (a single-partition sequence) or writes its running max,
// denominator and unnormalized accumulator to `partials` for decode_combine_t.

template <int T>
inline V vld(const typename Elem<T>::type* p) {
  if constexpr (T == kF32) return vld_f32(p);
  else if constexpr (T == kBF16) return vld_bf16(p);
  else return vld_f16(p);
}

// What a decode task covers: query row seq, kv head kvh, tokens [t0, t1) of its n_tok (the
// task's partition), through block-table row bt.
struct DecodeSpan {
  int64_t seq, kvh, n_tok, t0, t1;
  const int64_t* bt;
  DecodeSpan(const DecodeArgs& a, int64_t task)
      : seq(a.tasks[3 * task]), kvh(a.tasks[3 * task + 1]), n_tok(a.seq_lens[seq]),
        t0(a.tasks[3 * task + 2] * kDecodePart),
        t1(n_tok < t0 + kDecodePart ? n_tok : t0 + kDecodePart),
        bt(a.block_tables + (a.bt_row ? a.bt_row[seq] : seq) * a.bt_s0) {}
};

// The K / V rows of one task's chunks through the block table, double-buffered: fill(c0, b)
// resolves chunk c0's rows into buffer b (one division per chunk) and returns their count;
// prefetch(b, n) touches every cache line of buffer b's n rows, so the next chunk's rows
// arrive while this one is computed (in a model the KV cache is cold: the weights streamed
// since this layer's last step have evicted it; without it the register task ran at a
// third of its hot-cache speed in the model).
template <class E>
struct ChunkRows {
  const DecodeArgs& a;
  const int64_t* bt;
  const E* kc;
  const E* vc;
  int64_t kvh, t1, row_bytes;
  const E* k[2][kChunk];
  const E* v[2][kChunk];
  ChunkRows(const DecodeArgs& a_, const int64_t* bt_, const E* kc_, const E* vc_, int64_t kvh_,
            int64_t t1_)
      : a(a_), bt(bt_), kc(kc_), vc(vc_), kvh(kvh_), t1(t1_),
        row_bytes(a_.head_dim * static_cast<int64_t>(sizeof(E))) {}
  int64_t fill(int64_t c0, int b) {
    const int64_t cn = t1 - c0 < kChunk ? t1 - c0 : kChunk;
    for (int64_t t = 0, blk = c0 / a.block_size, off = c0 % a.block_size; t < cn; ++t) {
      k[b][t] = kc + bt[blk] * a.k_s0 + off * a.k_s1 + kvh * a.k_s2;
      v[b][t] = vc + bt[blk] * a.v_s0 + off * a.v_s1 + kvh * a.v_s2;
      if (++off == a.block_size) {
        off = 0;
        ++blk;
      }
    }
    return cn;
  }
  // Into L2 (prefetcht1), not L1: a chunk's 128 lines requested into L1 at once held the
  // core's L1 miss buffers, and the task ran at about the speed of no prefetch (1.5B shape,
  // 544 cold tokens, standalone: 69-73 us a layer with T0, 50-51 us with T1).
  void prefetch(int b, int64_t cn) const {
    for (int64_t t = 0; t < cn; ++t)
      for (int64_t o = 0; o < row_bytes; o += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(k[b][t]) + o, 0, 2);
        __builtin_prefetch(reinterpret_cast<const char*>(v[b][t]) + o, 0, 2);
      }
  }
};

#ifdef ATTN_DOT
// Decode scores with AVX512_BF16's vdpbf16ps, defined by attn_dot.cpp as
// vdot_bf16(acc, a, b): lane j += a[2j+1] * b[2j+1], then += a[2j] * b[2j] (each product of
// two bf16 values exact in fp32, each add rounded once). s[g][t] = scale * (q_g . k_t) for
// the group's G heads over the chunk's cn rows, read in place in bf16 (no fp32 copy of K):
// four tokens' K rows in registers meet each head's query, and their four sums come from
// one transposed reduction (vsum4); rows past cn read zeros. The products are exact and each
// score sums D of them in fp32 (then one rounding for the scale), so the fp32 path's bound
// holds; the bits differ from it (which scales q before the products).
// NQ > 0: head_dim / 32 known at compile time; NQ == 0: nq at run time.
template <int NQ>
inline void scores_dot(const uint16_t* q, int64_t q_s1, int64_t G, int64_t nq,
                       const uint16_t* const* krow, int64_t cn, float scale,
                       float (*s)[kChunk]) {
  constexpr int64_t kMaxNq = kMaxHeadDim / 32;
  alignas(64) static const uint16_t zero_row[kMaxHeadDim] = {};
  const int64_t n = NQ > 0 ? NQ : nq;
  for (int64_t t = 0; t < cn; t += 4) {
    __m512i k[4][kMaxNq];
    for (int64_t j = 0; j < 4; ++j) {
      const uint16_t* kp = t + j < cn ? krow[t + j] : zero_row;
      for (int64_t v = 0; v < n; ++v) k[j][v] = _mm512_loadu_si512(kp + 32 * v);
    }
    for (int64_t g = 0; g < G; ++g) {
      const uint16_t* qg = q + g * q_s1;
      V d0 = vzero(), d1 = vzero(), d2 = vzero(), d3 = vzero();
      for (int64_t v = 0; v < n; ++v) {
        const __m512i qv = _mm512_loadu_si512(qg + 32 * v);
        d0 = vdot_bf16(d0, k[0][v], qv);
        d1 = vdot_bf16(d1, k[1][v], qv);
        d2 = vdot_bf16(d2, k[2][v], qv);
        d3 = vdot_bf16(d3, k[3][v], qv);
      }
      vsum4(d0, d1, d2, d3, &s[g][t]);
    }
  }
  const V vscale = vset1(scale);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < kChunk; t += W) vst(&s[g][t], vmul(vld_f32(&s[g][t]), vscale));
}
#endif

// Scores of one chunk by scores_dot (attn_dot.cpp: bf16 query and keys, a head_dim that is a
// multiple of 32); false (nothing done) where the task computes them with fp32 FMAs.
template <int T, int C, int NV>
inline bool chunk_scores_dot(const DecodeArgs& a, const typename Elem<T>::type* qbase,
                             int64_t G, const typename Elem<C>::type* const* krow, int64_t cn,
                             float (*s)[kChunk]) {
#ifdef ATTN_DOT
  if constexpr (T == kBF16 && C == kBF16) {
    if (a.head_dim % 32) return false;
    scores_dot<(NV * W) % 32 == 0 ? NV * W / 32 : 0>(qbase, a.q_s1, G, a.head_dim / 32, krow,
                                                     cn, a.scale, s);
    return true;
  }
#endif
  (void)a, (void)qbase, (void)G, (void)krow, (void)cn, (void)s;
  return false;
}

// The end of a decode task: the normalized outputs of a single-partition sequence, else the
// partition's accumulators, max and denominator into `partials` (decode_combine_t).
template <int T>
inline void decode_task_finish(const DecodeArgs& a, int64_t task, int64_t seq, int64_t kvh,
                               int64_t n_tok, int64_t G, int64_t D, int64_t nv,
                               const float* accs, const float* mx, const float* den) {
  typedef typename Elem<T>::type E;
  const int64_t nparts = n_tok <= kDecodePart ? 1 : (n_tok + kDecodePart - 1) / kDecodePart;
  if (nparts == 1) {
    E* out = static_cast<E*>(a.out);
    alignas(64) float row[kMaxHeadDim];
    for (int64_t g = 0; g < G; ++g) {
      const V inv = vset1(den[g] > 0.f ? 1.f / den[g] : 0.f);
      for (int64_t v = 0; v < nv; ++v) vst(row + v * W, vmul(vld_f32(accs + g * D + v * W), inv));
      E* o = out + (seq * a.num_heads + kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = Elem<T>::store(row[d]);
    }
    return;
  }
  float* pt = a.partials + task * G * (D + 2);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t v = 0; v < nv; ++v) vst(pt + g * D + v * W, vld_f32(accs + g * D + v * W));
    pt[G * D + g] = mx[g];
    pt[G * D + G + g] = den[g];
  }
}

// The GQA group's queries and accumulators all in registers (2 * G * head_dim / W vectors
// within kRegBudget: SmolLM2's 3 heads x 64 dims are 24 AVX-512 vectors): each K / V row is
// loaded and widened once and meets every head of the group.
// NV > 0: head_dim / W known at compile time (unrolled); NV == 0: runtime head_dim.
template <int T, int C, int NV>
void decode_task_regs(const DecodeArgs& a, int64_t task) {
  typedef typename Elem<C>::type E;  // the caches' elements (the query's: Elem<T>)
  const int64_t D = a.head_dim, HKV = a.num_kv_heads, G = a.num_heads / a.num_kv_heads;
  const int64_t nv = NV > 0 ? NV : D / W;
  const DecodeSpan span(a, task);
  const int64_t seq = span.seq, kvh = span.kvh, n_tok = span.n_tok, t0 = span.t0, t1 = span.t1;
  const int64_t* bt = span.bt;
  const E* kc = static_cast<const E*>(a.key_cache);
  const E* vc = static_cast<const E*>(a.value_cache);
  V q[kMaxGroup * kMaxHeadDim / W];
  V acc[kMaxGroup * kMaxHeadDim / W];
  alignas(64) float s[kMaxGroup][kChunk];
  float mx[kMaxGroup], den[kMaxGroup];
  const auto* qbase = static_cast<const typename Elem<T>::type*>(a.query) + seq * a.q_s0 +
                     kvh * G * a.q_s1;
  const V vscale = vset1(a.scale);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t v = 0; v < nv; ++v) {
      q[g * nv + v] = vmul(vld<T>(qbase + g * a.q_s1 + v * W), vscale);
      acc[g * nv + v] = vzero();
    }
    mx[g] = -__builtin_inff();
    den[g] = 0.f;
  }
  // the rows of a chunk through the block table (one division per chunk); the next chunk's
  // rows are prefetched while this one is computed (in a model the cache is cold)
  ChunkRows<E> rows(a, bt, kc, vc, kvh, t1);
  int cur = 0;
  int64_t cn = t0 < t1 ? rows.fill(t0, cur) : 0;
  for (int64_t c0 = t0; c0 < t1; c0 += kChunk, cur ^= 1) {
    const int64_t next_cn = c0 + kChunk < t1 ? rows.fill(c0 + kChunk, cur ^ 1) : 0;
    rows.prefetch(cur ^ 1, next_cn);
    const E* const* krow = rows.k[cur];
    const E* const* vrow = rows.v[cur];
    const bool dot = chunk_scores_dot<T, C, NV>(a, qbase, G, krow, cn, s);
    // scores: s[g, t] = (scale * q_g) . k_t
    for (int64_t t = 0; !dot && t < cn; ++t) {
      const E* kp = krow[t];
      V kr[kMaxHeadDim / W];
      for (int64_t v = 0; v < nv; ++v) kr[v] = vld<C>(kp + v * W);
      for (int64_t g = 0; g < G; ++g) {
        V d = vmul(q[g * nv], kr[0]);
        for (int64_t v = 1; v < nv; ++v) d = vfma(q[g * nv + v], kr[v], d);
        s[g][t] = vsum(d);
      }
    }
    // online softmax over the chunk
    for (int64_t g = 0; g < G; ++g) {
      float m = mx[g];
      for (int64_t t = 0; t < cn; ++t) m = s[g][t] > m ? s[g][t] : m;
      const float alpha = mx[g] == -__builtin_inff() ? 0.f : __builtin_expf(mx[g] - m);
      if (alpha != 1.f) {
        den[g] *= alpha;
        const V va = vset1(alpha);
        for (int64_t v = 0; v < nv; ++v) acc[g * nv + v] = vmul(acc[g * nv + v], va);
      }
      for (int64_t t = cn; t < kChunk; ++t) s[g][t] = m;  // padding, zeroed below
      const V vm = vset1(m);
      V sum = vzero();
      for (int64_t t = 0; t < kChunk; t += W) {
        const V p = vexp(vsub(vld_f32(&s[g][t]), vm));
        vst(&s[g][t], p);
      }
      for (int64_t t = cn; t < kChunk; ++t) s[g][t] = 0.f;
      for (int64_t t = 0; t < kChunk; t += W) sum = vadd(sum, vld_f32(&s[g][t]));
      den[g] += vsum(sum);
      mx[g] = m;
    }
    // acc[g] += p[g, t] * v_t
    for (int64_t t = 0; t < cn; ++t) {
      const E* vp = vrow[t];
      V vr[kMaxHeadDim / W];
      for (int64_t v = 0; v < nv; ++v) vr[v] = vld<C>(vp + v * W);
      for (int64_t g = 0; g < G; ++g) {
        const V p = vset1(s[g][t]);
        for (int64_t v = 0; v < nv; ++v) acc[g * nv + v] = vfma(p, vr[v], acc[g * nv + v]);
      }
    }
    cn = next_cn;
  }
  alignas(64) float accs[kMaxGroup * kMaxHeadDim];
  for (int64_t g = 0; g < G; ++g)
    for (int64_t v = 0; v < nv; ++v) vst(accs + g * D + v * W, acc[g * nv + v]);
  decode_task_finish<T>(a, task, seq, kvh, n_tok, G, D, nv, accs, mx, den);
}


// A sweep task's start: qs[g] = scale * q_g (fp32), accs[g] = 0, mx[g] = -inf, den[g] = 0
// for the G query heads of kv head kvh in query row seq.
template <int T>
inline void sweep_init(const DecodeArgs& a, int64_t seq, int64_t kvh, int64_t G, int64_t D,
                       int64_t nv, float* qs, float* accs, float* mx, float* den) {
  const auto* qbase = static_cast<const typename Elem<T>::type*>(a.query) + seq * a.q_s0 +
                      kvh * G * a.q_s1;
  const V vscale = vset1(a.scale);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t v = 0; v < nv; ++v) {
      vst(qs + g * D + v * W, vmul(vld<T>(qbase + g * a.q_s1 + v * W), vscale));
      vst(accs + g * D + v * W, vzero());
    }
    mx[g] = -__builtin_inff();
    den[g] = 0.f;
  }
}

// The online softmax of one head over a chunk: s[0 .. cn) scores -> s[0 .. kChunk) weights
// exp(s - m) (0 past cn) with m the running max, mx and den updated; returns alpha =
// exp(old max - m) (0 on the first chunk), by which the caller scales the accumulator (den
// is scaled here; a multiply by 1 when the max did not move changes nothing).
inline float chunk_softmax(float* s, int64_t cn, float* mx, float* den) {
  float m = *mx;
  for (int64_t t = 0; t < cn; ++t) m = s[t] > m ? s[t] : m;
  const float alpha = *mx == -__builtin_inff() ? 0.f : __builtin_expf(*mx - m);
  *den *= alpha;
  for (int64_t t = cn; t < kChunk; ++t) s[t] = m;  // padding, zeroed below
  const V vm = vset1(m);
  V sum = vzero();
  for (int64_t t = 0; t < kChunk; t += W) vst(s + t, vexp(vsub(vld_f32(s + t), vm)));
  for (int64_t t = cn; t < kChunk; ++t) s[t] = 0.f;
  for (int64_t t = 0; t < kChunk; t += W) sum = vadd(sum, vld_f32(s + t));
  *den += vsum(sum);
  *mx = m;
  return alpha;
}

// Per chunk the K and V rows are widened to fp32 once (into L1-resident buffers) and then
// swept per query head, so each head's query and accumulator stay in registers (with the
// GQA group's heads all in registers at once the accumulators spilled: 6 heads x 128 dims
// are 48 AVX-512 vectors); scores of four tokens are reduced together (vsum4).
// NV > 0: head_dim / W known at compile time (unrolled); NV == 0: runtime head_dim.
template <int T, int C, int NV>
void decode_task_sweep(const DecodeArgs& a, int64_t task) {
  typedef typename Elem<C>::type E;  // the caches' elements (the query's: Elem<T>)
  const int64_t D = a.head_dim, G = a.num_heads / a.num_kv_heads;
  constexpr int64_t kMaxNv = kMaxHeadDim / W;
  const int64_t nv = NV > 0 ? NV : D / W;
  const DecodeSpan span(a, task);
  const int64_t seq = span.seq, kvh = span.kvh, n_tok = span.n_tok, t0 = span.t0, t1 = span.t1;
  const int64_t* bt = span.bt;
  const E* kc = static_cast<const E*>(a.key_cache);
  const E* vc = static_cast<const E*>(a.value_cache);
  alignas(64) float qs[kMaxGroup * kMaxHeadDim];   // scale * q, fp32
  alignas(64) float accs[kMaxGroup * kMaxHeadDim]; // unnormalized outputs
  alignas(64) float kf[kChunk * kMaxHeadDim];      // the chunk's K rows, fp32
  alignas(64) float vf[kChunk * kMaxHeadDim];      // and V rows
  alignas(64) float s[kMaxGroup][kChunk];
  float mx[kMaxGroup], den[kMaxGroup];
  const auto* qbase = static_cast<const typename Elem<T>::type*>(a.query) + seq * a.q_s0 +
                      kvh * G * a.q_s1;
  sweep_init<T>(a, seq, kvh, G, D, nv, qs, accs, mx, den);
  // The rows of a chunk through the block table, the next chunk's prefetched (ChunkRows).
  ChunkRows<E> rows(a, bt, kc, vc, kvh, t1);
  int cur = 0;
  int64_t cn = t0 < t1 ? rows.fill(t0, 0) : 0;
  for (int64_t c0 = t0; c0 < t1; c0 += kChunk, cur ^= 1) {
    const int64_t next_cn = c0 + kChunk < t1 ? rows.fill(c0 + kChunk, cur ^ 1) : 0;
    rows.prefetch(cur ^ 1, next_cn);
    const int64_t cn4 = (cn + 3) / 4 * 4;  // scores are reduced four tokens at a time
    const bool dot = chunk_scores_dot<T, C, NV>(a, qbase, G, rows.k[cur], cn, s);
    for (int64_t t = 0; t < cn; ++t) {  // widened to fp32 (K only for the FMA scores)
      const E* kp = rows.k[cur][t];
      const E* vp = rows.v[cur][t];
      for (int64_t v = 0; v < nv; ++v) {
        if (!dot) vst(kf + t * D + v * W, vld<C>(kp + v * W));
        vst(vf + t * D + v * W, vld<C>(vp + v * W));
      }
    }
    for (int64_t t = cn; !dot && t < cn4; ++t)  // padding rows: finite scores, replaced below
      for (int64_t v = 0; v < nv; ++v) vst(kf + t * D + v * W, vzero());
    for (int64_t g = 0; g < G; ++g) {
      // scores: s[g, t] = (scale * q_g) . k_t
      V q[kMaxNv];
      for (int64_t v = 0; v < nv; ++v) q[v] = vld_f32(qs + g * D + v * W);
      for (int64_t t = 0; !dot && t < cn4; t += 4) {
        const float* k0 = kf + t * D;
        V d0 = vmul(q[0], vld_f32(k0)), d1 = vmul(q[0], vld_f32(k0 + D));
        V d2 = vmul(q[0], vld_f32(k0 + 2 * D)), d3 = vmul(q[0], vld_f32(k0 + 3 * D));
        for (int64_t v = 1; v < nv; ++v) {
          d0 = vfma(q[v], vld_f32(k0 + v * W), d0);
          d1 = vfma(q[v], vld_f32(k0 + D + v * W), d1);
          d2 = vfma(q[v], vld_f32(k0 + 2 * D + v * W), d2);
          d3 = vfma(q[v], vld_f32(k0 + 3 * D + v * W), d3);
        }
        vsum4(d0, d1, d2, d3, &s[g][t]);
      }
      const float alpha = chunk_softmax(s[g], cn, &mx[g], &den[g]);
      V acc[kMaxNv];
      for (int64_t v = 0; v < nv; ++v) acc[v] = vld_f32(accs + g * D + v * W);
      if (alpha != 1.f) {
        const V va = vset1(alpha);
        for (int64_t v = 0; v < nv; ++v) acc[v] = vmul(acc[v], va);
      }
      // acc[g] += p[g, t] * v_t
      for (int64_t t = 0; t < cn; ++t) {
        const V p = vset1(s[g][t]);
        for (int64_t v = 0; v < nv; ++v) acc[v] = vfma(p, vld_f32(vf + t * D + v * W), acc[v]);
      }
      for (int64_t v = 0; v < nv; ++v) vst(accs + g * D + v * W, acc[v]);
    }
    cn = next_cn;
  }
  decode_task_finish<T>(a, task, seq, kvh, n_tok, G, D, nv, accs, mx, den);
}

// Vectors of queries and accumulators the register-resident task may hold (AVX-512: 32
// registers; AVX2: 16); beyond it they spill and the sweep is faster (Qwen2.5-Coder-1.5B's
// 6 heads x 128 dims: 96 vectors). The choice depends only on the model's shapes.
constexpr int64_t kRegBudget = W == 16 ? 24 : W == 8 ? 10 : 0;

#include "attn_blocked.h"

// T: the query's (and output's) element type, C: the caches'.
template <int T, int C, int NV>
inline void decode_task_t(const DecodeArgs& a, int64_t task) {
  const int64_t nv = NV > 0 ? NV : a.head_dim / W;
  if (2 * (a.num_heads / a.num_kv_heads) * nv <= kRegBudget) decode_task_regs<T, C, NV>(a, task);
  else if (W == 8 && nv % 4 == 0) decode_task_blocked<T, C, NV>(a, task);
  else decode_task_sweep<T, C, NV>(a, task);
}

template <int T, int C>
void decode_t(const DecodeArgs& a, int64_t task0, int64_t task1) {
  const int64_t nv = a.head_dim / W;
  for (int64_t task = task0; task < task1; ++task) {
    if (nv == 64 / W) decode_task_t<T, C, 64 / W>(a, task);
    else if (nv == 128 / W) decode_task_t<T, C, 128 / W>(a, task);
    else decode_task_t<T, C, 0>(a, task);
  }
}

// Partitions of (sequence, kv head) pairs [i0, i1) merged in partition order (a fixed tree:
// max, then the rescaled sums), for sequences longer than kDecodePart tokens.
template <int T>
void decode_combine_t(const DecodeArgs& a, int64_t i0, int64_t i1) {
  typedef typename Elem<T>::type E;
  const int64_t D = a.head_dim, HKV = a.num_kv_heads, G = a.num_heads / a.num_kv_heads;
  alignas(64) float row[kMaxHeadDim];
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t seq = i / HKV, kvh = i % HKV, n_tok = a.seq_lens[seq];
    if (n_tok <= kDecodePart) continue;
    const int64_t np = (n_tok + kDecodePart - 1) / kDecodePart;
    const float* base = a.partials + (a.seq_task0[seq] + kvh * np) * G * (D + 2);
    for (int64_t g = 0; g < G; ++g) {
      float m = -__builtin_inff();
      for (int64_t p = 0; p < np; ++p) {
        const float mp = base[p * G * (D + 2) + G * D + g];
        m = mp > m ? mp : m;
      }
      for (int64_t d = 0; d < D; ++d) row[d] = 0.f;
      float l = 0.f;
      for (int64_t p = 0; p < np; ++p) {
        const float* pp = base + p * G * (D + 2);
        const float w = __builtin_expf(pp[G * D + g] - m);
        l += w * pp[G * D + G + g];
        for (int64_t d = 0; d < D; ++d) row[d] += w * pp[g * D + d];
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      E* o = static_cast<E*>(a.out) + (seq * a.num_heads + kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = Elem<T>::store(row[d] * inv);
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
// Elements rounded to E and widened back (vround_bf16 / vround_f16 of the TU), and stores of
// W elements as E (vst_bf16 / vst_f16).
template <int T>
inline V vround(V v) {
  if constexpr (T == kF32) return v;
  else if constexpr (T == kBF16) return vround_bf16(v);
  else return vround_f16(v);
}
template <int T>
inline void vst_e(typename Elem<T>::type* p, V v) {
  if constexpr (T == kF32) vst(p, v);
  else if constexpr (T == kBF16) vst_bf16(p, v);
  else vst_f16(p, v);
}

// Tasks are (row, column block of kSiluBlock): one decode row still spreads over the threads.
template <int T>
void silu_t(const SiluArgs& a, int64_t task0, int64_t task1) {
  typedef typename Elem<T>::type E;
  const int64_t I = a.inter, nb = (I + kSiluBlock - 1) / kSiluBlock;
  const V one = vset1(1.f), zero = vzero();
  for (int64_t task = task0; task < task1; ++task) {
    const int64_t r = task / nb, c0 = task % nb * kSiluBlock;
    const int64_t c1 = I < c0 + kSiluBlock ? I : c0 + kSiluBlock;
    const int64_t cv = c0 + (c1 - c0) / W * W;
    const E* g = static_cast<const E*>(a.x) + r * a.x_s0;
    const E* u = g + I;
    E* o = static_cast<E*>(a.out) + r * I;
    // silu rounded to E first, then the product (the reference's F.silu(gate) * up)
    for (int64_t i = c0; i < cv; i += W) {
      const V x = vld<T>(g + i);
      const V sl = vround<T>(vdiv(x, vadd(one, vexp(vsub(zero, x)))));
      vst_e<T>(o + i, vmul(sl, vld<T>(u + i)));
    }
    for (int64_t i = cv; i < c1; ++i) {
      const float x = Elem<T>::load(g[i]);
      const float s1 = Elem<T>::load(Elem<T>::store(x / (1.f + __builtin_expf(-x))));
      o[i] = Elem<T>::store(s1 * Elem<T>::load(u[i]));
    }
  }
}


// The query's dtype with caches of the same one, or an fp32 query over 16-bit caches (an fp32
// engine's half-size KV cache; the launcher admits no other pair).
void decode_any(const DecodeArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32 && a.cache_dtype == kF16) decode_t<kF32, kF16>(a, i0, i1);
  else if (a.dtype == kF32 && a.cache_dtype == kBF16) decode_t<kF32, kBF16>(a, i0, i1);
  else if (a.dtype == kF32) decode_t<kF32, kF32>(a, i0, i1);
  else if (a.dtype == kBF16) decode_t<kBF16, kBF16>(a, i0, i1);
  else decode_t<kF16, kF16>(a, i0, i1);
}
void decode_combine_any(const DecodeArgs& a, int64_t i0, int64_t i1) {
  if (a.dtype == kF32) decode_combine_t<kF32>(a, i0, i1);
  else if (a.dtype == kBF16) decode_combine_t<kBF16>(a, i0, i1);
  else decode_combine_t<kF16>(a, i0, i1);
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

const AttnKernels kKernels = {decode_any, decode_combine_any, norm_any, rope_any, silu_any};
