// The row layout -> panel layout conversions of int4 (panel4.h), int6 (panel6.h) and int8
// (panel8.h) weights, in place of the PyTorch references (localchat.engine.quant.int4_panel.
// to_panel, int6_panel.to_panel6, int8_panel.to_panel8, equal to them bit for bit): a first
// load converts every panel layer once, before the cache write. Threads over tiles. And the
// way back, for a prompt's GEMM and rows read back: int4_panel_dequantize /
// int8_panel_dequantize, panel tiles back into float rows. (int5's: panel5_repack.cpp; the
// pieces both use: panel_repack.h.)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "dequant.h"
#include "isa.h"
#include "panel4.h"
#include "panel6.h"
#include "panel8.h"
#include "quant.h"

namespace localchat_cpu {
namespace {

#include "panel_repack.h"

// qweight uint8 [N, K/2] -> qpanel [N/16, K/8, 64]; scales / mins [N, K/32] (uint8 with
// super_scales fp16 [N, K/256, 2], else fp16) -> [N/16, K/32, 16]; super_scales ->
// psuper [N/16, K/256, 2, 16] (written in place).
void int4_to_panel(const at::Tensor& qweight, const at::Tensor& scales, const at::Tensor& mins,
                   const c10::optional<at::Tensor>& super_scales, at::Tensor qpanel,
                   at::Tensor pscales, at::Tensor pmins, const c10::optional<at::Tensor>& psuper) {
  TORCH_CHECK(qweight.dim() == 2, "int4_to_panel: qweight must be [N, K/2]");
  const bool two = super_scales.has_value() && super_scales->defined();
  TORCH_CHECK(two == (psuper.has_value() && psuper->defined()),
              "int4_to_panel: super_scales and psuper go together");
  const int64_t N = qweight.size(0), K = qweight.size(1) * 2;
  TORCH_CHECK(N % kPanelRows == 0 && K % (two ? 256 : 32) == 0 && N > 0,
              "int4_to_panel: needs N % 16 == 0 and K % ", two ? 256 : 32, " == 0, got N=", N,
              ", K=", K);
  const auto sdt = two ? at::kByte : at::kHalf;
  check_pair("int4_to_panel", "qweight / qpanel", qweight, qpanel, at::kByte, N * K / 2);
  check_pair("int4_to_panel", "scales / pscales", scales, pscales, sdt, N * K / 32);
  check_pair("int4_to_panel", "mins / pmins", mins, pmins, sdt, N * K / 32);
  if (two)
    check_pair("int4_to_panel", "super_scales / psuper", *super_scales, *psuper, at::kHalf,
               N * K / 128);
  const uint8_t* q = qweight.data_ptr<uint8_t>();
  uint8_t* qp = qpanel.data_ptr<uint8_t>();
  const int es = two ? 1 : 2;
  const auto* sc = static_cast<const uint8_t*>(scales.data_ptr());
  const auto* mn = static_cast<const uint8_t*>(mins.data_ptr());
  auto* ps = static_cast<uint8_t*>(pscales.data_ptr());
  auto* pm = static_cast<uint8_t*>(pmins.data_ptr());
  const auto* sup = two ? static_cast<const uint8_t*>(super_scales->data_ptr()) : nullptr;
  auto* pu = two ? static_cast<uint8_t*>(psuper->data_ptr()) : nullptr;
  const int64_t ng = K / 32;
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      nibbles_to_panel_tile(q, qp, t, K);
      interleave(sc, ps, t, ng, es);
      interleave(mn, pm, t, ng, es);
      if (two) interleave(sup, pu, t, K / 256 * 2, 2);  // (d, -dmin) pairs as two columns
    }
  });
}

