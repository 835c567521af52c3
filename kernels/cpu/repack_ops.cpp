// GGUF block repacking (a fragment of namespace ``localchat_cpu``): the blocks of one GGUF
// tensor, straight from the file's bytes, onto the engine's int4 / int8 group-wise layouts
// (localchat.engine.quant.gguf_repack's module docstring has the contract; its numpy
// ``_decode`` path is the reference and the oracle, tests/kernels/test_cpu_gguf_repack.py).
//
//   int4: qweight uint8 [N, K/2] (low nibble = even k), scales / mins [N, K/32]
//         (Q4_0: min = -8 d; Q4_1: d, m; Q4_K: d * sc, -(dmin * m), the 6-bit sub-scales,
//         or with super_scales the two-level form of kscales.h: uint8 sc / m and (d, -dmin))
//   int8: qweight int8 [N, K], scales [N, K/G], mins [N, K/G] or none
//         (Q8_0, Q5_0 (q - 16), Q5_1, IQ4_NL (table values), G 32; Q5_K G 32 with mins;
//          Q6_K (q - 32), Q3_K G 16; Q2_K G 16 with mins)
//
// Scales and mins are fp16 for the types whose block floats are fp16 in the file (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, IQ4_NL: the file's 16 bits copied; Q4_0's -8 d computed in fp32 and
// rounded to fp16 to nearest even, counted when that is not the fp32 value), fp32 for the
// K-quants: d (fp16 widened exactly) times the small integer in one fp32 multiply, the same
// bits as numpy's ``d * sc``. Pure byte shuffling, memory bound: portable scalar code in
// loops of fixed trip count that the compiler vectorizes for the baseline ISA; output rows
// split over threads with at::parallel_for. Block formats: ggml's ggml-common.h /
// ggml-quants.c and the gguf package's quants.py (read, not copied).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "repack_rows.h"

namespace localchat_cpu {
namespace {

inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float h2f(const uint8_t* p) {
  return static_cast<float>(c10::Half(ld16(p), c10::Half::from_bits()));
}

// 32 weights stored ggml-style in 16 bytes (w[j] = qs[j] & 15, w[16 + j] = qs[j] >> 4) ->
// 16 bytes of the int4 layout (byte p = w[2p] | w[2p + 1] << 4).
inline void pack_split32(const uint8_t* __restrict qs, uint8_t* __restrict out) {
  for (int p = 0; p < 8; ++p)
    out[p] = static_cast<uint8_t>((qs[2 * p] & 0x0F) | (qs[2 * p + 1] << 4));
  for (int p = 0; p < 8; ++p)
    out[8 + p] = static_cast<uint8_t>((qs[2 * p] >> 4) | (qs[2 * p + 1] & 0xF0));
}

// Q4_K / Q5_K: 12 packed bytes -> 8 six-bit scales and 8 six-bit mins.
inline void k_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3F;
    mn[j] = s[4 + j] & 0x3F;
    sc[4 + j] = static_cast<uint8_t>((s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30));
    mn[4 + j] = static_cast<uint8_t>((s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30));
  }
}

// Q4_K / Q5_K superblock b's 8 group scales d * sc and mins -(dmin * m), one fp32 multiply
// each (numpy's exact products).
inline void k_group_scales(const uint8_t* b, float* s, float* m) {
  const float d = h2f(b), dmin = h2f(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  for (int j = 0; j < 8; ++j) {
    s[j] = d * static_cast<float>(sc[j]);
    m[j] = -(dmin * static_cast<float>(mn[j]));
  }
}

const int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                           1,    13,   25,  38,  53,  69,  89,  113};

// One block type: weights / bytes per block, weights per scale, layout and scale dtype.
struct TypeInfo {
  int64_t block, type_size, group;
  bool int4, half, mins;
};

