// The row-count switch shared by the panel kernels' drivers (panel_vnni.h's pass_tiles,
// panel_avx2.h's tiles_avx2): a pass over rows [m0, m0 + mt) of tile t, run as the kernel's
// template for MT = mt rows. Included inside the anonymous namespace of a kernel TU (or of a
// header included there), after <type_traits>; no intrinsics, so each ISA's TU instantiates it
// for its own target.
#pragma once

// run(std::integral_constant<int, MT>{}, t, m0) for MT = mt (1 .. kMax; other counts do
// nothing: the drivers never pass them).
template <int kMax, class Pass>
inline void run_pass(const Pass& run, int64_t t, int64_t m0, int64_t mt) {
  switch (mt) {
#define LOCALCHAT_PASS_CASE(k)                                              \
  case k:                                                                   \
    if constexpr (k <= kMax) run(std::integral_constant<int, k>{}, t, m0); \
    break;
    LOCALCHAT_PASS_CASE(1) LOCALCHAT_PASS_CASE(2) LOCALCHAT_PASS_CASE(3) LOCALCHAT_PASS_CASE(4)
    LOCALCHAT_PASS_CASE(5) LOCALCHAT_PASS_CASE(6) LOCALCHAT_PASS_CASE(7) LOCALCHAT_PASS_CASE(8)
#undef LOCALCHAT_PASS_CASE
    default: break;
  }
}
