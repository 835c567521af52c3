// IEEE fp16 bits -> fp32, exact, portable (no F16C): for the scalar kernels and the portable
// helpers of every ISA's translation unit (the vector paths use _cvtsh_ss / _mm*_cvtph_ps).
#pragma once
#include <cstdint>
#include <cstring>

namespace localchat_cpu {

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    uint32_t e = 113, m = man;
    while (!(m & 0x400)) {
      m <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace localchat_cpu
