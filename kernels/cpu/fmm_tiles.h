// ISA-generic tiles of the float-weight matmul (fmm.h), included by fmm_{scalar,avx2,avx512}.cpp
// INSIDE an anonymous namespace after they define, for their ISA:
//   VF (float vector), W (lanes), vzero(), vload(const float*), vfma(a, b, c) = a * b + c,
//   vsum(v) (a fixed reduction tree), wload<WT>(const void* w, int64_t i) (W weights from
//   element i, widened exactly to fp32), wone<WT>(w, i) (one weight), kMaxRows (activation
//   rows per tile) and nt_for(rows) (output columns per tile for that many rows); for the
//   transposed layout also vset1(f), vstore(p, v), vadd(a, b), sfma(a, b, c) (the scalar
//   twin of one vfma lane) and ntt_for(rows) (column VECTORS per transposed tile); for bf16
//   weights wsplit(p, even, odd) (2W weights from p, even and odd columns widened) and
//   nt_pair_for(rows). A TU that defines FMM_DOT (fmm_dot.cpp) gets only the bf16 pair tiles,
//   with VW, wraw(p) (2W raw bf16) and vdot(acc, w, x) in place of wsplit and the two fmas.
//
// A tile computes NT output columns x MT activation rows: per W-wide step of k it loads and
// widens each of its NT weight vectors once for all MT rows (so a weight row is read from
// memory once per call, not once per row), then one FMA per (column, row). Each (n, m) output
// has its own accumulator vector updated in k order whatever NT and MT are, reduced once by
// vsum, then the K % W tail and the bias added in order: batch and thread invariant (fmm.h).

template <int WT, int NT, int MT>
inline void fmm_tile(const FmmArgs& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kv = K / W * W, ldw = a.ldw;
  const float* x = a.x + m0 * K;
  VF acc[NT][MT];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < MT; ++r) acc[t][r] = vzero();
  for (int64_t k = 0; k < Kv; k += W) {
    VF wv[NT];
    for (int t = 0; t < NT; ++t) wv[t] = wload<WT>(a.w, (n + t) * ldw + k);
    for (int r = 0; r < MT; ++r) {
      const VF xv = vload(x + r * K + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = vfma(wv[t], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < MT; ++r) {
      float s = vsum(acc[t][r]);
      for (int64_t k = Kv; k < K; ++k) s += x[r * K + k] * wone<WT>(a.w, (n + t) * ldw + k);
      if (a.bias) s += a.bias[n + t];
      a.out[(m0 + r) * a.N + n + t] = s;
    }
  }
}

// bf16 weights in pair order (fmm.h): per 2W columns two fmas per lane, odd column first; x
// holds each full block as [W even | W odd] (the tail unpermuted). FMM_DOT: one vdpbf16ps on
// the raw bf16 x instead (vdot(acc, w, x) and wraw(p) from the including TU).
template <int NT, int MT>
inline void fmm_tile_pair(const FmmArgs& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, Kv = K / (2 * W) * (2 * W), ldw = a.ldw;
  const float* x = a.x + m0 * K;
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  VF acc[NT][MT];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < MT; ++r) acc[t][r] = vzero();
  for (int64_t k = 0; k < Kv; k += 2 * W) {
#ifdef FMM_DOT
    VW wr[NT];
    for (int t = 0; t < NT; ++t) wr[t] = wraw(w + (n + t) * ldw + k);
    for (int r = 0; r < MT; ++r) {
      const VW xr = wraw(a.xbf + (m0 + r) * K + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = vdot(acc[t][r], wr[t], xr);
    }
#else
    VF we[NT], wo[NT];
    for (int t = 0; t < NT; ++t) wsplit(w + (n + t) * ldw + k, we[t], wo[t]);
    for (int r = 0; r < MT; ++r) {
      const VF xe = vload(x + r * K + k), xo = vload(x + r * K + k + W);
      for (int t = 0; t < NT; ++t) {
        acc[t][r] = vfma(wo[t], xo, acc[t][r]);
        acc[t][r] = vfma(we[t], xe, acc[t][r]);
      }
    }
#endif
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < MT; ++r) {
      float s = vsum(acc[t][r]);
      for (int64_t k = Kv; k < K; ++k) s += x[r * K + k] * wone<kFmmBF16>(a.w, (n + t) * ldw + k);
      if (a.bias) s += a.bias[n + t];
      a.out[(m0 + r) * a.N + n + t] = s;
    }
  }
}

// Columns [n, n + nb) (nb <= kFmmBlock) of MT rows from m0: tiles of nt_for(MT) columns
// (nt_pair_for for bf16), the remainder one column at a time (the same per-output arithmetic).
template <int WT, int MT>
inline void fmm_rows(const FmmArgs& a, int64_t n, int64_t nb, int64_t m0) {
  int64_t c = 0;
  if constexpr (WT == kFmmBF16) {
    constexpr int NT = nt_pair_for(MT);
    for (; c + NT <= nb; c += NT) fmm_tile_pair<NT, MT>(a, n + c, m0);
    for (; c < nb; ++c) fmm_tile_pair<1, MT>(a, n + c, m0);
  } else {
    constexpr int NT = nt_for(MT);
    for (; c + NT <= nb; c += NT) fmm_tile<WT, NT, MT>(a, n + c, m0);
    for (; c < nb; ++c) fmm_tile<WT, 1, MT>(a, n + c, m0);
  }
}

