// Two-level int4 scales ("k-scales", GGUF Q4_K held as in its file): the launchers' side.
//
// Layout (localchat.engine.quant.int4, "k-scales"): scales / mins uint8 [N, K/32], the
// 6-bit sub-block scale sc and min m of each group of 32; super_scales fp16 [N, K/256, 2],
// the super-block's (d, -dmin). Group g of row n has
//   scale = float(d[n, g / 8]) * sc[n, g],   min = float(-dmin[n, g / 8]) * m[n, g],
// both exact in fp32 (11 + 6 significant bits), so they equal the folded fp32 scales / mins
// the kernels otherwise read (which a GGUF repack computes the same way) bit for bit.
//
// The matmul kernels read this form in place (qa8.h's / quant.h's `super`: W4A8 converts 4
// uint8 scales per 128 columns and multiplies by d; the fp32-activation tiles widen a
// super-block's 8 at a time into their stack buffers). The prefill dequantizer does not: its
// launcher widens the scales of a chunk of kKScaleRows rows into a per-thread fp32 buffer
// and runs the unchanged dequantizer over that chunk as if it were a whole weight of that
// many rows (its qweight and output pointers offset to the chunk). Either way every value is
// the folded one, so results equal the folded-scale call's bit for bit. A per-call widening
// for the matmuls measured 1.6-6x their time at one row (1536 x 17920): the kernels' own
// reads cost nothing measurable. Source: llama.cpp's Q4_K block (ggml-common.h, read, not
// copied) keeps the same two levels.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace localchat_cpu {

constexpr int64_t kKScaleRows = 32;

struct KScales {
  const uint8_t* sc;     // [N, ng]
  const uint8_t* mn;     // [N, ng]
  const at::Half* sup;   // [N, ng / 8, 2]: (d, -dmin)
  int64_t ng;
};

// Checks the k-scale tensors of an int4 weight [N, K] (group size 32, K % 256 == 0).
inline KScales check_kscales(const char* op, const at::Tensor& scales, const at::Tensor& mins,
                             const at::Tensor& sup, int64_t N, int64_t K, int64_t group_size) {
  TORCH_CHECK(group_size == 32 && K % 256 == 0, op,
              ": two-level (k-) scales need group_size 32 and K % 256 == 0, got group_size ",
              group_size, ", K=", K);
  const int64_t ng = K / 32;
  TORCH_CHECK(scales.scalar_type() == at::kByte && mins.scalar_type() == at::kByte &&
                  scales.is_contiguous() && mins.is_contiguous() &&
                  scales.sizes() == at::IntArrayRef({N, ng}) &&
                  mins.sizes() == at::IntArrayRef({N, ng}),
              op, ": with super_scales, scales and mins must be contiguous uint8 [", N, ", ", ng,
              "], got ", scales.sizes(), " ", scales.scalar_type(), " and ", mins.sizes(), " ",
              mins.scalar_type());
  TORCH_CHECK(sup.scalar_type() == at::kHalf && sup.is_contiguous() &&
                  sup.sizes() == at::IntArrayRef({N, K / 256, 2}),
              op, ": super_scales must be contiguous fp16 [", N, ", ", K / 256, ", 2], got ",
              sup.sizes(), " ", sup.scalar_type());
  return KScales{scales.data_ptr<uint8_t>(), mins.data_ptr<uint8_t>(), sup.data_ptr<at::Half>(),
                 ng};
}

// Rows [r0, r1) of the folded fp32 scales / mins into s / m ([r1 - r0, ng] each): one fp16
// conversion per super-block, then 8 products of fixed trip count the compiler vectorizes.
inline void widen_kscales(const KScales& k, int64_t r0, int64_t r1, float* __restrict s,
                          float* __restrict m) {
  const int64_t nsb = k.ng / 8;
  const uint8_t* __restrict sc = k.sc + r0 * k.ng;
  const uint8_t* __restrict mn = k.mn + r0 * k.ng;
  const at::Half* sp = k.sup + r0 * nsb * 2;
  for (int64_t b = 0; b < (r1 - r0) * nsb; ++b) {
    const float d = static_cast<float>(sp[2 * b]), dm = static_cast<float>(sp[2 * b + 1]);
    for (int j = 0; j < 8; ++j) {
      s[8 * b + j] = d * static_cast<float>(sc[8 * b + j]);
      m[8 * b + j] = dm * static_cast<float>(mn[8 * b + j]);
    }
  }
}

// Calls body(c0, c1, s, m) for chunks [c0, c1) of at most kKScaleRows rows covering [n0, n1),
// s / m the chunk's widened scales / mins (a per-thread buffer, valid during the call).
template <class F>
inline void for_kscale_chunks(const KScales& k, int64_t n0, int64_t n1, F&& body) {
  thread_local std::vector<float> buf;
  const size_t need = static_cast<size_t>(2 * kKScaleRows * k.ng);
  if (buf.size() < need) buf.resize(need);
  float* s = buf.data();
  float* m = buf.data() + kKScaleRows * k.ng;
  for (int64_t c0 = n0; c0 < n1; c0 += kKScaleRows) {
    const int64_t c1 = std::min(n1, c0 + kKScaleRows);
    widen_kscales(k, c0, c1, s, m);
    body(c0, c1, s, m);
  }
}

}  // namespace localchat_cpu