bool type_info(int64_t t, TypeInfo* out) {
  switch (t) {
    case 2: *out = {32, 18, 32, true, true, true}; return true;     // Q4_0
    case 3: *out = {32, 20, 32, true, true, true}; return true;     // Q4_1
    case 6: *out = {32, 22, 32, false, true, false}; return true;   // Q5_0
    case 7: *out = {32, 24, 32, false, true, true}; return true;    // Q5_1
    case 8: *out = {32, 34, 32, false, true, false}; return true;   // Q8_0
    case 10: *out = {256, 84, 16, false, false, true}; return true;  // Q2_K
    case 11: *out = {256, 110, 16, false, false, false}; return true;  // Q3_K
    case 12: *out = {256, 144, 32, true, false, true}; return true;  // Q4_K
    case 13: *out = {256, 176, 32, false, false, true}; return true;  // Q5_K
    case 14: *out = {256, 210, 16, false, false, false}; return true;  // Q6_K
    case 20: *out = {32, 18, 32, false, true, false}; return true;   // IQ4_NL
    default: return false;
  }
}

// Each block kernel: block bytes b -> its weights at q (int4: block/2 bytes, int8: block
// bytes), its scales at s and mins at m (block/group each; uint16 fp16 bits or fp32).
// Returns the number of values an fp16 store changed (only Q4_0's -8 d can).

inline int64_t blk_q4_0(const uint8_t* b, uint8_t* q, uint16_t* s, uint16_t* m) {
  s[0] = ld16(b);
  const float mf = -8.0f * h2f(b);
  const c10::Half mh(mf);
  m[0] = mh.x;
  const float back = static_cast<float>(mh);
  pack_split32(b + 2, q);
  return (back == mf || (std::isnan(back) && std::isnan(mf))) ? 0 : 1;
}

inline int64_t blk_q4_1(const uint8_t* b, uint8_t* q, uint16_t* s, uint16_t* m) {
  s[0] = ld16(b);
  m[0] = ld16(b + 2);
  pack_split32(b + 4, q);
  return 0;
}

// Q4_K's 128 bytes of 4-bit weights (b + 16) -> 128 bytes of the int4 layout.
inline void q4_k_weights(const uint8_t* b, uint8_t* __restrict q) {
  const uint8_t* __restrict qs = b + 16;
  for (int c = 0; c < 4; ++c) {  // 32 bytes: sub-block 2c in the low nibbles, 2c + 1 high
    const uint8_t* __restrict x = qs + 32 * c;
    uint8_t* __restrict lo = q + 32 * c;
    for (int p = 0; p < 16; ++p)
      lo[p] = static_cast<uint8_t>((x[2 * p] & 0x0F) | (x[2 * p + 1] << 4));
    for (int p = 0; p < 16; ++p)
      lo[16 + p] = static_cast<uint8_t>((x[2 * p] >> 4) | (x[2 * p + 1] & 0xF0));
  }
}

inline int64_t blk_q4_k(const uint8_t* b, uint8_t* __restrict q, float* s, float* m) {
  k_group_scales(b, s, m);
  q4_k_weights(b, q);
  return 0;
}

// Q4_K onto the two-level int4 form (kscales.h): the 6-bit sub-block scales / mins as
// uint8 (sc, m: 8 each) and the superblock's (d, -dmin) fp16 bits (sup: 2), copied from the
// file (-dmin by its sign bit).
inline void blk_q4_k_two_level(const uint8_t* b, uint8_t* __restrict q, uint8_t* sc,
                               uint8_t* mn, uint16_t* sup) {
  sup[0] = ld16(b);
  sup[1] = static_cast<uint16_t>(ld16(b + 2) ^ 0x8000u);
  k_scale_min(b + 4, sc, mn);
  q4_k_weights(b, q);
}

inline int64_t blk_iq4_nl(const uint8_t* b, int8_t* __restrict q, uint16_t* s, uint16_t*) {
  s[0] = ld16(b);
  for (int j = 0; j < 16; ++j) {
    q[j] = kIQ4NL[b[2 + j] & 0x0F];
    q[16 + j] = kIQ4NL[b[2 + j] >> 4];
  }
  return 0;
}

inline int64_t blk_q8_0(const uint8_t* b, int8_t* q, uint16_t* s, uint16_t*) {
  s[0] = ld16(b);
  std::memcpy(q, b + 2, 32);
  return 0;
}