template <int WT, int R>
inline void fmm_dispatch_rows(int64_t rows, const FmmArgs& a, int64_t n, int64_t nb,
                              int64_t m0) {
  if constexpr (R > 0) {
    if (rows == R) fmm_rows<WT, R>(a, n, nb, m0);
    else fmm_dispatch_rows<WT, R - 1>(rows, a, n, nb, m0);
  }
}

// Output columns [n0, n1) for all rows: blocks of kFmmBlock columns, each block's weight rows
// walked by every group of up to kMaxRows activation rows (after the first group they come
// from cache).
template <int WT>
void fmm_cols(const FmmArgs& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += kFmmBlock) {
    const int64_t nb = n1 - n < kFmmBlock ? n1 - n : kFmmBlock;
    for (int64_t m0 = 0; m0 < a.M; m0 += kMaxRows) {
      const int64_t rows = a.M - m0 < kMaxRows ? a.M - m0 : kMaxRows;
      fmm_dispatch_rows<WT, kMaxRows>(rows, a, n, nb, m0);
    }
  }
}

#ifndef FMM_DOT
inline void fmm_all(const FmmArgs& a, int64_t n0, int64_t n1) {
  switch (a.wtype) {
    case kFmmBF16: fmm_cols<kFmmBF16>(a, n0, n1); break;
    case kFmmF16: fmm_cols<kFmmF16>(a, n0, n1); break;
    default: fmm_cols<kFmmF32>(a, n0, n1); break;
  }
}
#endif

#ifndef FMM_DOT
// ---- transposed layout (fp32 weight_t [K, N]): x broadcast, W output columns per vector ----

// The transposed tiles walk K in chunks [k0, k1) over all of a task's columns (so each weight
// row's slice of the task is read contiguously, not one 4 KB page per k and tile); between
// chunks the fp32 accumulators wait in `out` unchanged, so the sums are the same for every
// chunking. first: start from zero; last: add the bias.
struct KSpan {
  int64_t k0, k1;
  bool first, last;
};

template <int NT, int MT>
inline void fmmt_tile(const FmmArgs& a, int64_t n, int64_t m0, const KSpan& ks) {
  const int64_t K = a.K, ldw = a.ldw;
  const float* x = a.x + m0 * K;
  const float* w = static_cast<const float*>(a.w) + n;
  float* out = a.out + m0 * a.N + n;
  VF acc[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = ks.first ? vzero() : vload(out + r * a.N + t * W);
  for (int64_t k = ks.k0; k < ks.k1; ++k) {
    VF wv[NT];
    for (int t = 0; t < NT; ++t) wv[t] = vload(w + k * ldw + t * W);
    for (int r = 0; r < MT; ++r) {
      const VF xb = vset1(x[r * K + k]);
      for (int t = 0; t < NT; ++t) acc[r][t] = vfma(wv[t], xb, acc[r][t]);
    }
  }
  for (int r = 0; r < MT; ++r)
    for (int t = 0; t < NT; ++t) {
      VF v = acc[r][t];
      if (ks.last && a.bias) v = vadd(v, vload(a.bias + n + t * W));
      vstore(out + r * a.N + t * W, v);
    }
}

// One column, the scalar twin of a vector lane (columns past the last full vector).
inline void fmmt_col(const FmmArgs& a, int64_t n, int64_t m0, int64_t rows, const KSpan& ks) {
  const float* w = static_cast<const float*>(a.w) + n;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.x + (m0 + r) * a.K;
    float* o = a.out + (m0 + r) * a.N + n;
    float s = ks.first ? 0.f : *o;
    for (int64_t k = ks.k0; k < ks.k1; ++k) s = sfma(w[k * a.ldw], x[k], s);
    if (ks.last && a.bias) s = s + a.bias[n];
    *o = s;
  }
}

template <int MT>
inline void fmmt_rows(const FmmArgs& a, int64_t n, int64_t nb, int64_t m0, const KSpan& ks) {
  constexpr int NT = ntt_for(MT);
  int64_t c = 0;
  for (; c + NT * W <= nb; c += NT * W) fmmt_tile<NT, MT>(a, n + c, m0, ks);
  for (; c + W <= nb; c += W) fmmt_tile<1, MT>(a, n + c, m0, ks);
  for (; c < nb; ++c) fmmt_col(a, n + c, m0, MT, ks);
}

template <int R>
inline void fmmt_dispatch_rows(int64_t rows, const FmmArgs& a, int64_t n, int64_t nb,
                               int64_t m0, const KSpan& ks) {
  if constexpr (R > 0) {
    if (rows == R) fmmt_rows<R>(a, n, nb, m0, ks);
    else fmmt_dispatch_rows<R - 1>(rows, a, n, nb, m0, ks);
  }
}

constexpr int64_t kFmmKChunk = 256;  // weight rows per K chunk of the transposed tiles

inline void fmmt_all(const FmmArgs& a, int64_t n0, int64_t n1) {
  for (int64_t k0 = 0; k0 < a.K; k0 += kFmmKChunk) {
    const int64_t k1 = a.K - k0 < kFmmKChunk ? a.K : k0 + kFmmKChunk;
    const KSpan ks{k0, k1, k0 == 0, k1 == a.K};
    for (int64_t n = n0; n < n1; n += kFmmBlockT) {
      const int64_t nb = n1 - n < kFmmBlockT ? n1 - n : kFmmBlockT;
      for (int64_t m0 = 0; m0 < a.M; m0 += kMaxRows) {
        const int64_t rows = a.M - m0 < kMaxRows ? a.M - m0 : kMaxRows;
        fmmt_dispatch_rows<kMaxRows>(rows, a, n, nb, m0, ks);
      }
    }
  }
}
#endif  // FMM_DOT
