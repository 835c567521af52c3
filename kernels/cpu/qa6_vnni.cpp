// AVX-512 VNNI integer-dot matmul of the int6 layout (qa6.h): plane_vnni.h over qa6_row.h
// (two qhigh bits beside each nibble, offset 32, d * sc per 16-column sub-block). Design after
// llama.cpp's Q6_K x Q8_K dot product (the -32 offset as a subtracted activation sum); own
// code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "qa6.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // reduce4

#include "qa6_row.h"
#include "plane_vnni.h"

}  // namespace

void int6_a8_vnni(const Int6Args& a, int64_t n0, int64_t n1) { plane_a8_vnni<Row>(a, n0, n1); }

}  // namespace localchat_cpu
