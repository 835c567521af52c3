// Checking launcher, portable scalar kernel and torch.library registration (a fragment of
// namespace ``localchat_cpu``) of the int8 group-wise row dequantization that feeds the
// prefill GEMMs (localchat.engine.quant.cpu_prefill). Contract: dequant.h and
// localchat.kernels.reference.dequantize_int8. The ISA argument (0 scalar, 1 AVX2, 2 AVX-512)
// is clamped to what the CPU runs; the vector kernels are in dequant_{avx2,avx512}.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "dequant.h"
#include "isa.h"
#include "strip_gemm.h"

namespace localchat_cpu {
namespace {

// Portable path: c10's exact fp16 -> fp32 widening and round-to-nearest-even bf16 narrowing.
// Compiled for the baseline ISA (x86-64 has no FMA there, so q * s + m stays two roundings).
template <class ST, class OT>
void int8_dequant_rows_scalar(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, G = a.group_size, ng = a.ngroups;
  const ST* sc = static_cast<const ST*>(a.scales);
  const ST* mn = static_cast<const ST*>(a.mins);
  OT* out = static_cast<OT*>(a.out);
  for (int64_t n = r0; n < r1; ++n) {
    const int8_t* q = a.qweight + n * K;
    for (int64_t g = 0; g < ng; ++g) {
      const float s = static_cast<float>(sc[n * ng + g]);
      const float m = mn ? static_cast<float>(mn[n * ng + g]) : 0.0f;
      for (int64_t k = g * G; k < (g + 1) * G; ++k) {
        float w = static_cast<float>(q[k]) * s;
        if (mn) w = w + m;
        out[n * K + k] = static_cast<OT>(w);
      }
    }
  }
}

}  // namespace

void int8_dequant_rows_portable(const Int8DequantArgs& a, int64_t r0, int64_t r1) {
  if (a.half && a.bf16) int8_dequant_rows_scalar<at::Half, at::BFloat16>(a, r0, r1);
  else if (a.half) int8_dequant_rows_scalar<at::Half, float>(a, r0, r1);
  else if (a.bf16) int8_dequant_rows_scalar<float, at::BFloat16>(a, r0, r1);
  else int8_dequant_rows_scalar<float, float>(a, r0, r1);
}

namespace {

// Checks an int8 weight (qweight int8 [N, K] with contiguous fp32 | fp16 scales, and mins,
// [N, K / group_size]) for `op`; the row kernels' arguments with no output set.
Int8DequantArgs check_int8_weight(const char* op, const at::Tensor& qweight,
                                  const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                                  int64_t group_size) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kChar && qweight.is_contiguous(),
              op, ": qweight must be contiguous int8 [N, K], got ", qweight.sizes(), " ",
              qweight.scalar_type());
  const int64_t N = qweight.size(0), K = qweight.size(1);
  TORCH_CHECK(group_size > 0 && K % group_size == 0,
              op, ": group_size ", group_size, " must divide K=", K);
  const int64_t ng = K / group_size;
  const auto dt = scales.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kHalf) && scales.dim() == 2 &&
                  scales.size(0) == N && scales.size(1) == ng && scales.is_contiguous(),
              op, ": scales must be contiguous fp32 or fp16 [", N, ", ", ng, "], got ",
              scales.sizes(), " ", dt);
  const bool has_min = mins.has_value() && mins->defined();
  if (has_min)
    TORCH_CHECK(mins->scalar_type() == dt && mins->sizes() == scales.sizes() &&
                    mins->is_contiguous(),
                op, ": mins must be contiguous [", N, ", ", ng, "] of the scales' dtype, got ",
                mins->sizes(), " ", mins->scalar_type());
  return Int8DequantArgs{qweight.data_ptr<int8_t>(), scales.data_ptr(),
                         has_min ? mins->data_ptr() : nullptr, dt == at::kHalf, nullptr, false,
                         K, group_size, ng};
}

// out [N, K] fp32 | bf16 (contiguous, written in place) <- q * s (+ m) of int8 qweight
// [N, K] with contiguous fp32 | fp16 scales (and mins) [N, K / group_size].
void int8_dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& mins, int64_t group_size, at::Tensor out,
                     int64_t isa) {
  Int8DequantArgs a = check_int8_weight("int8_dequantize", qweight, scales, mins, group_size);
  const int64_t N = qweight.size(0), K = a.K;
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(0) == N && out.size(1) == K && out.is_contiguous(),
              "int8_dequantize: out must be contiguous fp32 or bf16 [", N, ", ", K, "], got ",
              out.sizes(), " ", out.scalar_type());
  a.out = out.data_ptr();
  a.bf16 = out.scalar_type() == at::kBFloat16;
  const int64_t use = cpu_clamp_isa(isa);
  void (*fn)(const Int8DequantArgs&, int64_t, int64_t) =
      use == 2 ? int8_dequant_rows_avx512 : use == 1 ? int8_dequant_rows_avx2
                                                 : int8_dequant_rows_portable;
  // rows are independent; each chunk at least ~16k weights so a thread's share outweighs
  // waking it
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K));
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
}

// The int8 weight for the AMX prefill GEMM: rows through amx.h's int8_rows_bf16_amx, or the
// AVX-512 row kernel for groups not a multiple of 16.
struct Int8Fill {
  Int8DequantArgs a;  // out unused
  size_t ssz;
};

void int8_fill(const void* ctx, int64_t r0, int64_t r1, uint16_t* rows) {
  const Int8Fill& f = *static_cast<const Int8Fill*>(ctx);
  if (f.a.group_size % 16 == 0) {  // the AMX TU's rows, hardware bf16 rounding
    const int64_t ng = f.a.ngroups;
    int8_rows_bf16_amx(f.a.qweight + r0 * f.a.K,
                       static_cast<const char*>(f.a.scales) + r0 * ng * f.ssz,
                       f.a.mins ? static_cast<const char*>(f.a.mins) + r0 * ng * f.ssz : nullptr,
                       f.a.half, f.a.K, f.a.group_size, r1 - r0, rows);
    return;
  }
  Int8DequantArgs a = f.a;
  a.qweight += r0 * a.K;
  a.scales = static_cast<const char*>(a.scales) + r0 * a.ngroups * f.ssz;
  if (a.mins) a.mins = static_cast<const char*>(a.mins) + r0 * a.ngroups * f.ssz;
  a.out = rows;
  a.bf16 = true;
  int8_dequant_rows_avx512(a, 0, r1 - r0);
}

// x [M, K] bf16 @ the int8 weight's dequantized (bf16) rows .T -> [M, N] bf16 through the
// AMX strip GEMM (strip_gemm.h; AMX CPUs only). Weight arguments as int8_dequantize's.
at::Tensor int8_dequant_mm(const at::Tensor& x, const at::Tensor& qweight,
                           const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                           int64_t group_size) {
  const Int8DequantArgs w =
      check_int8_weight("int8_dequant_mm", qweight, scales, mins, group_size);
  const Int8Fill f{w, static_cast<size_t>(w.half ? 2 : 4)};
  const int64_t N = qweight.size(0);
  return strip_gemm("int8_dequant_mm", x, N, w.K, int8_fill, &f);
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int8_dequantize(Tensor qweight, Tensor scales, Tensor? mins, int group_size, "
        "Tensor(a!) out, int isa) -> ()");
  m.def("int8_dequant_mm(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int group_size) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int8_dequantize", &localchat_cpu::int8_dequantize);
  m.impl("int8_dequant_mm", &localchat_cpu::int8_dequant_mm);
}
