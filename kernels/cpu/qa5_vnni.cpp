// AVX-512 VNNI integer-dot matmul of the int5 layout (qa5.h): plane_vnni.h over qa5_row.h
// (the qhigh bits as byte masks, offset 16, Q5_0's d per 32-column block). Design after
// llama.cpp's Q5_0 x Q8_0 dot product (high bits as a byte mask; the offset as a subtracted
// activation sum here); own code.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qa5.h"

namespace localchat_cpu {
namespace {

#include "avx512_common.h"  // reduce4

#include "qa5_row.h"
#include "plane_vnni.h"

}  // namespace

void int5_a8_vnni(const Int5Args& a, int64_t n0, int64_t n1) { plane_a8_vnni<Row>(a, n0, n1); }

}  // namespace localchat_cpu
