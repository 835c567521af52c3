// AVX-512 (F/BW/VL/DQ) kernels of the int6 layout (qa6.h) that need no VNNI (the row
// dequantization, the exact fp32-activation matmul): plane_avx512.h over qa6_row.h.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa6.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // to_bf16

#include "qa6_row.h"
#include "plane_avx512.h"

}  // namespace

void int6_dequant_rows_avx512(const Int6Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  plane_dequant_avx512<Row>(a, out, bf16, r0, r1);
}

void int6_f32_avx512(const Int6Args& a, int64_t n0, int64_t n1) {
  plane_f32_avx512<Row>(a, n0, n1);
}

}  // namespace localchat_cpu
