// AMX-INT8 W4A8 matmul for decode and verification rows (qa8.h's int4 contract, its own
// summation order). The activations are the A tile (M rows x one 32-column block, int8), 16
// output rows' weights of the same block the B tile (8 quads x 16 columns, their nibbles
// widened to bytes), so one `tdpbsud` gives the exact int32 dot of every (activation row,
// output row) pair for that block; each activation row then adds, per block in order,
//   acc[m, n] = fma(float(dot[m, n, b]), w_scale[n, g(b)] * d[m, b], acc[m, n])
// over 16 output rows in one vector, and last acc + sum_g w_min[n, g] * xs[m, g] (summed in
// group order). Every value of row m depends only on row m: row m of an M-row call equals
// the 1-row call bit for bit. The cost of an extra activation row is one row of the tile
// product, its C row's convert and one FMA per 512 weights (the VNNI kernel's: 8 `vpdpbusd`
// and 4 converts, products and FMAs), so 5 or 16 rows cost little more than one.
//
// The B tile is built from qa8.h's weight layout in registers: block b of output row n is 16
// bytes at qweight[n, 16 b] (low nibbles the block's even columns, high nibbles its odd
// ones); four 16-row 128-bit gathers, a 4 x 4 dword transpose per 128-bit lane and two mask
// / shift steps give the 8 tile rows (quad j < 4: low nibbles of bytes 4j..4j+3 of each row;
// quad 4 + j: their high nibbles). The A tile row of block b is then [its 16 even-column
// bytes, its 16 odd-column bytes], copied once per call from qa8.h's activation layout. The
// 16 rows' scales and mins are transposed to [group][16] fp32 per 16 rows (16 x 16 blocks in
// registers).
//
// Cost (scripts/bench_amx_decode.py): building each B tile from this layout and transposing
// the scales is a fixed cost per 512 weights that the VNNI kernel does not pay, so a 1-row
// call takes 2-3x VNNI's while 16 rows take 1.4-1.9x the 1-row call (VNNI's: 6-9x). Hence
// off by default (LOCALCHAT_CPU_AMX_DECODE=1); a weight layout with the tiles' interleave
// built at load would remove the fixed cost.
// Design after Intel's AMX programming reference (Optimization Reference Manual, ch. 20);
// own code.
#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 11)
#define LOCALCHAT_AMX 1
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "qa8.h"

