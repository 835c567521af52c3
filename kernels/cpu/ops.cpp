// Checking launchers and torch.library registration of localchat's CPU kernels
// (namespace ``localchat_cpu``). The ISA is an argument (0 scalar, 1 AVX2, 2 AVX-512); the
// Python side (localchat.kernels.cpu) resolves it from the CPU's flags and
// LOCALCHAT_CPU_ISA, clamped here to what the CPU supports.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "quant.h"

namespace localchat_cpu {
namespace {

int64_t best_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma"))
    return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#endif
  return kScalar;
}

int64_t clamp_isa(int64_t isa) {
  static const int64_t best = best_isa();
  return std::max<int64_t>(kScalar, std::min(isa, best));
}

typedef void (*RowsFn)(const QuantArgs&, int64_t, int64_t);

at::Tensor run_rows(const at::Tensor& x32, const at::Tensor& out_like, QuantArgs args,
                    RowsFn fn) {
  at::Tensor out = at::empty({args.M, args.N}, x32.options());
  args.out = out.data_ptr<float>();
  // Split output columns in blocks of 4 (the widest tile); each output element is computed
  // by one thread in a fixed order, so the thread count does not change the result.
  const int64_t blocks = (args.N + 3) / 4;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, 4 * args.K));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    fn(args, b0 * 4, std::min(b1 * 4, args.N));
  });
  return out_like.scalar_type() == at::kFloat ? out : out.to(out_like.scalar_type());
}

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int4_matmul: x [M, K] and qweight [N, K/2]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) * 2 == K,
              "int4_matmul: qweight must be uint8 [N, K/2], got ", qweight.sizes(), " for K=", K);
  TORCH_CHECK(group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_matmul: group_size ", group_size, " must be a multiple of 32 dividing K=", K);
  const int64_t ng = K / group_size;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && mins.scalar_type() == at::kFloat &&
                  scales.sizes() == at::IntArrayRef({N, ng}) && mins.sizes() == scales.sizes(),
              "int4_matmul: scales and mins must be fp32 [", N, ", ", ng, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_matmul: x must be fp32/bf16/fp16");
  // Permute each 32-column block of x to (16 even k, 16 odd k): the low / high nibbles of a
  // block's 16 bytes then meet contiguous activations.
  at::Tensor xp = x.to(at::kFloat).reshape({M, K / 32, 16, 2}).transpose(2, 3).contiguous();
  at::Tensor q = qweight.contiguous(), s = scales.contiguous(), m = mins.contiguous();
  QuantArgs a{xp.data_ptr<float>(), q.data_ptr(), s.data_ptr<float>(), m.data_ptr<float>(),
              nullptr, M, N, K, group_size, ng};
  const int64_t use = clamp_isa(isa);
  RowsFn fn = use == kAvx512 ? int4_rows_avx512 : use == kAvx2 ? int4_rows_avx2
                                                               : int4_rows_scalar;
  return run_rows(xp, x, a, fn);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int8_matmul: x [M, K] and qweight [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.size(1) == K,
              "int8_matmul: qweight must be int8 [N, K], got ", qweight.sizes(), " for K=", K);
  TORCH_CHECK(group_size > 0 && K % group_size == 0,
              "int8_matmul: group_size ", group_size, " must divide K=", K);
  const int64_t ng = K / group_size;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N * ng,
              "int8_matmul: scales must be fp32 [", N, ", ", ng, "]");
  const bool has_min = mins.has_value() && mins->defined();
  TORCH_CHECK(!has_min || (mins->scalar_type() == at::kFloat && mins->numel() == N * ng),
              "int8_matmul: mins must be fp32 [", N, ", ", ng, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int8_matmul: x must be fp32/bf16/fp16");
  at::Tensor x32 = x.to(at::kFloat).contiguous();
  at::Tensor q = qweight.contiguous(), s = scales.contiguous();
  at::Tensor m = has_min ? mins->contiguous() : at::Tensor();
  QuantArgs a{x32.data_ptr<float>(), q.data_ptr(), s.data_ptr<float>(),
              has_min ? m.data_ptr<float>() : nullptr, nullptr, M, N, K, group_size, ng};
  const int64_t use = clamp_isa(isa);
  RowsFn fn = use == kAvx512 ? int8_rows_avx512 : use == kAvx2 ? int8_rows_avx2
                                                               : int8_rows_scalar;
  return run_rows(x32, x, a, fn);
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY(localchat_cpu, m) {
  m.def("best_isa() -> int", &localchat_cpu::best_isa);
  m.def("int4_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "int isa) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int group_size, "
        "int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_matmul", &localchat_cpu::int4_matmul);
  m.impl("int8_matmul", &localchat_cpu::int8_matmul);
}
