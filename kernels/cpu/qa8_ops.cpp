// Checking launchers and torch.library registration of the integer-dot (W4A8 / W8A8) CPU
// matmuls (qa8.h; kernels in qa8_{scalar,avx2,vnni}.cpp and, for the panel layouts,
// panel{4,5,6,8}_{scalar,avx2,vnni}.cpp; activation quantizers in
// qa8_prep.cpp and the vector TUs). The ISA is an argument, clamped to what the CPU has.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <initializer_list>
#include <tuple>
#include <vector>

#include "isa.h"
#include "kscales.h"
#include "panel4.h"
#include "panel5.h"
#include "panel6.h"
#include "panel8.h"
#include "qa8.h"
#include "quant.h"  // enum Isa

namespace localchat_cpu {
namespace {

typedef void (*A8Fn)(const A8Args&, int64_t, int64_t);

// Checks the scale / min tensors: [N, ngroups] fp32 or fp16, contiguous, both one dtype.
bool a8_scales(const char* op, const at::Tensor& scales, const at::Tensor* mins, int64_t N,
               int64_t ng) {
  const auto dt = scales.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kHalf) && scales.numel() == N * ng &&
                  scales.size(0) == N && scales.is_contiguous(),
              op, ": scales must be contiguous fp32 or fp16 [", N, ", ", ng, "], got ",
              scales.sizes(), " ", dt);
  if (mins)
    TORCH_CHECK(mins->scalar_type() == dt && mins->numel() == N * ng && mins->is_contiguous(),
                op, ": mins must be contiguous [", N, ", ", ng, "] of the scales' dtype");
  return dt == at::kHalf;
}

// The activation buffers of one call (qa8.h), in a per-thread scratch that only grows: a
// decode step makes a few hundred of these calls, each would otherwise allocate six tensors.
A8Buffers a8_scratch(const A8Args& a, bool int4) {
  thread_local std::vector<char> buf;
  const int64_t M = a.M, Kp = a.Kp;
  const auto up = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t n_xq = up(M * Kp), n_nc = int4 ? 0 : up(M * (Kp / 4) * 4),
                n_d = up(M * (Kp / 32) * 4), n_dv = up(M * (Kp / 32) * 8 * 4),
                n_xs = a.mins ? up(M * a.ngroups * 4) : 0, n_tbl = up(Kp / 32 * 4);
  const size_t total = n_xq + n_nc + n_d + n_dv + n_xs + n_tbl + 64;
  if (buf.size() < total) buf.resize(total);
  char* p = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  A8Buffers b;
  b.xq = reinterpret_cast<int8_t*>(p);
  p += n_xq;
  b.ncorr = int4 ? nullptr : reinterpret_cast<int32_t*>(p);
  p += n_nc;
  b.d = reinterpret_cast<float*>(p);
  p += n_d;
  b.dv = reinterpret_cast<float*>(p);
  p += n_dv;
  b.xs = a.mins ? reinterpret_cast<float*>(p) : nullptr;
  p += n_xs;
  int32_t* tbl = reinterpret_cast<int32_t*>(p);
  for (int64_t i = 0; i < Kp / 32; ++i)
    tbl[i] = static_cast<int32_t>(std::min(i, a.K / 32 - 1) * 32 / a.group_size);
  b.blk2grp = tbl;
  return b;
}

typedef void (*A8QuantFn)(const void*, bool, int64_t, const A8Args&, const A8Buffers&, bool);