namespace localchat_cpu {

#ifdef LOCALCHAT_AMX
namespace {

// Tiles: 0 / 3 A (M x 32 bytes), 1 / 4 B (8 x 64), 2 / 5 C (M x 16 int32); two blocks in
// flight so one block's tile product overlaps the other's B build and float work.
void configure(int64_t M) {
  TileConfig cfg = tile_config();
  for (int t : {0, 3}) {
    cfg.rows[t] = static_cast<uint8_t>(M);
    cfg.colsb[t] = 32;
  }
  for (int t : {1, 4}) {
    cfg.rows[t] = 8;
    cfg.colsb[t] = 64;
  }
  for (int t : {2, 5}) {
    cfg.rows[t] = static_cast<uint8_t>(M);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// The 8 B-tile rows of block `bl` for 16 output rows (row pointers w[16], each K / 2 bytes)
// into bt [8][64].
inline void build_b(const uint8_t* const* w, int64_t bl, uint8_t* bt) {
  const int64_t off = 16 * bl;
  __m512i z[4];
  for (int q = 0; q < 4; ++q) {  // lane l of z[q] <- output row 4 l + q
    const auto ld = [&](int row) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[row] + off));
    };
    __m512i v = _mm512_castsi128_si512(ld(q));
    v = _mm512_inserti32x4(v, ld(4 + q), 1);
    v = _mm512_inserti32x4(v, ld(8 + q), 2);
    z[q] = _mm512_inserti32x4(v, ld(12 + q), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  // r[j]: dword j (bytes 4j..4j+3) of the 16 output rows, in row order
  const __m512i r[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    _mm512_store_si512(bt + 64 * j, _mm512_and_si512(r[j], nib));
    _mm512_store_si512(bt + 64 * (4 + j), _mm512_and_si512(_mm512_srli_epi16(r[j], 4), nib));
  }
}

// In-register transpose of a 16 x 16 fp32 block: v[i] row i in, column i out.
inline void transpose16(__m512* v) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int h = 0; h < 2; ++h) {
      const __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + 2 + h]);
      v[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      v[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  }
  // v[4 q + r] now holds in 128-bit lane l rows 4 q .. 4 q + 3 of column 4 l + r; two
  // rounds of lane shuffles (a 4 x 4 transpose of lanes) finish it
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(v[i], v[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(v[i], v[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(v[8 + i], v[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(v[8 + i], v[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    v[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    v[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    v[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
}

// 16 groups g0.. (k of them valid) of output row n's scales (which = 0) or mins (1) as fp32:
// plain fp32 / fp16, or two-level (qa8.h's `super`: d * sc and -dmin * m, exact products).
inline __m512 load_groups(const A8Args& a, int64_t n, int64_t g0, int64_t k, int which) {
  const int64_t ng = a.ngroups, at = n * ng + g0;
  const __mmask16 mk = k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << k) - 1);
  const void* src = which ? a.mins : a.scales;
  if (a.super) {
    const uint16_t* sup = a.super + n * (ng / 8) * 2 + (g0 / 8) * 2 + which;
    const __m512 dv = _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(sup[0])),
                                         _mm256_set1_ps(k > 8 ? _cvtsh_ss(sup[2]) : 0.0f), 1);
    const __m512i q = _mm512_cvtepu8_epi32(
        _mm_maskz_loadu_epi8(mk, static_cast<const uint8_t*>(src) + at));
    return _mm512_mul_ps(dv, _mm512_cvtepi32_ps(q));
  }
  if (a.half)
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, static_cast<const uint16_t*>(src) + at));
  return _mm512_maskz_loadu_ps(mk, static_cast<const float*>(src) + at);
}

// Scales (and mins) of 16 output rows n0.. (rows past N zero), transposed to [ng][16] fp32.
void transpose_scales(const A8Args& a, int64_t n0, int64_t rows, float* st, float* mt) {
  const int64_t ng = a.ngroups;
  for (int which = 0; which < (mt ? 2 : 1); ++which) {
    float* dst = which ? mt : st;
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
      const int64_t k = std::min<int64_t>(16, ng - g0);
      __m512 v[16];
      for (int j = 0; j < 16; ++j)
        v[j] = j < rows ? load_groups(a, n0 + j, g0, k, which) : _mm512_setzero_ps();
      transpose16(v);
      for (int64_t i = 0; i < k; ++i) _mm512_store_ps(dst + (g0 + i) * 16, v[i]);
    }
  }
}

constexpr int kRing = 4;

// One block's tile product: A (activations, stride 32), B (bt), C zeroed, C stored to cbuf
// (a macro: the tile intrinsics take the register numbers as literal tokens).
#define LOCALCHAT_TILE_BLOCK(TA, TB, TC, xa, bt, cbuf) \
  do {                                                \
    _tile_loadd(TA, (xa), 32);                        \
    _tile_loadd(TB, (bt), 64);                        \
    _tile_zero(TC);                                   \
    _tile_dpbsud(TC, TA, TB);                         \
    _tile_stored(TC, (cbuf), 64);                     \
  } while (0)

// The float work of one block's C tile (cbuf [M][16] int32) for activation rows 0..M-1.
template <int M>
inline void accumulate(const A8Args& a, const int32_t* cbuf, int64_t bl, const float* sg,
                       __m512* acc) {
  const __m512 sv = _mm512_load_ps(sg);
  const int64_t nb = a.Kp / 32;
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m));
    acc[m] = _mm512_fmadd_ps(c, _mm512_mul_ps(sv, _mm512_set1_ps(a.d[m * nb + bl])), acc[m]);
  }
}

template <int M>
void columns(const A8Args& a, int64_t n0, int64_t n1, const int8_t* xa, const uint8_t* zrow,
             float* st, float* mt) {
  const int64_t K = a.K, nblk = K / 32, ng = a.ngroups, gs = a.group_size;
  alignas(64) uint8_t bt[kRing][512];
  alignas(64) int32_t cbuf[kRing][16 * 16];
  for (int64_t nb = n0; nb < n1; nb += 16) {
    const int64_t rows = std::min<int64_t>(16, n1 - nb);
    const uint8_t* w[16];  // rows past N read zeros
    for (int j = 0; j < 16; ++j)
      w[j] = j < rows ? static_cast<const uint8_t*>(a.qweight) + (nb + j) * (K / 2) : zrow;
    transpose_scales(a, nb, rows, st, mt);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    // software pipeline over the blocks: block bl + 2's B tile is built (stored) while
    // block bl's is multiplied and block bl - 2's C tile is read back, so no tile load waits
    // on the stores just before it, and no vector load on the tile store just before it
    build_b(w, 0, bt[0]);
    if (nblk > 1) build_b(w, 1, bt[1]);
    for (int64_t bl = 0; bl < nblk; ++bl) {
      if (bl + 2 < nblk) build_b(w, bl + 2, bt[(bl + 2) % kRing]);
      if (bl % 2 == 0)
        LOCALCHAT_TILE_BLOCK(0, 1, 2, xa + bl * M * 32, bt[bl % kRing], cbuf[bl % kRing]);
      else
        LOCALCHAT_TILE_BLOCK(3, 4, 5, xa + bl * M * 32, bt[bl % kRing], cbuf[bl % kRing]);
      if (bl >= 2) {
        const int64_t o = bl - 2;
        accumulate<M>(a, cbuf[o % kRing], o, st + (o * 32 / gs) * 16, acc);
      }
    }
    for (int64_t o = std::max<int64_t>(0, nblk - 2); o < nblk; ++o)
      accumulate<M>(a, cbuf[o % kRing], o, st + (o * 32 / gs) * 16, acc);
    if (mt) {
      for (int m = 0; m < M; ++m) {
        __m512 macc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; ++g)
          macc = _mm512_fmadd_ps(_mm512_load_ps(mt + g * 16),
                                 _mm512_set1_ps(a.xs[m * ng + g]), macc);
        acc[m] = _mm512_add_ps(acc[m], macc);
      }
    }
    for (int m = 0; m < M; ++m) {
      alignas(64) float t[16];
      _mm512_store_ps(t, acc[m]);
      for (int64_t j = 0; j < rows; ++j) a8_store(a, m, nb + j, t[j]);
    }
  }
}

}  // namespace

