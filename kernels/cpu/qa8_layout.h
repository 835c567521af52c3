// Layout helpers of the integer-dot activation buffers (qa8.h), shared by every ISA's
// quantizer: where a block's integers and scale go, the padding, the per-row sums.
#pragma once
#include <cstring>

#include "qa8.h"

namespace localchat_cpu {

// Zero the padding and the accumulated sums (xs) before the blocks are written.
inline void a8_zero_fill(const A8Args& a, const A8Buffers& b, bool int4) {
  const int64_t M = a.M, Kp = a.Kp, K = a.K;
  if (Kp > K)
    for (int64_t m = 0; m < M; ++m) std::memset(b.xq + m * Kp + (int4 ? 0 : K), 0,
                                                int4 ? Kp : Kp - K);
  if (Kp > K) {
    std::memset(b.d, 0, sizeof(float) * M * (Kp / 32));
    std::memset(b.dv, 0, sizeof(float) * M * (Kp / 32) * (int4 ? 4 : 8));
  }
  if (b.xs) std::memset(b.xs, 0, sizeof(float) * M * a.ngroups);
}

// Byte offset, within row m's 128-column chunk, of column j (0..31) of block bl: int4's
// even / odd split (qa8.h), int8's natural order.
inline int64_t a8_pos(bool int4, int64_t bl, int j) {
  if (!int4) return bl * 32 + j;
  return (bl / 4) * 128 + (j % 2) * 64 + (bl % 4) * 16 + j / 2;
}

inline void a8_put_scale(const A8Args& a, const A8Buffers& b, bool int4, int64_t m, int64_t bl,
                         float db) {
  b.d[m * (a.Kp / 32) + bl] = db;
  if (int4) {
    float* p = b.dv + (m * (a.Kp / 32) + bl) * 4;
    for (int i = 0; i < 4; ++i) p[i] = db;
  } else {
    float* p = b.dv + (m * (a.Kp / 64) + bl / 2) * 16 + (bl % 2) * 8;
    for (int i = 0; i < 8; ++i) p[i] = db;
  }
}

// xs[m, g] += d * (sum of the block's integers), per 16 columns when G == 16.
inline void a8_add_xs(const A8Args& a, const A8Buffers& b, int64_t m, int64_t bl, float db,
                      int32_t s0, int32_t s1) {
  float* xs = b.xs + m * a.ngroups;
  if (a.group_size == 16) {
    xs[2 * bl] = db * static_cast<float>(s0);
    xs[2 * bl + 1] = db * static_cast<float>(s1);
  } else {
    xs[bl * 32 / a.group_size] += db * static_cast<float>(s0 + s1);
  }
}

// Store block bl of row m: its 32 integers (natural column order), its scale d (and the
// per-lane copies), its contribution to xs.
inline void a8_put_block(const A8Args& a, const A8Buffers& b, bool int4, int64_t m, int64_t bl,
                         const int8_t* q, float db) {
  int8_t* qr = b.xq + m * a.Kp;
  int32_t sum[2] = {0, 0};
  for (int j = 0; j < 32; ++j) {
    qr[a8_pos(int4, bl, j)] = q[j];
    sum[j / 16] += q[j];
  }
  a8_put_scale(a, b, int4, m, bl, db);
  if (b.xs) a8_add_xs(a, b, m, bl, db, sum[0], sum[1]);
}

// int8: ncorr[m, i] = -128 * (sum of the 4 integers at columns 4 i .. 4 i + 3).
inline void a8_row_sums(const A8Args& a, const A8Buffers& b, bool int4, int64_t m) {
  if (int4 || !b.ncorr) return;
  const int8_t* qr = b.xq + m * a.Kp;
  int32_t* nc = b.ncorr + m * (a.Kp / 4);
  for (int64_t j = 0; j < a.Kp / 4; ++j)
    nc[j] = -128 * (qr[4 * j] + qr[4 * j + 1] + qr[4 * j + 2] + qr[4 * j + 3]);
}

}  // namespace localchat_cpu