// int6 row layout (qa6.h: qlow uint8 [N, K/2], qhigh uint8 [N, K/4], scales int8 [N, K/16],
// super_scales fp16 [N, K/256]) -> plow [N/16, K/8, 64], phigh [N/16, K/16, 64], pscales
// [N/16, K/16, 16], psuper [N/16, K/256, 16] (written in place).
void int6_to_panel(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                   const at::Tensor& super_scales, at::Tensor plow, at::Tensor phigh,
                   at::Tensor pscales, at::Tensor psuper) {
  TORCH_CHECK(qlow.dim() == 2, "int6_to_panel: qlow must be [N, K/2]");
  const int64_t N = qlow.size(0), K = qlow.size(1) * 2;
  TORCH_CHECK(N % kPanelRows == 0 && K % 256 == 0 && N > 0,
              "int6_to_panel: needs N % 16 == 0 and K % 256 == 0, got N=", N, ", K=", K);
  check_pair("int6_to_panel", "qlow / plow", qlow, plow, at::kByte, N * K / 2);
  check_pair("int6_to_panel", "qhigh / phigh", qhigh, phigh, at::kByte, N * K / 4);
  check_pair("int6_to_panel", "scales / pscales", scales, pscales, at::kChar, N * K / 16);
  check_pair("int6_to_panel", "super_scales / psuper", super_scales, psuper, at::kHalf,
             N * K / 256);
  const uint8_t* ql = qlow.data_ptr<uint8_t>();
  const uint8_t* qh = qhigh.data_ptr<uint8_t>();
  uint8_t* pl = plow.data_ptr<uint8_t>();
  uint8_t* ph = phigh.data_ptr<uint8_t>();
  const int64_t ns = K / 16;
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> top(K);
    for (int64_t t = t0; t < t1; ++t) {
      nibbles_to_panel_tile(ql, pl, t, K);  // the low nibbles: int4_to_panel's byte order
      for (int j = 0; j < 16; ++j) {
        const int64_t n = t * 16 + j;
        // row n's top bits (qa6.h: byte i of a chunk's 32 holds columns 2 i, 2 (i + 32),
        // 2 i + 1, 2 (i + 32) + 1 in bit pairs 0-1, 2-3, 4-5, 6-7)
        for (int64_t c = 0; c < K / 128; ++c)
          for (int i = 0; i < 32; ++i) {
            const uint8_t h = qh[n * (K / 4) + 32 * c + i];
            uint8_t* tc = top.data() + 128 * c;
            tc[2 * i] = h & 3;
            tc[2 * (i + 32)] = (h >> 2) & 3;
            tc[2 * i + 1] = (h >> 4) & 3;
            tc[2 * (i + 32) + 1] = (h >> 6) & 3;
          }
        for (int64_t s = 0; s < ns; ++s)
          for (int b = 0; b < 4; ++b) {
            const uint8_t* tc = top.data() + 16 * s + b;
            ph[(t * ns + s) * 64 + 4 * j + b] =
                static_cast<uint8_t>(tc[0] | (tc[4] << 2) | (tc[8] << 4) | (tc[12] << 6));
          }
      }
      interleave(static_cast<const uint8_t*>(scales.data_ptr()),
                 static_cast<uint8_t*>(pscales.data_ptr()), t, ns, 1);
      interleave(static_cast<const uint8_t*>(super_scales.data_ptr()),
                 static_cast<uint8_t*>(psuper.data_ptr()), t, K / 256, 2);
    }
  });
}

// qweight int8 [N, K] -> qpanel int8 [N/16, K/4, 64]; scales fp16 [N, K/32] -> pscales
// [N/16, K/32, 16] (panel8.h; written in place).
void int8_to_panel(const at::Tensor& qweight, const at::Tensor& scales, at::Tensor qpanel,
                   at::Tensor pscales) {
  TORCH_CHECK(qweight.dim() == 2, "int8_to_panel: qweight must be [N, K]");
  const int64_t N = qweight.size(0), K = qweight.size(1);
  TORCH_CHECK(N % kPanelRows == 0 && K % 32 == 0 && N > 0,
              "int8_to_panel: needs N % 16 == 0 and K % 32 == 0, got N=", N, ", K=", K);
  check_pair("int8_to_panel", "qweight / qpanel", qweight, qpanel, at::kChar, N * K);
  check_pair("int8_to_panel", "scales / pscales", scales, pscales, at::kHalf, N * K / 32);
  const auto* q = static_cast<const uint8_t*>(qweight.data_ptr());
  auto* qp = static_cast<uint8_t*>(qpanel.data_ptr());
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      interleave(q, qp, t, K / 4, 4);  // 4 columns (bytes) per lane
      interleave(static_cast<const uint8_t*>(scales.data_ptr()),
                 static_cast<uint8_t*>(pscales.data_ptr()), t, K / 32, 2);
    }
  });
}

