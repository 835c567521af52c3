// The int6 layout's rows as bf16 for the AMX prefill GEMM (amx.h, plane_amx.h), compiled for
// AVX-512 with BF16 conversions; called only where amx_bf16_ready() (so the CPU has both).
#include <cstdint>

#include "amx.h"
#include "qa6.h"

#if defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 11)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>

namespace localchat_cpu {
namespace {

#include "avx512_common.h"

#include "qa6_row.h"
#include "plane_avx512.h"
#include "plane_amx.h"

}  // namespace

void int6_rows_bf16_amx(const Int6Args& a, int64_t r0, int64_t r1, uint16_t* rows) {
  plane_rows_bf16_hw<Row>(a, r0, r1, rows);
}

}  // namespace localchat_cpu

#else  // no AVX512-BF16 intrinsics in this compiler: never called (amx_bf16_built() is false)

namespace localchat_cpu {
void int6_rows_bf16_amx(const Int6Args&, int64_t, int64_t, uint16_t*) {}
}  // namespace localchat_cpu

#endif
