// Checking launchers and torch.library registration (a fragment of namespace
// ``localchat_cpu``) of the exact fp32 panel matmuls (panelf.h): int4_panel_f32 over a
// one-level int4 panel (GGUF Q4_0 / Q4_1), int5_panel_f32 over an int5 panel (Q5_0),
// int8_panel_f32 over an int8 panel (Q8_0). The ISA
// argument (0 scalar, 1 AVX2, 2 AVX-512: the AVX2 kernel) is clamped to what the CPU runs.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "isa.h"
#include "panelf.h"

namespace localchat_cpu {
namespace {

constexpr int64_t kTile = 16;  // outputs per panel tile

typedef void (*PanelF32Fn)(const PanelF32Args&, int64_t, int64_t);

void check_scales(const char* op, const char* name, const at::Tensor& s, int64_t T, int64_t K) {
  TORCH_CHECK(s.scalar_type() == at::kHalf && s.is_contiguous() &&
                  s.sizes() == at::IntArrayRef({T, K / 32, kTile}),
              op, ": ", name, " must be contiguous fp16 [", T, ", ", K / 32, ", 16], got ",
              s.sizes(), " ", s.scalar_type());
}

// x [M, K] fp32 / bf16 / fp16 -> [M, N] in x.dtype: fn over tiles on the torch thread pool
// (each output computed by one thread in a fixed order: the thread count changes no result).
at::Tensor run(const char* op, const at::Tensor& x, const at::Tensor& qpanel, int64_t per_oct,
               const at::Tensor& pscales, const at::Tensor* pmins, PanelF32Fn fn,
               const at::Tensor* phigh = nullptr) {
  TORCH_CHECK(x.dim() == 2 && qpanel.dim() == 3, op, ": x [M, K] and qpanel [N/16, K/", per_oct,
              ", 64], got ", x.sizes(), " and ", qpanel.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kBFloat16 || xt == at::kHalf, op,
              ": x must be fp32/bf16/fp16, got ", xt);
  const int64_t M = x.size(0), K = x.size(1), T = qpanel.size(0), N = T * kTile;
  TORCH_CHECK(K > 0 && K % 32 == 0, op, ": K=", K, " must be a multiple of 32");
  const auto qt = per_oct == 8 ? at::kByte : at::kChar;
  TORCH_CHECK(qpanel.scalar_type() == qt && qpanel.is_contiguous() &&
                  qpanel.sizes() == at::IntArrayRef({T, K / per_oct, 64}),
              op, ": qpanel must be contiguous ", qt, " [", T, ", ", K / per_oct, ", 64], got ",
              qpanel.sizes(), " ", qpanel.scalar_type());
  check_scales(op, "pscales", pscales, T, K);
  if (pmins) check_scales(op, "pmins", *pmins, T, K);
  if (phigh)
    TORCH_CHECK(phigh->scalar_type() == at::kByte && phigh->is_contiguous() &&
                    phigh->sizes() == at::IntArrayRef({T, K / 32, 64}),
                op, ": phigh must be contiguous uint8 [", T, ", ", K / 32, ", 64], got ",
                phigh->sizes(), " ", phigh->scalar_type());
  at::Tensor x32 = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return out.to(xt);
  const PanelF32Args a{x32.data_ptr<float>(), qpanel.data_ptr(),
                       reinterpret_cast<const uint16_t*>(pscales.data_ptr()),
                       pmins ? reinterpret_cast<const uint16_t*>(pmins->data_ptr()) : nullptr,
                       phigh ? phigh->data_ptr<uint8_t>() : nullptr,
                       out.data_ptr<float>(), M, N, K};
  // a task holds at least ~64K weight x row products and 4 tiles (the one-row pass's group)
  const int64_t grain = std::max<int64_t>(4, (65536 / std::max<int64_t>(1, kTile * K * M)) / 4 * 4);
  at::parallel_for(0, T, grain, [&](int64_t t0, int64_t t1) { fn(a, t0, t1); });
  return xt == at::kFloat ? out : out.to(xt);
}

at::Tensor int4_panel_f32(const at::Tensor& x, const at::Tensor& qpanel, const at::Tensor& pscales,
                          const at::Tensor& pmins, int64_t isa) {
  return run("int4_panel_f32", x, qpanel, 8, pscales, &pmins,
             cpu_clamp_isa(isa) >= 1 ? int4_panel_f32_avx2 : int4_panel_f32_scalar);
}

at::Tensor int5_panel_f32(const at::Tensor& x, const at::Tensor& plow, const at::Tensor& phigh,
                          const at::Tensor& pscales, int64_t isa) {
  return run("int5_panel_f32", x, plow, 8, pscales, nullptr,
             cpu_clamp_isa(isa) >= 1 ? int5_panel_f32_avx2 : int5_panel_f32_scalar, &phigh);
}

at::Tensor int8_panel_f32(const at::Tensor& x, const at::Tensor& qpanel, const at::Tensor& pscales,
                          int64_t isa) {
  return run("int8_panel_f32", x, qpanel, 4, pscales, nullptr,
             cpu_clamp_isa(isa) >= 1 ? int8_panel_f32_avx2 : int8_panel_f32_scalar);
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int4_panel_f32(Tensor x, Tensor qpanel, Tensor pscales, Tensor pmins, int isa) -> Tensor");
  m.def("int5_panel_f32(Tensor x, Tensor plow, Tensor phigh, Tensor pscales, int isa) -> Tensor");
  m.def("int8_panel_f32(Tensor x, Tensor qpanel, Tensor pscales, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_panel_f32", &localchat_cpu::int4_panel_f32);
  m.impl("int5_panel_f32", &localchat_cpu::int5_panel_f32);
  m.impl("int8_panel_f32", &localchat_cpu::int8_panel_f32);
}