// fn(a, u0, u1) computes output units [u0, u1) of `unit` columns each (1, or a panel layout's
// 16-output tiles).
at::Tensor run_a8(const at::Tensor& x, A8Args a, bool int4, A8Fn fn, A8QuantFn quant,
                  int64_t unit = 1) {
  // fp32 / bf16 rows are read in place (unit column stride); fp16 is widened once.
  const bool direct = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                      x.stride(1) == 1;
  const at::Tensor xs = direct ? x : x.to(at::kFloat).contiguous();
  const bool bf16 = xs.scalar_type() == at::kBFloat16;
  const A8Buffers b = a8_scratch(a, int4);
  quant(xs.data_ptr(), bf16, xs.stride(0), a, b, int4);
  a.xq = b.xq;
  a.ncorr = b.ncorr;
  a.d = b.d;
  a.dv = b.dv;
  a.xs = b.xs;
  a.blk2grp = b.blk2grp;
  at::Tensor out = at::empty({a.M, a.N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = bf16;
  // Threads split output columns; each output is computed by one thread in a fixed order.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.K * a.M * unit));
  at::parallel_for(0, a.N / unit, grain, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
  return x.scalar_type() == out.scalar_type() ? out : out.to(x.scalar_type());
}

A8Fn pick_a8(int64_t isa, A8Fn vnni, A8Fn avx2, A8Fn scalar) {
  const int64_t use = cpu_clamp_isa(isa);
  static const bool vnni_ok = cpu_has_vnni();
  if (use == kAvx512 && vnni_ok) return vnni;
  return use >= kAvx2 ? avx2 : scalar;
}

// The quantizer of the same ISA level as pick_a8's kernel (the same integers on every one).
A8QuantFn pick_a8_quant(int64_t isa) {
  const int64_t use = cpu_clamp_isa(isa);
  static const bool vnni_ok = cpu_has_vnni();
  if (use == kAvx512 && vnni_ok) return a8_quantize_avx512;
  return use >= kAvx2 ? a8_quantize_avx2 : a8_quantize_scalar;
}

at::Tensor int4_matmul_a8(const at::Tensor& x, const at::Tensor& qweight,
                          const at::Tensor& scales, const at::Tensor& mins, int64_t group_size,
                          int64_t isa, const c10::optional<at::Tensor>& super_scales) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int4_matmul_a8: x [M, K], qweight [N, K/2]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) * 2 == K &&
                  qweight.is_contiguous(),
              "int4_matmul_a8: qweight must be contiguous uint8 [N, K/2], got ", qweight.sizes(),
              " for K=", K);
  TORCH_CHECK(K > 0 && group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_matmul_a8: group_size ", group_size, " must be a multiple of 32 dividing K=",
              K);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_matmul_a8: x must be fp32/bf16/fp16");
  const int64_t ng = K / group_size;
  const bool two_level = super_scales.has_value() && super_scales->defined();
  KScales ks{};
  const bool half = two_level ? false : a8_scales("int4_matmul_a8", scales, &mins, N, ng);
  if (two_level)
    ks = check_kscales("int4_matmul_a8", scales, mins, *super_scales, N, K, group_size);
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qweight.data_ptr(),
           scales.data_ptr(), mins.data_ptr(), half, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, group_size, ng};
  // two-level scales are read in place (each kernel forms the exact products itself)
  if (two_level) a.super = reinterpret_cast<const uint16_t*>(ks.sup);
  // ISA level kAmxInt8 asks for the AMX tile kernel (its own summation order) where the CPU
  // runs it; otherwise the level is clamped as for every op
  const bool amx = isa >= kAmxInt8 && M <= 16 && amx_int8_ready();
  return run_a8(x, a, true,
                amx ? int4_a8_amx : pick_a8(isa, int4_a8_vnni, int4_a8_avx2, int4_a8_scalar),
                pick_a8_quant(isa));
}