// Rows [row0, row0 + R) of a one-level int4 panel weight (qpanel uint8 [N/16, K/8, 64],
// pscales / pmins fp16 [N/16, K/32, 16]) -> out [R, K]: int4_dequantize's values of the row
// layout, bit for bit (panel_rows).
void int4_panel_dequantize(const at::Tensor& qpanel, const at::Tensor& pscales,
                           const at::Tensor& pmins, int64_t row0, at::Tensor out, int64_t isa) {
  TORCH_CHECK(qpanel.dim() == 3 && qpanel.size(2) == 64 && qpanel.scalar_type() == at::kByte &&
                  qpanel.is_contiguous(),
              "int4_panel_dequantize: qpanel must be contiguous uint8 [N/16, K/8, 64]");
  const int64_t N = qpanel.size(0) * kPanelRows, K = qpanel.size(1) * 8, ng = K / 32;
  check_pair("int4_panel_dequantize", "pscales / pmins", pscales, pmins, at::kHalf, N * ng);
  const uint8_t* qp = qpanel.data_ptr<uint8_t>();
  const auto* ps = static_cast<const uint16_t*>(pscales.data_ptr());
  const auto* pm = static_cast<const uint16_t*>(pmins.data_ptr());
  const int64_t use = cpu_clamp_isa(isa);
  panel_rows("int4_panel_dequantize", N, K, K / 2, row0, out,
      [&](int64_t t, uint8_t* q, uint16_t* s, uint16_t* m) {
        nibbles_from_panel_tile(qp, q, t, K);
        deinterleave(reinterpret_cast<const uint8_t*>(ps), reinterpret_cast<uint8_t*>(s), t,
                     ng, 2);
        deinterleave(reinterpret_cast<const uint8_t*>(pm), reinterpret_cast<uint8_t*>(m), t,
                     ng, 2);
      },
      [&](const uint8_t* q, const uint16_t* s, const uint16_t* m, void* o, bool bf16) {
        if (use != kScalar) {
          const Int4DequantArgs a{q, s, m, true, o, bf16, K, 32, ng};
          (use == kAvx512 ? int4_dequant_rows_avx512 : int4_dequant_rows_avx2)(a, 0, 16);
          return;
        }
        const auto* sh = reinterpret_cast<const at::Half*>(s);
        const auto* mh = reinterpret_cast<const at::Half*>(m);
        if (bf16) dequant4_rows(q, sh, mh, static_cast<at::BFloat16*>(o), 0, 16, K, 32);
        else dequant4_rows(q, sh, mh, static_cast<float*>(o), 0, 16, K, 32);
      });
}

// Rows [row0, row0 + R) of an int8 panel weight (qpanel int8 [N/16, K/4, 64], pscales fp16
// [N/16, K/32, 16]) -> out [R, K]: int8_dequantize's values of the row layout, bit for bit
// (panel_rows).
void int8_panel_dequantize(const at::Tensor& qpanel, const at::Tensor& pscales, int64_t row0,
                           at::Tensor out, int64_t isa) {
  TORCH_CHECK(qpanel.dim() == 3 && qpanel.size(2) == 64 && qpanel.scalar_type() == at::kChar &&
                  qpanel.is_contiguous(),
              "int8_panel_dequantize: qpanel must be contiguous int8 [N/16, K/4, 64]");
  const int64_t N = qpanel.size(0) * kPanelRows, K = qpanel.size(1) * 4, ng = K / 32;
  TORCH_CHECK(pscales.scalar_type() == at::kHalf && pscales.is_contiguous() &&
                  pscales.numel() == N * ng,
              "int8_panel_dequantize: pscales must be contiguous fp16 [N/16, K/32, 16]");
  const auto* qp = static_cast<const uint8_t*>(qpanel.data_ptr());
  const auto* ps = static_cast<const uint8_t*>(pscales.data_ptr());
  const int64_t use = cpu_clamp_isa(isa);
  const auto rows = use == kAvx512 ? int8_dequant_rows_avx512
                  : use == kAvx2   ? int8_dequant_rows_avx2
                                   : int8_dequant_rows_portable;
  panel_rows("int8_panel_dequantize", N, K, K, row0, out,
      [&](int64_t t, uint8_t* q, uint16_t* s, uint16_t*) {
        deinterleave(qp, q, t, K / 4, 4);
        deinterleave(ps, reinterpret_cast<uint8_t*>(s), t, ng, 2);
      },
      [&](const uint8_t* q, const uint16_t* s, const uint16_t*, void* o, bool bf16) {
        const Int8DequantArgs a{reinterpret_cast<const int8_t*>(q), s, nullptr, true, o, bf16,
                                K, 32, ng};
        rows(a, 0, 16);
      });
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int4_to_panel(Tensor qweight, Tensor scales, Tensor mins, Tensor? super_scales, "
        "Tensor(a!) qpanel, Tensor(b!) pscales, Tensor(c!) pmins, Tensor(d!)? psuper) -> ()");
  m.def("int6_to_panel(Tensor qlow, Tensor qhigh, Tensor scales, Tensor super_scales, "
        "Tensor(a!) plow, Tensor(b!) phigh, Tensor(c!) pscales, Tensor(d!) psuper) -> ()");
  m.def("int8_to_panel(Tensor qweight, Tensor scales, Tensor(a!) qpanel, Tensor(b!) pscales) "
        "-> ()");
  m.def("int4_panel_dequantize(Tensor qpanel, Tensor pscales, Tensor pmins, int row0, "
        "Tensor(a!) out, int isa) -> ()");
  m.def("int8_panel_dequantize(Tensor qpanel, Tensor pscales, int row0, Tensor(a!) out, "
        "int isa) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_to_panel", &localchat_cpu::int4_to_panel);
  m.impl("int6_to_panel", &localchat_cpu::int6_to_panel);
  m.impl("int8_to_panel", &localchat_cpu::int8_to_panel);
  m.impl("int4_panel_dequantize", &localchat_cpu::int4_panel_dequantize);
  m.impl("int8_panel_dequantize", &localchat_cpu::int8_panel_dequantize);
}
