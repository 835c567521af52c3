// Checking launcher of the AMX prefill GEMM (contract: amx.h, strip_gemm.h), compiled for the
// baseline ISA: the CPU and OS checks (AMX-BF16 for it, AMX-INT8 for qa8_amx.cpp's decode
// kernel), the activation packing, the thread split, and the `has_amx` / `has_amx_int8` ops.
// The tile kernel is amx_bf16.cpp.
#include "strip_gemm.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <memory>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "isa.h"
#include "qa8.h"

namespace localchat_cpu {
namespace {

// AMX-TILE and the unit `bit` of CPUID leaf 7 EDX (22 AMX-BF16, 25 AMX-INT8), granted.
bool detect_amx(unsigned bit) {
#if defined(__x86_64__)
  if (cpu_best_isa() < 2) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
  if (!(d & (1u << 24)) || !(d & (1u << bit))) return false;
  // Linux grants the tile data state (8 KiB of XSAVE area) only on request, per process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool has_amx() { return amx_bf16_ready(); }
bool has_amx_int8() { return amx_int8_ready(); }

}  // namespace

bool amx_bf16_ready() {
  // AVX512-BF16 too (the fills' vcvtne2ps2bf16)
  static const bool ready = amx_bf16_built() && cpu_has_avx512_bf16() && detect_amx(22);
  return ready;
}

bool amx_int8_ready() {
  static const bool ready = amx_int8_built() && cpu_has_vnni() && detect_amx(25);
  return ready;
}

at::Tensor strip_gemm(const char* op, const at::Tensor& x, int64_t N, int64_t K, RowFillFn fill,
                      const void* ctx) {
  TORCH_CHECK(amx_bf16_ready(), op, ": this CPU has no usable AMX bf16 tiles");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous() &&
                  x.size(1) == K,
              op, ": x must be contiguous bf16 [M, ", K, "], got ", x.sizes(), " ",
              x.scalar_type());
  TORCH_CHECK(K % 32 == 0 && K > 0, op, ": K=", K, " must be a positive multiple of 32");
  const int64_t M = x.size(0), mt = (M + 15) / 16, nks = K / 32;
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  // xp[((s * mt + t) * 16 + p) * 16 + i] = the bf16 pair (x[16 t + i, 32 s + 2 p], ... + 1)
  at::Tensor packed = at::zeros({nks * mt * 256}, x.options().dtype(at::kInt));
  uint32_t* xp = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t t = m / 16, i = m % 16;
      const uint32_t* row = xs + m * (K / 2);
      for (int64_t s = 0; s < nks; ++s)
        for (int64_t p = 0; p < 16; ++p) xp[((s * mt + t) * 16 + p) * 16 + i] = row[16 * s + p];
    }
  });
  const AmxGemmArgs a{xp, M, N, K, out.data_ptr(), true, fill, ctx};
  at::parallel_for(0, (N + 31) / 32, 1, [&](int64_t s0, int64_t s1) {
    // every row the kernel reads is filled first (a tail strip is zeroed), so no zeroing here
    std::unique_ptr<uint16_t[]> strip(new uint16_t[static_cast<size_t>(32 * K)]);
    amx_bf16_strips(a, s0, s1, strip.get());
  });
  return out;
}

}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("has_amx() -> bool", &localchat_cpu::has_amx);
  m.def("has_amx_int8() -> bool", &localchat_cpu::has_amx_int8);
}
