// Portable build of the attention / norm / rope / SiLU kernels (attn_kernels.h) for any CPU,
// compiled for the baseline target; fp16 conversions through c10::Half (IEEE round to
// nearest even).
#pragma GCC optimize("fp-contract=off")
#include <c10/util/Half.h>

#include "attn.h"

namespace localchat_cpu {
namespace {
inline float h2f(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }
inline uint16_t f2h(float f) { return c10::Half(f).x; }
#include "attn_kernels.h"
}  // namespace

const AttnKernels& attn_kernels_scalar() { return kKernels; }

}  // namespace localchat_cpu
