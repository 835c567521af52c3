// The row layout -> panel layout conversions of int4 weights (panel4.h) and int6 weights
// (panel6.h), in place of the PyTorch references (localchat.engine.quant.int4_panel.to_panel,
// int6_panel.to_panel6, equal to them bit for bit): a first load converts every Q4_K and Q6_K
// layer once, before the cache write. Threads over tiles.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "panel4.h"
#include "panel6.h"

namespace localchat_cpu {
namespace {

void check_pair(const char* op, const char* what, const at::Tensor& row,
                const at::Tensor& panel, at::ScalarType dt, int64_t numel) {
  TORCH_CHECK(row.scalar_type() == dt && panel.scalar_type() == dt && row.is_contiguous() &&
                  panel.is_contiguous() && row.numel() == numel && panel.numel() == numel,
              op, ": ", what, " must be contiguous ", dt, " tensors of ", numel,
              " elements, got ", row.sizes(), " and ", panel.sizes());
}

// [N, C] elements of `es` bytes (row layout, C per output) -> [N/16, C, 16] (panel), tile t.
inline void interleave(const uint8_t* src, uint8_t* dst, int64_t t, int64_t C, int es) {
  for (int j = 0; j < 16; ++j)
    for (int64_t c = 0; c < C; ++c)
      std::memcpy(dst + ((t * C + c) * 16 + j) * es, src + ((t * 16 + j) * C + c) * es, es);
}

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
  const int64_t oct = K / 8, ng = K / 32;
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int j = 0; j < 16; ++j) {
        const int64_t n = t * 16 + j;
        for (int64_t o = 0; o < oct; ++o) {
          // row bytes 4o..4o+3 hold (w0, w1), (w2, w3), (w4, w5), (w6, w7) of the octet
          const uint8_t* b = q + n * (K / 2) + 4 * o;
          uint8_t* p = qp + (t * oct + o) * 64 + 4 * j;
          p[0] = static_cast<uint8_t>((b[0] & 0x0F) | ((b[2] & 0x0F) << 4));
          p[1] = static_cast<uint8_t>((b[0] >> 4) | (b[2] & 0xF0));
          p[2] = static_cast<uint8_t>((b[1] & 0x0F) | ((b[3] & 0x0F) << 4));
          p[3] = static_cast<uint8_t>((b[1] >> 4) | (b[3] & 0xF0));
        }
      }
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
  const int64_t oct = K / 8, ns = K / 16;
  at::parallel_for(0, N / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> top(K);
    for (int64_t t = t0; t < t1; ++t) {
      for (int j = 0; j < 16; ++j) {
        const int64_t n = t * 16 + j;
        for (int64_t o = 0; o < oct; ++o) {  // the nibbles: int4_to_panel's byte order
          const uint8_t* b = ql + n * (K / 2) + 4 * o;
          uint8_t* p = pl + (t * oct + o) * 64 + 4 * j;
          p[0] = static_cast<uint8_t>((b[0] & 0x0F) | ((b[2] & 0x0F) << 4));
          p[1] = static_cast<uint8_t>((b[0] >> 4) | (b[2] & 0xF0));
          p[2] = static_cast<uint8_t>((b[1] & 0x0F) | ((b[3] & 0x0F) << 4));
          p[3] = static_cast<uint8_t>((b[1] >> 4) | (b[3] & 0xF0));
        }
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

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int4_to_panel(Tensor qweight, Tensor scales, Tensor mins, Tensor? super_scales, "
        "Tensor(a!) qpanel, Tensor(b!) pscales, Tensor(c!) pmins, Tensor(d!)? psuper) -> ()");
  m.def("int6_to_panel(Tensor qlow, Tensor qhigh, Tensor scales, Tensor super_scales, "
        "Tensor(a!) plow, Tensor(b!) phigh, Tensor(c!) pscales, Tensor(d!) psuper) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_to_panel", &localchat_cpu::int4_to_panel);
  m.impl("int6_to_panel", &localchat_cpu::int6_to_panel);
}