// 8 bits of `byte` -> 8 bytes, byte i = 0x10 when bit i is set, else 0 (the multiply puts a
// copy of the byte in every lane, the mask keeps bit i in lane i, the add carries any set
// bit of a lane into its top bit).
inline uint64_t spread_bits_x10(uint32_t byte) {
  const uint64_t v = (byte * 0x0101010101010101ULL) & 0x8040201008040201ULL;
  return ((v + 0x7F7F7F7F7F7F7F7FULL) & 0x8080808080808080ULL) >> 3;
}

template <bool Q5_1>
inline int64_t blk_q5(const uint8_t* b, int8_t* __restrict q, uint16_t* s, uint16_t* m) {
  const int off = Q5_1 ? 4 : 2;
  s[0] = ld16(b);
  if (Q5_1) m[0] = ld16(b + 2);
  uint8_t hb[32];  // weight j's fifth bit as 0x10: bit j of the little-endian qh
  for (int i = 0; i < 4; ++i) {
    const uint64_t w = spread_bits_x10(b[off + i]);
    std::memcpy(hb + 8 * i, &w, 8);
  }
  const uint8_t* __restrict qs = b + off + 4;
  const int bias = Q5_1 ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((qs[j] & 0x0F) | hb[j]) - bias);
    q[16 + j] = static_cast<int8_t>(((qs[j] >> 4) | hb[16 + j]) - bias);
  }
  return 0;
}

inline int64_t blk_q5_k(const uint8_t* b, int8_t* __restrict q, float* s, float* m) {
  k_group_scales(b, s, m);
  const uint8_t* __restrict qh = b + 16;
  const uint8_t* __restrict qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    const uint8_t* __restrict x = qs + 32 * (j / 2);
    const int shift = 4 * (j & 1);
    for (int i = 0; i < 32; ++i)
      q[32 * j + i] = static_cast<int8_t>(((x[i] >> shift) & 0x0F) | (((qh[i] >> j) & 1) << 4));
  }
  return 0;
}

inline int64_t blk_q6_k(const uint8_t* b, int8_t* __restrict q, float* s, float*) {
  const float d = h2f(b + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int g = 0; g < 16; ++g) s[g] = d * static_cast<float>(sc[g]);
  const uint8_t* __restrict ql = b;
  const uint8_t* __restrict qh = b + 128;
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 4; ++r) {
      const uint8_t* __restrict lo = ql + 64 * h + 32 * (r & 1);
      const uint8_t* __restrict hi = qh + 32 * h;
      const int ls = 4 * (r >> 1), hs = 2 * r;
      int8_t* __restrict out = q + 32 * (4 * h + r);
      for (int i = 0; i < 32; ++i)
        out[i] = static_cast<int8_t>((((lo[i] >> ls) & 0x0F) | (((hi[i] >> hs) & 3) << 4)) - 32);
    }
  return 0;
}

inline int64_t blk_q3_k(const uint8_t* b, int8_t* __restrict q, float* s, float*) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* packed = b + 96;
  const float d = h2f(b + 108);
  for (int t = 0; t < 16; ++t) {
    const int low = t < 8 ? (packed[t] & 0x0F) : (packed[t - 8] >> 4);
    const int high = (packed[8 + t % 4] >> (2 * (t / 4))) & 3;
    s[t] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 4; ++r) {
      const int sb = 4 * h + r;
      int8_t* __restrict out = q + 32 * sb;
      for (int i = 0; i < 32; ++i)
        out[i] = static_cast<int8_t>(((qs[32 * h + i] >> (2 * r)) & 3) -
                                     ((((hmask[i] >> sb) & 1) ^ 1) << 2));
    }
  return 0;
}

inline int64_t blk_q2_k(const uint8_t* b, int8_t* __restrict q, float* s, float* m) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
  for (int g = 0; g < 16; ++g) {
    s[g] = d * static_cast<float>(sc[g] & 0x0F);
    m[g] = -(dmin * static_cast<float>(sc[g] >> 4));
  }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 4; ++r) {
      int8_t* __restrict out = q + 32 * (4 * h + r);
      for (int i = 0; i < 32; ++i)
        out[i] = static_cast<int8_t>((qs[32 * h + i] >> (2 * r)) & 3);
    }
  return 0;
}

