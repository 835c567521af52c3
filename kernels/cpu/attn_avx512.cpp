// AVX-512 build of the attention / norm / rope / SiLU kernels (attn_kernels.h), compiled for
// that ISA by the pragma below; no torch headers, and everything but the entry point has
// internal linkage, so no AVX-512 code can leak into a shared inline function.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "attn.h"

namespace localchat_cpu {
namespace {
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#include "attn_kernels.h"
}  // namespace

const AttnKernels& attn_kernels_avx512() { return kKernels; }

}  // namespace localchat_cpu
