// The bit-plane layouts' rows (int5: qa5.h, int6: qa6.h) as bf16 for the AMX prefill GEMM
// (amx.h, plane_amx.h), compiled for AVX-512 with BF16 conversions; called only where
// amx_bf16_ready() (so the CPU has both). Each layout's Row and the plane templates sit in a
// namespace of their own inside the anonymous one (internal linkage, as in qa5_avx512.cpp /
// qa6_avx512.cpp, which include the same headers for their own ISA).
#include <cstdint>

#include "amx.h"
#include "qa5.h"
#include "qa6.h"

#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 11)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

namespace localchat_cpu {
namespace {

#include "avx512_common.h"

namespace int5_planes {
#include "qa5_row.h"
#include "plane_avx512.h"
#include "plane_amx.h"
}  // namespace int5_planes

namespace int6_planes {
#include "qa6_row.h"
#include "plane_avx512.h"
#include "plane_amx.h"
}  // namespace int6_planes

}  // namespace

void int5_rows_bf16_amx(const Int5Args& a, int64_t r0, int64_t r1, uint16_t* rows) {
  int5_planes::plane_rows_bf16_hw<int5_planes::Row>(a, r0, r1, rows);
}

void int6_rows_bf16_amx(const Int6Args& a, int64_t r0, int64_t r1, uint16_t* rows) {
  int6_planes::plane_rows_bf16_hw<int6_planes::Row>(a, r0, r1, rows);
}

}  // namespace localchat_cpu

#else  // no AVX512-BF16 intrinsics in this compiler: never called (amx_bf16_built() is false)

namespace localchat_cpu {
void int5_rows_bf16_amx(const Int5Args&, int64_t, int64_t, uint16_t*) {}
void int6_rows_bf16_amx(const Int6Args&, int64_t, int64_t, uint16_t*) {}
}  // namespace localchat_cpu

#endif
