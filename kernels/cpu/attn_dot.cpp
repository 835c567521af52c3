// The decode attention for bf16 query and KV cache on CPUs with AVX512_BF16: attn_kernels.h's
// decode tasks with their scores from vdpbf16ps (scores_dot: the K rows are dotted in place in
// bf16, two exact products per fp32 lane per instruction, instead of being widened to fp32 and
// multiplied with FMAs); the softmax and the weighted sum of V are the AVX-512 TU's. Compiled
// for that ISA by the pragma below; no torch headers. attn_ops.cpp takes it at the avx512
// level where the CPU has the instruction (the op's bf16_dot argument, true by default).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "attn.h"

#define ATTN_DOT 1

namespace localchat_cpu {
namespace {
#include "bf16_bits.h"
#include "attn_avx512_vec.h"
// lane j: acc + a[2j+1] * b[2j+1] + a[2j] * b[2j] (odd first), each add rounded once
inline __m512 vdot_bf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
}
#include "attn_kernels.h"
}  // namespace

void attn_decode_dot(const DecodeArgs& a, int64_t task0, int64_t task1) {
  kKernels.decode(a, task0, task1);
}

}  // namespace localchat_cpu