bool amx_int8_built() { return true; }

void int4_a8_amx(const A8Args& a, int64_t n0, int64_t n1) {
  const int64_t M = a.M, K = a.K, nblk = K / 32, ng = a.ngroups;
  // per thread: the A tiles [block][M][32] (even-column bytes, then odd), the transposed
  // scales and mins [ng][16]
  thread_local std::vector<char> buf;
  // and a zero weight row for the columns of a last block past N
  const size_t need = 64 + 2 * ng * 16 * 4 + nblk * M * 32 + K / 2;
  if (buf.size() < need) buf.resize(need);
  char* p = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  float* st = reinterpret_cast<float*>(p);
  float* mt = a.mins ? st + ng * 16 : nullptr;
  int8_t* xa = reinterpret_cast<int8_t*>(st + 2 * ng * 16);
  uint8_t* zrow = reinterpret_cast<uint8_t*>(xa + nblk * M * 32);
  std::memset(zrow, 0, K / 2);
  for (int64_t bl = 0; bl < nblk; ++bl) {
    const int64_t src = (bl / 4) * 128 + (bl % 4) * 16;
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(xa + (bl * M + m) * 32, a.xq + m * a.Kp + src, 16);
      std::memcpy(xa + (bl * M + m) * 32 + 16, a.xq + m * a.Kp + src + 64, 16);
    }
  }
  configure(M);
  switch (M) {
#define LOCALCHAT_CASE(R) \
  case R: columns<R>(a, n0, n1, xa, zrow, st, mt); break;
    LOCALCHAT_CASE(1) LOCALCHAT_CASE(2) LOCALCHAT_CASE(3) LOCALCHAT_CASE(4)
    LOCALCHAT_CASE(5) LOCALCHAT_CASE(6) LOCALCHAT_CASE(7) LOCALCHAT_CASE(8)
    LOCALCHAT_CASE(9) LOCALCHAT_CASE(10) LOCALCHAT_CASE(11) LOCALCHAT_CASE(12)
    LOCALCHAT_CASE(13) LOCALCHAT_CASE(14) LOCALCHAT_CASE(15) LOCALCHAT_CASE(16)
#undef LOCALCHAT_CASE
    default: break;
  }
  _tile_release();
}

#else  // no AMX in this compiler or architecture: amx_int8_ready() is false, never called

bool amx_int8_built() { return false; }
void int4_a8_amx(const A8Args&, int64_t, int64_t) {}

#endif

}  // namespace localchat_cpu
