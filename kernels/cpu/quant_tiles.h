// ISA-generic tiles of the quantized matmuls, included by quant_avx2.cpp / quant_avx512.cpp
// INSIDE an anonymous namespace after they define (for their ISA):
//   VF (float vector), W (lanes), vzero(), vset1(f), vload(p), vstore(p, v), vfma(a, b, c),
//   vsum(v),
//   P4 prep4(s, m)                 : per (row, group) state of the int4 dequantization
//   deq4_32(p, P4, out[32 / W])    : a block's 16 bytes -> its 32 weights q * s + m, in the
//                                    permuted activation order of quant.h
//   deq8_16(p, s, m, has_min, out[16 / W]): 16 int8 -> q * s (+ m)
// and three tile shapes (NT_A, MT_A), (NT_B, MT_B), (NT_C, MT_C): output columns x activation
// rows per tile, taken for M <= MT_A, M <= MT_B and larger M.
//
// Every (n, m) output has ONE vector accumulator updated in k order (and, for int8 groups
// that are not a multiple of 16 wide, one scalar accumulator for the group tails), reduced
// once at the end by vsum: the result depends on neither M nor the tiling (batch invariance).
// Each weight tile is loaded and dequantized once for all the tile's rows.
//
// K blocking: with several activation rows, x would not stay in L1 over a whole row of K, so
// the groups are walked in chunks whose activations fit in kXChunkBytes, over a strip of
// kStrip output columns at a time; between chunks each (n, m) accumulator VECTOR is parked in
// a per-thread buffer and reloaded, unchanged, so the sum is the same for every chunking.

template <bool HALF>
inline float ldsc(const void* p, int64_t i) {
  if constexpr (HALF) return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

// Groups whose fp16 scales / mins are widened at a time into a tile's stack buffer.
constexpr int kScaleChunk = 64;

// fp16 [n] -> fp32 (exact), 4 at a time with F16C.
inline void widen_half(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm_storeu_ps(dst + i, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

// Two-level scales (quant.h's `super`): groups [g0, g0 + n) of one row, dst[i] = the
// super-block's d (which = 0) or -dmin (1), fp16 widened exactly, times the uint8 v[i].
inline void widen_k(const uint8_t* v, const uint16_t* sup, int64_t g0, int64_t n, int which,
                    float* dst) {
  int64_t i = 0;
  for (; i < n && (g0 + i) % 8; ++i)  // up to the next super-block
    dst[i] = _cvtsh_ss(sup[((g0 + i) / 8) * 2 + which]) * static_cast<float>(v[i]);
  for (; i + 8 <= n; i += 8) {  // whole super-blocks: 8 products at once
    const __m256 q = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + i))));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(
        q, _mm256_set1_ps(_cvtsh_ss(sup[((g0 + i) / 8) * 2 + which]))));
  }
  for (; i < n; ++i)
    dst[i] = _cvtsh_ss(sup[((g0 + i) / 8) * 2 + which]) * static_cast<float>(v[i]);
}

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

// Column n's fp32 scales and mins for groups [g0, g0 + gn) (gn <= kScaleChunk): pointers into
// the layer's own fp32 arrays (SK 0), or sbuf / mbuf filled with the exactly widened fp16
// (SK 1) or two-level (SK 2) values.
template <int SK>
inline void int4_group_scales(const QuantArgs& a, int64_t n, int64_t g0, int64_t gn,
                              float* sbuf, float* mbuf, const float** sp, const float** mp) {
  const int64_t ng = a.ngroups;
  if constexpr (SK == 2) {
    const uint16_t* sup = a.super + n * (ng / 8) * 2;
    widen_k(static_cast<const uint8_t*>(a.scales) + n * ng + g0, sup, g0, gn, 0, sbuf);
    widen_k(static_cast<const uint8_t*>(a.mins) + n * ng + g0, sup, g0, gn, 1, mbuf);
    *sp = sbuf;
    *mp = mbuf;
  } else if constexpr (SK == 1) {
    widen_half(static_cast<const uint16_t*>(a.scales) + n * ng + g0, sbuf, gn);
    widen_half(static_cast<const uint16_t*>(a.mins) + n * ng + g0, mbuf, gn);
    *sp = sbuf;
    *mp = mbuf;
  } else {
    *sp = static_cast<const float*>(a.scales) + n * ng + g0;
    *mp = static_cast<const float*>(a.mins) + n * ng + g0;
  }
}

