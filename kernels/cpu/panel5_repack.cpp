// The int5 panel layout's conversions (panel5.h), in place of the PyTorch references
// (localchat.engine.quant.int5_panel.to_panel5 / from_panel5, equal to them bit for bit):
// int5_to_panel converts a Q5_0 layer's row layout (qa5.h) once, on a first load, before the
// cache write; int5_panel_dequantize writes rows of the weight back as floats (a prompt's
// GEMM, rows read back), each tile turned into its 16 rows of the row layout and dequantized
// by that layout's kernels, so the values are int5_dequantize's bit for bit. Threads over
// tiles.
//
// Top bits: the row layout keeps, per 128-column chunk and 32-column group gg of it, a 16-bit
// mask E of the group's even columns (bit i: column 2 i) and O of its odd ones; the panel's
// 4 bytes of (output, group) hold, in byte b, bit v = column 4 v + b. So byte 0 is E's even
// bits, byte 2 its odd bits, bytes 1 and 3 the same of O.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "isa.h"
#include "panel4.h"  // kPanelRows
#include "qa5.h"
#include "quant.h"

namespace localchat_cpu {
namespace {

#include "panel_repack.h"

// Bits 0, 2, .., 14 of x -> bits 0 .. 7.
inline uint8_t even_bits(uint32_t x) {
  x &= 0x5555u;
  x = (x | (x >> 1)) & 0x3333u;
  x = (x | (x >> 2)) & 0x0F0Fu;
  return static_cast<uint8_t>((x | (x >> 4)) & 0x00FFu);
}

// The inverse: bits 0 .. 7 of x -> bits 0, 2, .., 14, from a table (the way back runs for
// every prompt's GEMM: 4 table reads per output and 32 columns).
struct SpreadTable {
  uint16_t v[256];
  SpreadTable() {
    for (uint32_t x = 0; x < 256; ++x) {
      uint32_t y = (x | (x << 4)) & 0x0F0Fu;
      y = (y | (y << 2)) & 0x3333u;
      v[x] = static_cast<uint16_t>((y | (y << 1)) & 0x5555u);
    }
  }
};
const SpreadTable kSpread;

// qlow uint8 [N, K/2], qhigh uint8 [N, K/8], scales fp16 [N, K/32] (qa5.h) -> plow
// [N/16, K/8, 64], phigh [N/16, K/32, 64], pscales [N/16, K/32, 16] (written in place).
void int5_to_panel(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                   at::Tensor plow, at::Tensor phigh, at::Tensor pscales) {
  TORCH_CHECK(qlow.dim() == 2, "int5_to_panel: qlow must be [N, K/2]");
  const int64_t N = qlow.size(0), K = qlow.size(1) * 2, ng = K / 32;
  TORCH_CHECK(N % kPanelRows == 0 && K % 128 == 0 && N > 0,
              "int5_to_panel: needs N % 16 == 0 and K % 128 == 0, got N=", N, ", K=", K);
  check_pair("int5_to_panel", "qlow / plow", qlow, plow, at::kByte, N * K / 2);
  check_pair("int5_to_panel", "qhigh / phigh", qhigh, phigh, at::kByte, N * K / 8);
  check_pair("int5_to_panel", "scales / pscales", scales, pscales, at::kHalf, N * ng);
  const uint8_t* qh = qhigh.data_ptr<uint8_t>();
  uint8_t* ph = phigh.data_ptr<uint8_t>();
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      nibbles_to_panel_tile(qlow.data_ptr<uint8_t>(), plow.data_ptr<uint8_t>(), t, K);
      for (int j = 0; j < 16; ++j) {
        const uint8_t* row = qh + (t * 16 + j) * (K / 8);
        for (int64_t g = 0; g < ng; ++g) {
          uint16_t e, o;
          std::memcpy(&e, row + 16 * (g / 4) + 2 * (g % 4), 2);
          std::memcpy(&o, row + 16 * (g / 4) + 8 + 2 * (g % 4), 2);
          uint8_t* p = ph + (t * ng + g) * 64 + 4 * j;
          p[0] = even_bits(e);
          p[1] = even_bits(o);
          p[2] = even_bits(e >> 1);
          p[3] = even_bits(o >> 1);
        }
      }
      interleave(static_cast<const uint8_t*>(scales.data_ptr()),
                 static_cast<uint8_t*>(pscales.data_ptr()), t, ng, 2);
    }
  });
}

