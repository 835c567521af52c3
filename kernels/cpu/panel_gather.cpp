// Single rows of a panel weight by output id, dequantized to fp32: what the greedy output
// layer rescores (engine/layers/greedy_head.py: the candidates' exact logits) and what a tied
// panel embedding looks up. The panel_dequantize ops of panel_repack.cpp turn whole 16-row
// tiles back into rows for a prompt's GEMM; a candidate needs one lane of its tile, so these
// read that lane's bytes straight from the panel (1/16 of the tile's work) and write the row
// layout's dequantized values bit for bit:
//   int6 (panel6.h, GGUF Q6_K): float(u - 32) * (float(d) * float(sc)), one fp32 rounding
//     (reference_int6.dequantize_int6);
//   int8 (panel8.h, GGUF Q8_0): float(q) * float(scale) (reference dequantize_int8_grouped).
// Rows are split over the torch thread pool; every value is one product, so the split does
// not change it. The plain loops are left to the compiler's vectorizer (a row is 1-10 us).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

#include "half_bits.h"
#include "panel4.h"

namespace localchat_cpu {
namespace {

// ids [n] int64 in [0, N) -> checked pointer; out [n, K] fp32 contiguous.
const int64_t* check_ids(const char* op, const at::Tensor& ids, const at::Tensor& out,
                         int64_t N, int64_t K) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(), op,
              ": ids must be a contiguous int64 [n] tensor");
  const int64_t n = ids.size(0);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                  out.size(0) == n && out.size(1) == K,
              op, ": out must be contiguous fp32 [", n, ", ", K, "], got ", out.sizes());
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < N, op, ": ids[", i, "] = ", p[i], " outside [0, ", N, ")");
  return p;
}

// Lane j of tile t of an int6 panel (K columns) -> row [K] fp32.
void int6_lane(const uint8_t* pl, const uint8_t* ph, const int8_t* ps, const uint16_t* pu,
               int64_t t, int j, int64_t K, float* row) {
  const int64_t oct = K / 8, ns = K / 16, nsb = K / 256;
  const uint8_t* lo = pl + t * oct * 64 + 4 * j;
  const uint8_t* hi = ph + t * ns * 64 + 4 * j;
  for (int64_t s = 0; s < ns; ++s) {
    const float sd = f16_bits_to_f32(pu[(t * nsb + s / 16) * 16 + j]) *
                     static_cast<float>(ps[(t * ns + s) * 16 + j]);
    // columns 16 s + 4 v + b (v = 0..3, b = 0..3): octets 2 s (v = 0, 1) and 2 s + 1 (2, 3)
    for (int v = 0; v < 4; ++v)
      for (int b = 0; b < 4; ++b) {
        const uint8_t l = lo[(2 * s + v / 2) * 64 + b];
        const int low = v % 2 ? l >> 4 : l & 15;
        const int top = (hi[s * 64 + b] >> (2 * v)) & 3;
        row[16 * s + 4 * v + b] = static_cast<float>(low + 16 * top - 32) * sd;
      }
  }
}

// Lane j of tile t of an int8 panel (K columns) -> row [K] fp32.
void int8_lane(const int8_t* pq, const uint16_t* ps, int64_t t, int j, int64_t K, float* row) {
  const int64_t nq = K / 4, ng = K / 32;
  const int8_t* q = pq + t * nq * 64 + 4 * j;
  for (int64_t g = 0; g < ng; ++g) {
    const float s = f16_bits_to_f32(ps[(t * ng + g) * 16 + j]);
    for (int64_t c = 8 * g; c < 8 * g + 8; ++c)
      for (int b = 0; b < 4; ++b) row[4 * c + b] = static_cast<float>(q[c * 64 + b]) * s;
  }
}

// Rows `ids` of an int6 panel weight (plow, phigh, pscales, psuper as int6_panel_a8's) ->
// out [n, K] fp32.
void int6_panel_gather(const at::Tensor& plow, const at::Tensor& phigh,
                       const at::Tensor& pscales, const at::Tensor& psuper,
                       const at::Tensor& ids, at::Tensor out) {
  const char* op = "int6_panel_gather";
  TORCH_CHECK(plow.dim() == 3 && plow.size(2) == 64 && plow.scalar_type() == at::kByte &&
                  plow.is_contiguous() && plow.size(1) % 32 == 0,
              op, ": plow must be contiguous uint8 [N/16, K/8, 64], K % 256 == 0");
  const int64_t N = plow.size(0) * kPanelRows, K = plow.size(1) * 8;
  TORCH_CHECK(phigh.scalar_type() == at::kByte && phigh.is_contiguous() &&
                  phigh.numel() == N * K / 4 && pscales.scalar_type() == at::kChar &&
                  pscales.is_contiguous() && pscales.numel() == N * K / 16 &&
                  psuper.scalar_type() == at::kHalf && psuper.is_contiguous() &&
                  psuper.numel() == N * K / 256,
              op, ": phigh uint8 [N/16, K/16, 64], pscales int8 [N/16, K/16, 16] and psuper "
              "fp16 [N/16, K/256, 16] must be contiguous and match plow");
  const int64_t* id = check_ids(op, ids, out, N, K);
  const uint8_t* pl = plow.data_ptr<uint8_t>();
  const uint8_t* ph = phigh.data_ptr<uint8_t>();
  const int8_t* ps = pscales.data_ptr<int8_t>();
  const auto* pu = reinterpret_cast<const uint16_t*>(psuper.data_ptr<at::Half>());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, ids.size(0), 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      int6_lane(pl, ph, ps, pu, id[i] / kPanelRows, static_cast<int>(id[i] % kPanelRows), K,
                o + i * K);
  });
}

// Rows `ids` of an int8 panel weight (qpanel, pscales as int8_panel_a8's) -> out [n, K] fp32.
void int8_panel_gather(const at::Tensor& qpanel, const at::Tensor& pscales,
                       const at::Tensor& ids, at::Tensor out) {
  const char* op = "int8_panel_gather";
  TORCH_CHECK(qpanel.dim() == 3 && qpanel.size(2) == 64 && qpanel.scalar_type() == at::kChar &&
                  qpanel.is_contiguous() && qpanel.size(1) % 8 == 0,
              op, ": qpanel must be contiguous int8 [N/16, K/4, 64], K % 32 == 0");
  const int64_t N = qpanel.size(0) * kPanelRows, K = qpanel.size(1) * 4;
  TORCH_CHECK(pscales.scalar_type() == at::kHalf && pscales.is_contiguous() &&
                  pscales.numel() == N * K / 32,
              op, ": pscales must be contiguous fp16 [N/16, K/32, 16]");
  const int64_t* id = check_ids(op, ids, out, N, K);
  const int8_t* pq = qpanel.data_ptr<int8_t>();
  const auto* ps = reinterpret_cast<const uint16_t*>(pscales.data_ptr<at::Half>());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, ids.size(0), 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      int8_lane(pq, ps, id[i] / kPanelRows, static_cast<int>(id[i] % kPanelRows), K, o + i * K);
  });
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int6_panel_gather(Tensor plow, Tensor phigh, Tensor pscales, Tensor psuper, "
        "Tensor ids, Tensor(a!) out) -> ()");
  m.def("int8_panel_gather(Tensor qpanel, Tensor pscales, Tensor ids, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int6_panel_gather", &localchat_cpu::int6_panel_gather);
  m.impl("int8_panel_gather", &localchat_cpu::int8_panel_gather);
}
