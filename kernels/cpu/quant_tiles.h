// ISA-generic tiles of the quantized matmuls, included by quant_avx2.cpp / quant_avx512.cpp
// INSIDE an anonymous namespace after they define (for their ISA):
//   VF (float vector), W (lanes), vzero(), vset1(f), vload(p), vfma(a, b, c), vsum(v),
//   deq4_16(p, high, s, m, out[16 / W])  : 16 nibbles (low or high of 16 bytes) -> q * s + m
//   deq8_16(p, s, m, has_min, out[16 / W]): 16 int8 -> q * s (+ m)
// and NT (output rows per tile) and MT (activation rows per tile).
//
// Every (n, m) output has ONE vector accumulator updated in k order (and, for int8 groups
// that are not a multiple of 16 wide, one scalar accumulator for the group tails), reduced
// once at the end: the result depends on neither M nor the tiling (batch invariance).

constexpr int V = 16 / W;  // vectors per 16 weights

template <int nt, int mt>
inline void int4_tile(const QuantArgs& a, int64_t n, int64_t m0) {
  const uint8_t* qw = static_cast<const uint8_t*>(a.qweight);
  const int64_t K = a.K, ldq = a.K / 2, G = a.group_size, ng = a.ngroups;
  VF acc[nt][mt];
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) acc[t][r] = vzero();
  for (int64_t g = 0; g < ng; ++g) {
    VF s[nt], mn[nt];
    for (int t = 0; t < nt; ++t) {
      s[t] = vset1(a.scales[(n + t) * ng + g]);
      mn[t] = vset1(a.mins[(n + t) * ng + g]);
    }
    for (int64_t kb = g * G; kb < (g + 1) * G; kb += 32) {
      for (int h = 0; h < 2; ++h) {
        VF w[nt][V];
        for (int t = 0; t < nt; ++t) deq4_16(qw + (n + t) * ldq + kb / 2, h, s[t], mn[t], w[t]);
        for (int r = 0; r < mt; ++r) {
          const float* xr = a.x + (m0 + r) * K + kb + 16 * h;
          for (int v = 0; v < V; ++v) {
            VF xv = vload(xr + v * W);
            for (int t = 0; t < nt; ++t) acc[t][r] = vfma(w[t][v], xv, acc[t][r]);
          }
        }
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) a.out[(m0 + r) * a.N + n + t] = vsum(acc[t][r]);
}

template <int nt, int mt, bool has_min>
inline void int8_tile(const QuantArgs& a, int64_t n, int64_t m0) {
  const int8_t* qw = static_cast<const int8_t*>(a.qweight);
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups, gv = G / 16 * 16;
  VF acc[nt][mt];
  float tail[nt][mt];
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) {
      acc[t][r] = vzero();
      tail[t][r] = 0.0f;
    }
  for (int64_t g = 0; g < ng; ++g) {
    VF s[nt], mn[nt];
    for (int t = 0; t < nt; ++t) {
      s[t] = vset1(a.scales[(n + t) * ng + g]);
      mn[t] = vset1(has_min ? a.mins[(n + t) * ng + g] : 0.0f);
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
        const float sc = a.scales[(n + t) * ng + g];
        const float w = has_min ? __builtin_fmaf(static_cast<float>(qw[(n + t) * K + k]), sc,
                                                 a.mins[(n + t) * ng + g])
                                : static_cast<float>(qw[(n + t) * K + k]) * sc;
        for (int r = 0; r < mt; ++r)
          tail[t][r] = __builtin_fmaf(w, a.x[(m0 + r) * K + k], tail[t][r]);
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < mt; ++r) a.out[(m0 + r) * a.N + n + t] = vsum(acc[t][r]) + tail[t][r];
}

// The remainder tile of exactly `left` (< mt) rows.
template <int nt, int mt, class Tile>
inline void rest_rows(const QuantArgs& a, int64_t n, int64_t m0, int64_t left) {
  if constexpr (mt >= 1) {
    if (left == mt) Tile::template run<nt, mt>(a, n, m0);
    else rest_rows<nt, mt - 1, Tile>(a, n, m0, left);
  }
}

// All M rows for output columns [n, n + nt): full mt-row tiles, then the remainder.
template <int nt, int mt, class Tile>
inline void rows_for(const QuantArgs& a, int64_t n) {
  int64_t m0 = 0;
  for (; m0 + mt <= a.M; m0 += mt) Tile::template run<nt, mt>(a, n, m0);
  if (a.M > m0) rest_rows<nt, mt - 1, Tile>(a, n, m0, a.M - m0);
}

struct Int4Tile {
  template <int nt, int mt>
  static void run(const QuantArgs& a, int64_t n, int64_t m0) { int4_tile<nt, mt>(a, n, m0); }
};
template <bool has_min>
struct Int8Tile {
  template <int nt, int mt>
  static void run(const QuantArgs& a, int64_t n, int64_t m0) {
    int8_tile<nt, mt, has_min>(a, n, m0);
  }
};

// Few rows (decode): NT output columns per tile for independent FMA chains. More rows
// (verification, small batches): NT_WIDE columns by MT_WIDE rows, so a weight tile is
// dequantized once for up to MT_WIDE rows. The tiling never changes a result.
template <class Tile>
inline void all_rows(const QuantArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (a.M <= MT) {
    for (; n + NT <= n1; n += NT) rows_for<NT, MT, Tile>(a, n);
  } else {
    for (; n + NT_WIDE <= n1; n += NT_WIDE) rows_for<NT_WIDE, MT_WIDE, Tile>(a, n);
  }
  for (; n < n1; ++n) rows_for<1, MT_WIDE, Tile>(a, n);
}
