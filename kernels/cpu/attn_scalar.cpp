// Portable build of the attention / norm / rope / SiLU kernels (attn_kernels.h) for any CPU,
// compiled for the baseline target; fp16 conversions through c10::Half (IEEE round to
// nearest even).
#pragma GCC optimize("fp-contract=off")
#include <c10/util/Half.h>

#include "attn.h"

namespace localchat_cpu {
namespace {
#include "bf16_bits.h"
inline float h2f(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }
inline uint16_t f2h(float f) { return c10::Half(f).x; }
// One-lane "vectors" for the decode attention (attn_kernels.h).
typedef float V;
constexpr int W = 1;
inline V vzero() { return 0.f; }
inline V vset1(float f) { return f; }
inline V vld_f32(const float* p) { return *p; }
inline V vld_bf16(const uint16_t* p) { return bf2f(*p); }
inline V vld_f16(const uint16_t* p) { return h2f(*p); }
inline void vst(float* p, V v) { *p = v; }
inline V vadd(V a, V b) { return a + b; }
inline V vsub(V a, V b) { return a - b; }
inline V vmul(V a, V b) { return a * b; }
inline V vdiv(V a, V b) { return a / b; }
inline V vfma(V a, V b, V c) { return __builtin_fmaf(a, b, c); }
inline float vsum(V v) { return v; }
inline void vsum4(V a, V b, V c, V d, float* o) { o[0] = a; o[1] = b; o[2] = c; o[3] = d; }
inline V vexp(V x) { return __builtin_expf(x); }
inline V vround_bf16(V v) { return bf2f(f2bf(v)); }
inline void vst_bf16(uint16_t* p, V v) { *p = f2bf(v); }
inline V vround_f16(V v) { return h2f(f2h(v)); }
inline void vst_f16(uint16_t* p, V v) { *p = f2h(v); }
#include "attn_kernels.h"
}  // namespace

const AttnKernels& attn_kernels_scalar() { return kKernels; }

}  // namespace localchat_cpu
