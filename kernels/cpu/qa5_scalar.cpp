// Portable scalar kernels of the int5 layout (qa5.h): plane_scalar.h with groups of 32
// columns and offset 16.
#include <vector>

#include "qa5.h"

namespace localchat_cpu {
namespace {

struct Scalar {
  typedef Int5Args Args;
  static constexpr int64_t kGroup = 32;
  static constexpr int kOffset = 16;
  static int u(const Args& a, int64_t n, int64_t k) { return int5_u(a, n, k); }
  static float scale(const Args& a, int64_t n, int64_t g) { return int5_scale(a, n, g); }
  static void store(const Args& a, int64_t m, int64_t n, float v) { int5_store(a, m, n, v); }
  static uint16_t bf16_bits(float v) { return int5_bf16_bits(v); }
};

#include "plane_scalar.h"

}  // namespace

void int5_a8_scalar(const Int5Args& a, int64_t n0, int64_t n1) {
  plane_a8_scalar<Scalar>(a, n0, n1);
}

void int5_f32_scalar(const Int5Args& a, int64_t n0, int64_t n1) {
  plane_f32_scalar<Scalar>(a, n0, n1);
}

void int5_dequant_rows_scalar(const Int5Args& a, void* out, bool bf16, int64_t r0, int64_t r1) {
  plane_dequant_scalar<Scalar>(a, out, bf16, r0, r1);
}

}  // namespace localchat_cpu