// The groups [g0, g1) of one tile. first: accumulators start at zero (else reload from
// save); last: reduce into out (else park in save). save[t * ld + m] for output n + t, row m.
struct Span {
  int64_t g0, g1;
  bool first, last;
  VF* save;
  float* tsave;
  int64_t ld;
};

template <int nt, int mt>
inline void span_begin(const Span& sp, int64_t m0, VF (&acc)[nt][mt]) {
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) acc[t][r] = sp.first ? vzero() : sp.save[t * sp.ld + m0 + r];
}

// SK: the scales' kind: 0 fp32, 1 fp16, 2 two-level (uint8 + super, quant.h).
template <int nt, int mt, int SK>
inline void int4_tile(const QuantArgs& a, int64_t n, int64_t m0, const Span& span) {
  constexpr bool HALF = SK == 1, WIDEN = SK != 0;
  const uint8_t* qw = static_cast<const uint8_t*>(a.qweight);
  const int64_t K = a.K, ldq = a.K / 2, G = a.group_size, ng = a.ngroups;
  const int64_t sz = SK == 2 ? 1 : HALF ? 2 : 4;
  const bool more = n + 2 * nt <= a.N && m0 + mt >= a.M;  // prefetch the next tile
  VF acc[nt][mt];
  span_begin<nt, mt>(span, m0, acc);
  for (int64_t g0 = span.g0; g0 < span.g1; g0 += kScaleChunk) {
    const int64_t gn = span.g1 - g0 < kScaleChunk ? span.g1 - g0 : kScaleChunk;
    float sbuf[WIDEN ? nt : 1][WIDEN ? kScaleChunk : 1];
    float mbuf[WIDEN ? nt : 1][WIDEN ? kScaleChunk : 1];
    const float* sp[nt];
    const float* mp[nt];
    for (int t = 0; t < nt; ++t)
      int4_group_scales<SK>(a, n + t, g0, gn, sbuf[t], mbuf[t], &sp[t], &mp[t]);
    for (int64_t gi = 0; gi < gn; ++gi) {
      const int64_t g = g0 + gi;
      P4 pr[nt];
      for (int t = 0; t < nt; ++t) pr[t] = prep4(sp[t][gi], mp[t][gi]);
      if (more && (g * nt * sz) % 64 < nt * sz) {  // the next tile's scales and mins
        prefetch(static_cast<const char*>(a.scales) + ((n + nt) * ng + g * nt) * sz);
        prefetch(static_cast<const char*>(a.mins) + ((n + nt) * ng + g * nt) * sz);
      }
      for (int64_t kb = g * G; kb < (g + 1) * G; kb += 32) {
        if (more && kb % 128 == 0)  // its rows' next cache line
          for (int t = 0; t < nt; ++t) prefetch(qw + (n + nt + t) * ldq + kb / 2);
#pragma GCC unroll 4
        for (int t = 0; t < nt; ++t) {
          VF w[32 / W];
          deq4_32(qw + (n + t) * ldq + kb / 2, pr[t], w);
#pragma GCC unroll 16
          for (int r = 0; r < mt; ++r) {
            const float* xr = a.x + (kb / 32 * a.M + m0 + r) * 32;  // [K / 32][M][32]
#pragma GCC unroll 4
            for (int v = 0; v < 32 / W; ++v) acc[t][r] = vfma(w[v], vload(xr + v * W), acc[t][r]);
          }
        }
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) {
      if (span.last) a.out[(m0 + r) * a.N + n + t] = vsum(acc[t][r]);
      else span.save[t * span.ld + m0 + r] = acc[t][r];
    }
}

template <int nt, int mt, bool has_min, bool HALF>
inline void int8_tile(const QuantArgs& a, int64_t n, int64_t m0, const Span& span) {
  constexpr int V = 16 / W;  // vectors per 16 weights
  const int8_t* qw = static_cast<const int8_t*>(a.qweight);
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups, gv = G / 16 * 16;
  VF acc[nt][mt];
  float tail[nt][mt];
  span_begin<nt, mt>(span, m0, acc);
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) tail[t][r] = span.first ? 0.0f : span.tsave[t * span.ld + m0 + r];
  for (int64_t g = span.g0; g < span.g1; ++g) {
    float sc[nt], mnf[nt];
    VF s[nt], mn[nt];
    for (int t = 0; t < nt; ++t) {
      sc[t] = ldsc<HALF>(a.scales, (n + t) * ng + g);
      mnf[t] = has_min ? ldsc<HALF>(a.mins, (n + t) * ng + g) : 0.0f;
      s[t] = vset1(sc[t]);
      mn[t] = vset1(mnf[t]);
    }
    const int64_t k0 = g * G;
    for (int64_t kb = k0; kb < k0 + gv; kb += 16) {
      VF w[nt][V];
      for (int t = 0; t < nt; ++t) deq8_16(qw + (n + t) * K + kb, s[t], mn[t], has_min, w[t]);
      for (int r = 0; r < mt; ++r) {
        const float* xr = a.x + (m0 + r) * K + kb;
        for (int v = 0; v < V; ++v) {
          VF xv = vload(xr + v * W);
          for (int t = 0; t < nt; ++t) acc[t][r] = vfma(w[t][v], xv, acc[t][r]);
        }
      }
    }
    for (int64_t k = k0 + gv; k < k0 + G; ++k) {  // group tail (G not a multiple of 16)
      for (int t = 0; t < nt; ++t) {
        const float q = static_cast<float>(qw[(n + t) * K + k]);
        const float w = has_min ? __builtin_fmaf(q, sc[t], mnf[t]) : q * sc[t];
        for (int r = 0; r < mt; ++r)
          tail[t][r] = __builtin_fmaf(w, a.x[(m0 + r) * K + k], tail[t][r]);
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) {
      if (span.last) {
        a.out[(m0 + r) * a.N + n + t] = vsum(acc[t][r]) + tail[t][r];
      } else {
        span.save[t * span.ld + m0 + r] = acc[t][r];
        span.tsave[t * span.ld + m0 + r] = tail[t][r];
      }
    }
}

// The remainder tile of exactly `left` (< mt) rows.
template <int nt, int mt, class Tile>
inline void rest_rows(const QuantArgs& a, int64_t n, int64_t m0, int64_t left, const Span& sp) {
  if constexpr (mt >= 1) {
    if (left == mt) Tile::template run<nt, mt>(a, n, m0, sp);
    else rest_rows<nt, mt - 1, Tile>(a, n, m0, left, sp);
  }
}

// All M rows for output columns [n, n + nt): full mt-row tiles, then the remainder.
template <int nt, int mt, class Tile>
inline void rows_for(const QuantArgs& a, int64_t n, const Span& sp) {
  int64_t m0 = 0;
  for (; m0 + mt <= a.M; m0 += mt) Tile::template run<nt, mt>(a, n, m0, sp);
  if (a.M > m0) rest_rows<nt, mt - 1, Tile>(a, n, m0, a.M - m0, sp);
}

template <int SK>
struct Int4Tile {
  template <int nt, int mt>
  static void run(const QuantArgs& a, int64_t n, int64_t m0, const Span& sp) {
    int4_tile<nt, mt, SK>(a, n, m0, sp);
  }
};
template <bool has_min, bool HALF>
struct Int8Tile {
  template <int nt, int mt>
  static void run(const QuantArgs& a, int64_t n, int64_t m0, const Span& sp) {
    int8_tile<nt, mt, has_min, HALF>(a, n, m0, sp);
  }
};

constexpr int64_t kXChunkBytes = 24 * 1024;  // activations of one K chunk (L1 is 32-48 KiB)
constexpr int64_t kStrip = 64;               // output columns per strip when K is chunked

// Output columns [n0, n1) in tiles of nt (then single columns), groups [g0, g1).
template <int nt, int mt, class Tile>
inline void cols_for(const QuantArgs& a, int64_t n0, int64_t n1, Span sp, VF* save,
                     float* tsave) {
  int64_t n = n0;
  for (; n + nt <= n1; n += nt) {
    sp.save = save + (n - n0) * a.M;
    sp.tsave = tsave + (n - n0) * a.M;
    rows_for<nt, mt, Tile>(a, n, sp);
  }
  for (; n < n1; ++n) {
    sp.save = save + (n - n0) * a.M;
    sp.tsave = tsave + (n - n0) * a.M;
    rows_for<1, mt, Tile>(a, n, sp);
  }
}

// Groups per K span with M activation rows (their fp32 span fits kXChunkBytes; at least 1, at
// most all ngroups).
inline int64_t span_groups(const QuantArgs& a) {
  const int64_t gk = kXChunkBytes / (4 * a.M * a.group_size);
  return gk < 1 ? 1 : gk < a.ngroups ? gk : a.ngroups;
}

// Output columns [n0, n1) walked as cols(ns, ne, span, save, tsave): one call over every column
// and all of K when the activations fit, else strips of kStrip columns by K spans, the
// accumulators parked in save / tsave (per strip column, M each) between spans.
template <class Cols>
inline void walk_spans(const QuantArgs& a, int64_t n0, int64_t n1, Cols&& cols) {
  const int64_t ng = a.ngroups, gk = span_groups(a);
  if (gk >= ng) {
    cols(n0, n1, Span{0, ng, true, true, nullptr, nullptr, a.M}, nullptr, nullptr);
    return;
  }
  // plain new[] (a library call): no std:: template is instantiated in an ISA unit
  VF* save = new VF[kStrip * a.M];
  float* tsave = new float[kStrip * a.M];
  for (int64_t ns = n0; ns < n1; ns += kStrip) {
    const int64_t ne = ns + kStrip < n1 ? ns + kStrip : n1;
    for (int64_t g0 = 0; g0 < ng; g0 += gk) {
      const int64_t g1 = g0 + gk < ng ? g0 + gk : ng;
      cols(ns, ne, Span{g0, g1, g0 == 0, g1 == ng, nullptr, nullptr, a.M}, save, tsave);
    }
  }
  delete[] save;
  delete[] tsave;
}

template <int nt, int mt, class Tile>
inline void chunked(const QuantArgs& a, int64_t n0, int64_t n1) {
  walk_spans(a, n0, n1, [&](int64_t ns, int64_t ne, const Span& sp, VF* save, float* tsave) {
    cols_for<nt, mt, Tile>(a, ns, ne, sp, save, tsave);
  });
}

// The tile shape for this M (neither the tiling nor the chunking changes a result).
template <class Tile>
inline void all_rows(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.M <= MT_A) chunked<NT_A, MT_A, Tile>(a, n0, n1);
  else if (a.M <= MT_B) chunked<NT_B, MT_B, Tile>(a, n0, n1);
  else chunked<NT_C, MT_C, Tile>(a, n0, n1);
}

template <template <bool> class T>
inline void dispatch_half(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.half) all_rows<T<true>>(a, n0, n1);
  else all_rows<T<false>>(a, n0, n1);
}

inline void int4_all(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.super) all_rows<Int4Tile<2>>(a, n0, n1);
  else if (a.half) all_rows<Int4Tile<1>>(a, n0, n1);
  else all_rows<Int4Tile<0>>(a, n0, n1);
}
template <bool H> using Int8TileMin = Int8Tile<true, H>;
template <bool H> using Int8TileNoMin = Int8Tile<false, H>;
inline void int8_all(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.mins) dispatch_half<Int8TileMin>(a, n0, n1);
  else dispatch_half<Int8TileNoMin>(a, n0, n1);
}