// Output rows [r0, r1): row r from source row rows[r] (or r), block by block.
template <class QT, class ST, int64_t BLOCK, int64_t TYPE_SIZE, int64_t GROUPS,
          int64_t (*BLK)(const uint8_t*, QT*, ST*, ST*)>
int64_t repack_rows(const uint8_t* raw, const int64_t* rows, int64_t nblk, QT* q, ST* s, ST* m,
                    int64_t r0, int64_t r1) {
  constexpr int64_t QB = std::is_same<QT, uint8_t>::value ? BLOCK / 2 : BLOCK;
  ST dummy[GROUPS];
  int64_t bad = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = raw + (rows ? rows[r] : r) * nblk * TYPE_SIZE;
    QT* qr = q + r * nblk * QB;
    ST* sr = s + r * nblk * GROUPS;
    ST* mr = m ? m + r * nblk * GROUPS : nullptr;
    for (int64_t j = 0; j < nblk; ++j)
      bad += BLK(src + j * TYPE_SIZE, qr + j * QB, sr + j * GROUPS,
                 mr ? mr + j * GROUPS : dummy);
  }
  return bad;
}

// Q4_K rows [r0, r1) onto the two-level form: qweight [N, K/2], scales / mins uint8
// [N, K/32], sup fp16 bits [N, K/256, 2].
void repack_q4_k_two_level(const uint8_t* raw, const int64_t* rows, int64_t nblk, uint8_t* q,
                           uint8_t* sc, uint8_t* mn, uint16_t* sup, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = raw + (rows ? rows[r] : r) * nblk * 144;
    for (int64_t j = 0; j < nblk; ++j) {
      const int64_t blk = r * nblk + j;
      blk_q4_k_two_level(src + j * 144, q + blk * 128, sc + blk * 8, mn + blk * 8,
                         sup + blk * 2);
    }
  }
}

// raw (uint8, contiguous: S source rows of K / block blocks) -> qweight / scales / mins
// (contiguous, N rows; written in place). rows (int64 [N], optional): output row r takes
// source row rows[r] (a row permutation, e.g. llama's Q/K unpermute); without it S == N.
// Returns how many scale / min values an fp16 store changed (Q4_0's -8 d out of range; the
// caller raises); raises on an unsupported type or mismatched shapes / dtypes.
// super_scales (Q4_K only, optional): the two-level form (kscales.h) instead of folded fp32
// scales: scales / mins uint8 [N, K/32], super_scales fp16 [N, K/256, 2].
int64_t gguf_repack(const at::Tensor& raw, int64_t ggml_type, at::Tensor qweight,
                    at::Tensor scales, const c10::optional<at::Tensor>& mins,
                    const c10::optional<at::Tensor>& rows,
                    const c10::optional<at::Tensor>& super_scales) {
  TypeInfo ti;
  TORCH_CHECK(type_info(ggml_type, &ti), "gguf_repack: unsupported GGML type ", ggml_type);
  const bool two_level = super_scales.has_value() && super_scales->defined();
  TORCH_CHECK(!two_level || ggml_type == 12,
              "gguf_repack: super_scales (two-level scales) are for Q4_K only, got type ",
              ggml_type);
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 1 && raw.is_contiguous(),
              "gguf_repack: raw must be contiguous 1-D uint8, got ", raw.sizes(), " ",
              raw.scalar_type());
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() &&
                  qweight.scalar_type() == (ti.int4 ? at::kByte : at::kChar),
              "gguf_repack: qweight must be contiguous ", ti.int4 ? "uint8 [N, K/2]" : "int8 [N, K]",
              " for type ", ggml_type, ", got ", qweight.sizes(), " ", qweight.scalar_type());
  const int64_t N = qweight.size(0), K = ti.int4 ? 2 * qweight.size(1) : qweight.size(1);
  TORCH_CHECK(K > 0 && K % ti.block == 0, "gguf_repack: K=", K, " is not a multiple of ",
              ti.block);
  const int64_t nblk = K / ti.block, ng = K / ti.group;
  const auto sdt = two_level ? at::kByte : ti.half ? at::kHalf : at::kFloat;
  TORCH_CHECK(scales.scalar_type() == sdt && scales.dim() == 2 && scales.size(0) == N &&
                  scales.size(1) == ng && scales.is_contiguous(),
              "gguf_repack: scales must be contiguous ", c10::toString(sdt), " [", N,
              ", ", ng, "], got ", scales.sizes(), " ", scales.scalar_type());
  if (two_level)
    TORCH_CHECK(super_scales->scalar_type() == at::kHalf && super_scales->is_contiguous() &&
                    super_scales->sizes() == at::IntArrayRef({N, nblk, 2}),
                "gguf_repack: super_scales must be contiguous fp16 [", N, ", ", nblk,
                ", 2], got ", super_scales->sizes(), " ", super_scales->scalar_type());
  const bool has_min = mins.has_value() && mins->defined();
  TORCH_CHECK(has_min == ti.mins, "gguf_repack: type ", ggml_type,
              ti.mins ? " needs mins" : " has no mins");
  if (has_min)
    TORCH_CHECK(mins->scalar_type() == sdt && mins->sizes() == scales.sizes() &&
                    mins->is_contiguous(),
                "gguf_repack: mins must be contiguous [", N, ", ", ng,
                "] of the scales' dtype, got ", mins->sizes(), " ", mins->scalar_type());
  const int64_t row_bytes = nblk * ti.type_size;
  TORCH_CHECK(raw.numel() % row_bytes == 0, "gguf_repack: ", raw.numel(),
              " bytes are not whole rows of ", row_bytes);
  const int64_t S = raw.numel() / row_bytes;
  at::Tensor rows_c;
  const int64_t* rp = checked_source_rows("gguf_repack", rows, N, S, raw.numel(), rows_c);

  const uint8_t* src = raw.data_ptr<uint8_t>();
  void* q = qweight.data_ptr();
  void* s = scales.data_ptr();
  void* m = has_min ? mins->data_ptr() : nullptr;
  std::atomic<int64_t> bad{0};
  // rows are independent; a chunk of at least ~256 KiB of source bytes per thread wake-up
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / row_bytes);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
    int64_t n = 0;
    if (two_level) {
      repack_q4_k_two_level(src, rp, nblk, static_cast<uint8_t*>(q), static_cast<uint8_t*>(s),
                            static_cast<uint8_t*>(m),
                            static_cast<uint16_t*>(super_scales->data_ptr()), r0, r1);
      return;
    }
