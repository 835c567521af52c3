// Portable build of the float-weight matmul (fmm.h, fmm_tiles.h) for any CPU, compiled for the
// baseline target with FMA contraction off (a * b + c rounded twice, the same everywhere):
// 8-lane "vectors" of plain floats (the compiler may map them onto SSE), fp16 weights widened
// through c10::Half (exact).
#pragma GCC optimize("fp-contract=off")
#include <c10/util/Half.h>

#include "fmm.h"

namespace localchat_cpu {
namespace {

constexpr int W = 8;
struct VF {
  float v[W];
};
constexpr int kMaxRows = 8;
constexpr int nt_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

inline VF vzero() {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = 0.f;
  return r;
}
inline VF vload(const float* p) {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = p[j];
  return r;
}
inline VF vfma(const VF& a, const VF& b, const VF& c) {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = a.v[j] * b.v[j] + c.v[j];
  return r;
}
inline float vsum(const VF& v) {
  float h[4];
  for (int j = 0; j < 4; ++j) h[j] = v.v[j] + v.v[j + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

template <int WT>
inline float wone(const void* w, int64_t i) {
  if constexpr (WT == kFmmBF16) {
    const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  } else if constexpr (WT == kFmmF16) {
    return static_cast<float>(
        c10::Half(static_cast<const uint16_t*>(w)[i], c10::Half::from_bits()));
  } else {
    return static_cast<const float*>(w)[i];
  }
}

template <int WT>
inline VF wload(const void* w, int64_t i) {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = wone<WT>(w, i + j);
  return r;
}

inline VF vset1(float f) {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = f;
  return r;
}
inline void vstore(float* p, const VF& v) {
  for (int j = 0; j < W; ++j) p[j] = v.v[j];
}
inline VF vadd(const VF& a, const VF& b) {
  VF r;
  for (int j = 0; j < W; ++j) r.v[j] = a.v[j] + b.v[j];
  return r;
}
inline float sfma(float a, float b, float c) { return a * b + c; }
constexpr int ntt_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

inline void wsplit(const uint16_t* p, VF& even, VF& odd) {
  for (int j = 0; j < W; ++j) {
    even.v[j] = wone<kFmmBF16>(p, 2 * j);
    odd.v[j] = wone<kFmmBF16>(p, 2 * j + 1);
  }
}
constexpr int nt_pair_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

#include "fmm_tiles.h"

}  // namespace

void fmm_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1) { fmm_all(a, n0, n1); }
void fmmt_cols_scalar(const FmmArgs& a, int64_t n0, int64_t n1) { fmmt_all(a, n0, n1); }

}  // namespace localchat_cpu