// W4A8 over the int4 panel layout (panel4.h): x [M, K] fp32 / bf16 / fp16, qpanel uint8
// [N/16, K/8, 64]; two-level: pscales / pmins uint8 [N/16, K/32, 16] and psuper fp16
// [N/16, K/256, 2, 16]; one level (no psuper): pscales / pmins fp16 [N/16, K/32, 16].
at::Tensor int4_panel_a8(const at::Tensor& x, const at::Tensor& qpanel, const at::Tensor& pscales,
                         const at::Tensor& pmins, const c10::optional<at::Tensor>& psuper,
                         int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qpanel.dim() == 3,
              "int4_panel_a8: x [M, K], qpanel [N/16, K/8, 64], got ", x.sizes(), " and ",
              qpanel.sizes());
  const bool two_level = psuper.has_value() && psuper->defined();
  const int64_t M = x.size(0), K = x.size(1), T = qpanel.size(0), N = T * kPanelRows;
  const int64_t unit = two_level ? 256 : 32;
  TORCH_CHECK(K > 0 && K % unit == 0, "int4_panel_a8: K=", K, " must be a multiple of ", unit);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_panel_a8: x must be fp32/bf16/fp16");
  TORCH_CHECK(qpanel.scalar_type() == at::kByte && qpanel.is_contiguous() &&
                  qpanel.sizes() == at::IntArrayRef({T, K / 8, 64}),
              "int4_panel_a8: qpanel must be contiguous uint8 [", T, ", ", K / 8, ", 64], got ",
              qpanel.sizes(), " ", qpanel.scalar_type());
  const auto sdt = two_level ? at::kByte : at::kHalf;
  for (const at::Tensor* t : {&pscales, &pmins})
    TORCH_CHECK(t->scalar_type() == sdt && t->is_contiguous() &&
                    t->sizes() == at::IntArrayRef({T, K / 32, 16}),
                "int4_panel_a8: pscales / pmins must be contiguous ", sdt, " [", T, ", ", K / 32,
                ", 16]", two_level ? " (with psuper)" : " (without psuper)", ", got ",
                t->sizes(), " ", t->scalar_type());
  if (two_level)
    TORCH_CHECK(psuper->scalar_type() == at::kHalf && psuper->is_contiguous() &&
                    psuper->sizes() == at::IntArrayRef({T, K / 256, 2, 16}),
                "int4_panel_a8: psuper must be contiguous fp16 [", T, ", ", K / 256,
                ", 2, 16], got ", psuper->sizes(), " ", psuper->scalar_type());
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qpanel.data_ptr(),
           pscales.data_ptr(), pmins.data_ptr(), !two_level, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, 32, K / 32};
  if (two_level) a.super = reinterpret_cast<const uint16_t*>(psuper->data_ptr<at::Half>());
  static const bool vnni_ok = cpu_has_vnni();
  const A8Fn fn = pick_a8(isa, int4_panel_a8_vnni, int4_panel_a8_avx2, int4_panel_a8_scalar);
  return run_a8(x, a, false, fn, pick_a8_quant(isa), kPanelRows);
}

// One weight tensor of a bit-plane panel layout (int6, int5) and what it must be.
struct PanelPart {
  const char* name;
  const at::Tensor& t;
  at::ScalarType dt;
  std::vector<int64_t> shape;
};

// The checks of a bit-plane panel launcher's x and plow: x [M, K] of a float dtype, K a
// positive multiple of `unit`, plow of rank 3 (its parts: check_parts).
void check_bitplane_x(const char* op, const at::Tensor& x, const at::Tensor& plow,
                      int64_t unit) {
  TORCH_CHECK(x.dim() == 2 && plow.dim() == 3, op, ": x [M, K], plow [N/16, K/8, 64], got ",
              x.sizes(), " and ", plow.sizes());
  const int64_t K = x.size(1);
  TORCH_CHECK(K > 0 && K % unit == 0, op, ": K=", K, " must be a multiple of ", unit);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, op, ": x must be fp32/bf16/fp16");
}

// Each part contiguous with its dtype and shape.
void check_parts(const char* op, std::initializer_list<PanelPart> parts) {
  for (const auto& p : parts)
    TORCH_CHECK(p.t.scalar_type() == p.dt && p.t.is_contiguous() &&
                    p.t.sizes() == at::IntArrayRef(p.shape),
                op, ": ", p.name, " must be contiguous ", p.dt, " ", at::IntArrayRef(p.shape),
                ", got ", p.t.sizes(), " ", p.t.scalar_type());
}