#define LC_REPACK(QT, ST, B, TS, G, FN)                                                      \
  n = repack_rows<QT, ST, B, TS, G, FN>(src, rp, nblk, static_cast<QT*>(q),                  \
                                        static_cast<ST*>(s), static_cast<ST*>(m), r0, r1)
    switch (ggml_type) {
      case 2: LC_REPACK(uint8_t, uint16_t, 32, 18, 1, blk_q4_0); break;
      case 3: LC_REPACK(uint8_t, uint16_t, 32, 20, 1, blk_q4_1); break;
      case 6: LC_REPACK(int8_t, uint16_t, 32, 22, 1, blk_q5<false>); break;
      case 7: LC_REPACK(int8_t, uint16_t, 32, 24, 1, blk_q5<true>); break;
      case 8: LC_REPACK(int8_t, uint16_t, 32, 34, 1, blk_q8_0); break;
      case 10: LC_REPACK(int8_t, float, 256, 84, 16, blk_q2_k); break;
      case 11: LC_REPACK(int8_t, float, 256, 110, 16, blk_q3_k); break;
      case 12: LC_REPACK(uint8_t, float, 256, 144, 8, blk_q4_k); break;
      case 13: LC_REPACK(int8_t, float, 256, 176, 8, blk_q5_k); break;
      case 14: LC_REPACK(int8_t, float, 256, 210, 16, blk_q6_k); break;
      case 20: LC_REPACK(int8_t, uint16_t, 32, 18, 1, blk_iq4_nl); break;
    }
#undef LC_REPACK
    if (n) bad += n;
  });
  return bad.load();
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("gguf_repack(Tensor raw, int ggml_type, Tensor(a!) qweight, Tensor(b!) scales, "
        "Tensor(c!)? mins, Tensor? rows, Tensor(d!)? super_scales=None) -> int");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("gguf_repack", &localchat_cpu::gguf_repack);
}