// Rows [row0, row0 + R) of an int5 panel weight (plow, phigh, pscales as int5_panel_a8's)
// -> out [R, K] fp32 or bf16: int5_dequantize's values of the row layout, bit for bit
// (panel_rows: each tile back to 16 rows, qlow then qhigh in one buffer).
void int5_panel_dequantize(const at::Tensor& plow, const at::Tensor& phigh,
                           const at::Tensor& pscales, int64_t row0, at::Tensor out, int64_t isa) {
  TORCH_CHECK(plow.dim() == 3 && plow.size(2) == 64 && plow.scalar_type() == at::kByte &&
                  plow.is_contiguous() && plow.size(1) % 16 == 0,
              "int5_panel_dequantize: plow must be contiguous uint8 [N/16, K/8, 64], K % 128 == 0");
  const int64_t N = plow.size(0) * kPanelRows, K = plow.size(1) * 8, ng = K / 32;
  TORCH_CHECK(phigh.scalar_type() == at::kByte && phigh.is_contiguous() &&
                  phigh.numel() == N * K / 8,
              "int5_panel_dequantize: phigh must be contiguous uint8 [N/16, K/32, 64]");
  TORCH_CHECK(pscales.scalar_type() == at::kHalf && pscales.is_contiguous() &&
                  pscales.numel() == N * ng,
              "int5_panel_dequantize: pscales must be contiguous fp16 [N/16, K/32, 16]");
  const uint8_t* pl = plow.data_ptr<uint8_t>();
  const uint8_t* ph = phigh.data_ptr<uint8_t>();
  const auto* ps = static_cast<const uint8_t*>(pscales.data_ptr());
  const int64_t use = cpu_clamp_isa(isa);
  const auto rows = use == kAvx512 ? int5_dequant_rows_avx512
                  : use == kAvx2   ? int5_dequant_rows_avx2
                                   : int5_dequant_rows_scalar;
  panel_rows("int5_panel_dequantize", N, K, K / 2 + K / 8, row0, out,
      [&](int64_t t, uint8_t* q, uint16_t* s, uint16_t*) {
        nibbles_from_panel_tile(pl, q, t, K);
        uint8_t* qh = q + kPanelRows * (K / 2);
        for (int j = 0; j < 16; ++j)
          for (int64_t g = 0; g < ng; ++g) {
            const uint8_t* p = ph + (t * ng + g) * 64 + 4 * j;
            const uint16_t e = kSpread.v[p[0]] | (kSpread.v[p[2]] << 1);
            const uint16_t o = kSpread.v[p[1]] | (kSpread.v[p[3]] << 1);
            uint8_t* row = qh + j * (K / 8) + 16 * (g / 4) + 2 * (g % 4);
            std::memcpy(row, &e, 2);
            std::memcpy(row + 8, &o, 2);
          }
        deinterleave(ps, reinterpret_cast<uint8_t*>(s), t, ng, 2);
      },
      [&](const uint8_t* q, const uint16_t* s, const uint16_t*, void* o, bool bf16) {
        Int5Args a{};
        a.qlow = q;
        a.qhigh = q + kPanelRows * (K / 2);
        a.sc = s;
        a.N = kPanelRows;
        a.K = K;
        rows(a, o, bf16, 0, kPanelRows);
      });
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int5_to_panel(Tensor qlow, Tensor qhigh, Tensor scales, Tensor(a!) plow, "
        "Tensor(b!) phigh, Tensor(c!) pscales) -> ()");
  m.def("int5_panel_dequantize(Tensor plow, Tensor phigh, Tensor pscales, int row0, "
        "Tensor(a!) out, int isa) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int5_to_panel", &localchat_cpu::int5_to_panel);
  m.impl("int5_panel_dequantize", &localchat_cpu::int5_panel_dequantize);
}