// W6A8 over the int6 panel layout (panel6.h): x [M, K] fp32 / bf16 / fp16, plow uint8
// [N/16, K/8, 64], phigh uint8 [N/16, K/16, 64], pscales int8 [N/16, K/16, 16], psuper fp16
// [N/16, K/256, 16].
at::Tensor int6_panel_a8(const at::Tensor& x, const at::Tensor& plow, const at::Tensor& phigh,
                         const at::Tensor& pscales, const at::Tensor& psuper, int64_t isa) {
  check_bitplane_x("int6_panel_a8", x, plow, 256);
  const int64_t M = x.size(0), K = x.size(1), T = plow.size(0), N = T * kPanelRows;
  check_parts("int6_panel_a8", {{"plow", plow, at::kByte, {T, K / 8, 64}},
                                {"phigh", phigh, at::kByte, {T, K / 16, 64}},
                                {"pscales", pscales, at::kChar, {T, K / 16, 16}},
                                {"psuper", psuper, at::kHalf, {T, K / 256, 16}}});
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, plow.data_ptr(),
           pscales.data_ptr(), nullptr, false, nullptr, false,
           M, N, K, K, 32, K / 32};
  a.super = reinterpret_cast<const uint16_t*>(psuper.data_ptr<at::Half>());
  a.qhigh = phigh.data_ptr();
  // the VNNI and portable kernels read ncorr (the sub-blocks' activation sums), which their
  // quantizers write; the AVX2 kernel sums the int8 activations itself (the AVX2 quantizer,
  // the same integers, writes no ncorr)
  return run_a8(x, a, false,
                pick_a8(isa, int6_panel_a8_vnni, int6_panel_a8_avx2, int6_panel_a8_scalar),
                pick_a8_quant(isa), kPanelRows);
}

// W5A8 over the int5 panel layout (panel5.h): x [M, K] fp32 / bf16 / fp16, plow uint8
// [N/16, K/8, 64], phigh uint8 [N/16, K/32, 64], pscales fp16 [N/16, K/32, 16].
at::Tensor int5_panel_a8(const at::Tensor& x, const at::Tensor& plow, const at::Tensor& phigh,
                         const at::Tensor& pscales, int64_t isa) {
  check_bitplane_x("int5_panel_a8", x, plow, 32);
  const int64_t M = x.size(0), K = x.size(1), T = plow.size(0), N = T * kPanelRows;
  check_parts("int5_panel_a8", {{"plow", plow, at::kByte, {T, K / 8, 64}},
                                {"phigh", phigh, at::kByte, {T, K / 32, 64}},
                                {"pscales", pscales, at::kHalf, {T, K / 32, 16}}});
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, plow.data_ptr(),
           pscales.data_ptr(), nullptr, true, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, 32, K / 32};
  a.qhigh = phigh.data_ptr();
  // no VNNI kernel yet: AVX-512 CPUs run the AVX2 one (it sums the int8 activations itself;
  // the portable kernel reads ncorr, which the portable quantizer writes)
  return run_a8(x, a, false,
                pick_a8(isa, int5_panel_a8_avx2, int5_panel_a8_avx2, int5_panel_a8_scalar),
                pick_a8_quant(isa), kPanelRows);
}

// W8A8 over the int8 panel layout (panel8.h): x [M, K] fp32 / bf16 / fp16, qpanel int8
// [N/16, K/4, 64], pscales fp16 [N/16, K/32, 16].
at::Tensor int8_panel_a8(const at::Tensor& x, const at::Tensor& qpanel, const at::Tensor& pscales,
                         int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qpanel.dim() == 3,
              "int8_panel_a8: x [M, K], qpanel [N/16, K/4, 64], got ", x.sizes(), " and ",
              qpanel.sizes());
  const int64_t M = x.size(0), K = x.size(1), T = qpanel.size(0), N = T * kPanelRows;
  TORCH_CHECK(K > 0 && K % 32 == 0, "int8_panel_a8: K=", K, " must be a multiple of 32");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int8_panel_a8: x must be fp32/bf16/fp16");
  TORCH_CHECK(qpanel.scalar_type() == at::kChar && qpanel.is_contiguous() &&
                  qpanel.sizes() == at::IntArrayRef({T, K / 4, 64}),
              "int8_panel_a8: qpanel must be contiguous int8 [", T, ", ", K / 4, ", 64], got ",
              qpanel.sizes(), " ", qpanel.scalar_type());
  TORCH_CHECK(pscales.scalar_type() == at::kHalf && pscales.is_contiguous() &&
                  pscales.sizes() == at::IntArrayRef({T, K / 32, 16}),
              "int8_panel_a8: pscales must be contiguous fp16 [", T, ", ", K / 32, ", 16], got ",
              pscales.sizes(), " ", pscales.scalar_type());
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qpanel.data_ptr(),
           pscales.data_ptr(), nullptr, true, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, 32, K / 32};
  // the VNNI and portable kernels read ncorr, which their quantizers write; the AVX2 kernel
  // (the sign trick) needs no activation sum
  return run_a8(x, a, false,
                pick_a8(isa, int8_panel_a8_vnni, int8_panel_a8_avx2, int8_panel_a8_scalar),
                pick_a8_quant(isa), kPanelRows);
}