// ---- int4 with many rows (a short prompt's 16-row chunks): each weight dequantized once ----
// int4_tile dequantizes a tile's weights into registers for mt rows, so 9..16 rows pay the
// dequantization twice and every FMA reloads an activation vector. Here the weights of nt
// columns over a span are dequantized once (deq4_32: the same values, in the same permuted
// order) into a per-thread buffer that stays in L1, and row tiles of mt rows read them: per
// vector of k, nt weight loads and mt activation loads feed nt * mt FMAs. Each (n, m)
// accumulator still takes its FMAs in k order, one vector per 8 (W) columns, so the result is
// int4_tile's bit for bit (batch invariance holds across both).

// The dequantized weights of column n over groups [g0, g1) -> wb [(g1 - g0) * G] fp32.
template <int SK>
inline void int4_deq_col(const QuantArgs& a, int64_t n, int64_t g0, int64_t g1, float* wb) {
  constexpr bool WIDEN = SK != 0;
  const uint8_t* qw = static_cast<const uint8_t*>(a.qweight) + n * (a.K / 2);
  const int64_t G = a.group_size;
  for (int64_t c0 = g0; c0 < g1; c0 += kScaleChunk) {
    const int64_t gn = g1 - c0 < kScaleChunk ? g1 - c0 : kScaleChunk;
    float sbuf[WIDEN ? kScaleChunk : 1];
    float mbuf[WIDEN ? kScaleChunk : 1];
    const float* sp;
    const float* mp;
    int4_group_scales<SK>(a, n, c0, gn, sbuf, mbuf, &sp, &mp);
    for (int64_t gi = 0; gi < gn; ++gi) {
      const P4 pr = prep4(sp[gi], mp[gi]);
      const int64_t g = c0 + gi;
      for (int64_t kb = g * G; kb < (g + 1) * G; kb += 32) {
        VF w[32 / W];
        deq4_32(qw + kb / 2, pr, w);
        float* o = wb + (kb - g0 * G);
        for (int v = 0; v < 32 / W; ++v) vstore(o + v * W, w[v]);
      }
    }
  }
}

