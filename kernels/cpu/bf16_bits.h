// bf16 <-> fp32 by bit manipulation (round to nearest even, NaN kept quiet), included INSIDE
// the anonymous namespace of each attention TU (attn_{scalar,avx2,avx512}.cpp) before its
// vector helpers, so every TU has its own internal-linkage copy for its ISA.
inline float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f2bf(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