at::Tensor int8_matmul_a8(const at::Tensor& x, const at::Tensor& qweight,
                          const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                          int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int8_matmul_a8: x [M, K], qweight [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.size(1) == K &&
                  qweight.is_contiguous(),
              "int8_matmul_a8: qweight must be contiguous int8 [N, K], got ", qweight.sizes(),
              " for K=", K);
  TORCH_CHECK(K > 0 && K % 32 == 0 && group_size > 0 && K % group_size == 0 &&
                  (group_size == 16 || group_size % 32 == 0),
              "int8_matmul_a8: group_size ", group_size,
              " must be 16 or a multiple of 32 dividing K=", K, " (K a multiple of 32)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int8_matmul_a8: x must be fp32/bf16/fp16");
  const int64_t ng = K / group_size;
  const bool has_min = mins.has_value() && mins->defined();
  const bool half = a8_scales("int8_matmul_a8", scales, has_min ? &*mins : nullptr, N, ng);
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qweight.data_ptr(),
           scales.data_ptr(), has_min ? mins->data_ptr() : nullptr, half, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, group_size, ng};
  return run_a8(x, a, false, pick_a8(isa, int8_a8_vnni, int8_a8_avx2, int8_a8_scalar),
                pick_a8_quant(isa));
}

// The activation quantizer alone (tests: the same integers on every ISA): x [M, K] fp32 / bf16
// (K % 32 == 0) -> (xq [M, Kp] int8 in the int4 or int8 layout of qa8.h, d [M, Kp / 32]).
std::tuple<at::Tensor, at::Tensor> a8_quantize(const at::Tensor& x, bool int4, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.size(1) % 32 == 0 && x.stride(1) == 1 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "a8_quantize: x must be fp32/bf16 [M, K] with K % 32 == 0 and unit column stride");
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 127) / 128 * 128;
  A8Args a{};
  a.M = M;
  a.K = K;
  a.Kp = Kp;
  a.group_size = 32;
  a.ngroups = K / 32;
  at::Tensor xq = at::empty({M, Kp}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, Kp / 32}, x.options().dtype(at::kFloat));
  at::Tensor dv = at::empty({M, Kp / 32 * 8}, x.options().dtype(at::kFloat));
  at::Tensor nc = at::empty({M, Kp / 4}, x.options().dtype(at::kInt));
  A8Buffers b{xq.data_ptr<int8_t>(), int4 ? nullptr : nc.data_ptr<int32_t>(),
              d.data_ptr<float>(), dv.data_ptr<float>(), nullptr, nullptr};
  pick_a8_quant(isa)(x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), a, b, int4);
  return {xq, d};
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("a8_quantize(Tensor x, bool int4, int isa) -> (Tensor, Tensor)",
        &localchat_cpu::a8_quantize);
  m.def("int4_matmul_a8(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "int isa, Tensor? super_scales=None) -> Tensor");
  m.def("int8_matmul_a8(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, "
        "int group_size, int isa) -> Tensor");
  m.def("int4_panel_a8(Tensor x, Tensor qpanel, Tensor pscales, Tensor pmins, Tensor? psuper, "
        "int isa) -> Tensor");
  m.def("int6_panel_a8(Tensor x, Tensor plow, Tensor phigh, Tensor pscales, Tensor psuper, "
        "int isa) -> Tensor");
  m.def("int5_panel_a8(Tensor x, Tensor plow, Tensor phigh, Tensor pscales, int isa) -> Tensor");
  m.def("int8_panel_a8(Tensor x, Tensor qpanel, Tensor pscales, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_matmul_a8", &localchat_cpu::int4_matmul_a8);
  m.impl("int8_matmul_a8", &localchat_cpu::int8_matmul_a8);
  m.impl("int4_panel_a8", &localchat_cpu::int4_panel_a8);
  m.impl("int5_panel_a8", &localchat_cpu::int5_panel_a8);
  m.impl("int6_panel_a8", &localchat_cpu::int6_panel_a8);
  m.impl("int8_panel_a8", &localchat_cpu::int8_panel_a8);
}