// Rows [m0, m0 + mt) of columns [n, n + nt) over the span, weights from wb [nt][ldw].
template <int nt, int mt>
inline void int4_buf_tile(const QuantArgs& a, const float* wb, int64_t ldw, int64_t n,
                          int64_t m0, const Span& span) {
  VF acc[nt][mt];
  span_begin<nt, mt>(span, m0, acc);
  const int64_t k0 = span.g0 * a.group_size, k1 = span.g1 * a.group_size;
  for (int64_t kb = k0; kb < k1; kb += 32) {
    const float* xb = a.x + (kb / 32 * a.M + m0) * 32;  // [K / 32][M][32]
    const float* wk = wb + (kb - k0);
#pragma GCC unroll 4
    for (int v = 0; v < 32 / W; ++v) {
      VF w[nt];
      for (int t = 0; t < nt; ++t) w[t] = vload(wk + t * ldw + v * W);
#pragma GCC unroll 16
      for (int r = 0; r < mt; ++r) {
        VF xv = vload(xb + r * 32 + v * W);
        __asm__("" : "+v"(xv));  // one load per activation vector, kept in a register
        for (int t = 0; t < nt; ++t) acc[t][r] = vfma(w[t], xv, acc[t][r]);
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) {
      if (span.last) a.out[(m0 + r) * a.N + n + t] = vsum(acc[t][r]);
      else span.save[t * span.ld + m0 + r] = acc[t][r];
    }
}

// The last `left` (< mt) rows.
template <int nt, int mt>
inline void int4_buf_rest(const QuantArgs& a, const float* wb, int64_t ldw, int64_t n,
                          int64_t m0, int64_t left, const Span& sp) {
  if constexpr (mt >= 1) {
    if (left == mt) int4_buf_tile<nt, mt>(a, wb, ldw, n, m0, sp);
    else int4_buf_rest<nt, mt - 1>(a, wb, ldw, n, m0, left, sp);
  }
}

// Columns [n, n + nt) over one span: dequantize, then every row.
template <int nt, int mt, int SK>
inline void int4_buf_cols(const QuantArgs& a, float* wb, int64_t ldw, int64_t n,
                          const Span& sp) {
  // the next columns' bytes of this span arrive while these rows are multiplied
  const int64_t b0 = sp.g0 * a.group_size / 2, b1 = sp.g1 * a.group_size / 2;
  for (int t = 0; t < nt; ++t) int4_deq_col<SK>(a, n + t, sp.g0, sp.g1, wb + t * ldw);
  if (n + 2 * nt <= a.N)
    for (int t = nt; t < 2 * nt; ++t)
      for (int64_t b = b0; b < b1; b += 64)
        prefetch(static_cast<const uint8_t*>(a.qweight) + (n + t) * (a.K / 2) + b);
  int64_t m0 = 0;
  for (; m0 + mt <= a.M; m0 += mt) int4_buf_tile<nt, mt>(a, wb, ldw, n, m0, sp);
  if (a.M > m0) int4_buf_rest<nt, mt - 1>(a, wb, ldw, n, m0, a.M - m0, sp);
}

// int4 output columns [n0, n1) for any M, walked as `chunked` walks them (walk_spans).
template <int nt, int mt, int SK>
inline void int4_many_sk(const QuantArgs& a, int64_t n0, int64_t n1) {
  const int64_t ldw = span_groups(a) * a.group_size;
  // 64-byte aligned (each column's ldw is a multiple of 32 floats): no load splits a line
  float* wb_raw = new float[nt * ldw + 16];
  float* wb = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(wb_raw) + 63) &
                                       ~uintptr_t(63));
  walk_spans(a, n0, n1, [&](int64_t ns, int64_t ne, Span sp, VF* save, float*) {
    int64_t n = ns;
    for (; n + nt <= ne; n += nt) {
      sp.save = save ? save + (n - ns) * a.M : nullptr;
      int4_buf_cols<nt, mt, SK>(a, wb, ldw, n, sp);
    }
    for (; n < ne; ++n) {
      sp.save = save ? save + (n - ns) * a.M : nullptr;
      int4_buf_cols<1, mt, SK>(a, wb, ldw, n, sp);
    }
  });
  delete[] wb_raw;
}

template <int nt, int mt>
inline void int4_many(const QuantArgs& a, int64_t n0, int64_t n1) {
  if (a.super) int4_many_sk<nt, mt, 2>(a, n0, n1);
  else if (a.half) int4_many_sk<nt, mt, 1>(a, n0, n1);
  else int4_many_sk<nt, mt, 0>(a, n0, n1);
}
