// AVX-512 build of the attention / norm / rope / SiLU kernels (attn_kernels.h), compiled for
// that ISA by the pragma below; no torch headers, and everything but the entry point has
// internal linkage, so no AVX-512 code can leak into a shared inline function.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "attn.h"

namespace localchat_cpu {
namespace {
#include "bf16_bits.h"
#include "attn_avx512_vec.h"
#include "attn_kernels.h"
}  // namespace

const AttnKernels& attn_kernels_avx512() { return kKernels; }

}  // namespace localchat_cpu
