// The CPU's vector ISA level, detected once at run time (no torch headers; included by each
// checking launcher, ops.cpp / qa8_ops.cpp / attn_ops.cpp / dequant_ops.cpp / fmm_ops.cpp).
// Levels: 0 scalar, 1 AVX2 + FMA + F16C, 2 AVX-512 F/BW/VL/DQ + FMA + F16C. The launchers
// take the level as an argument (LOCALCHAT_CPU_ISA, resolved in localchat.kernels.cpu) and
// clamp it to what the CPU has.
#pragma once
#include <algorithm>
#include <cstdint>

namespace localchat_cpu {

inline int64_t cpu_best_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return 1;
#endif
  return 0;
}

// AVX-512 with VNNI (vpdpbusd), for the integer-dot kernels.
inline bool cpu_has_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_best_isa() == 2 && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// AVX-512 with the BF16 dot product (vdpbf16ps).
inline bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_best_isa() == 2 && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// A requested level, at most the CPU's (detected once per process).
inline int64_t cpu_clamp_isa(int64_t isa) {
  static const int64_t best = cpu_best_isa();
  return std::max<int64_t>(0, std::min(isa, best));
}

}  // namespace localchat_cpu
