// What the panel layouts' conversions share (panel_repack.cpp: int4, int6, int8;
// panel5_repack.cpp: int5): the launchers' pair check, the interleaving of per-output columns
// into 16-output tiles and back, the int4 panel's nibble order (panel4.h) one tile at a time,
// and panel_rows, the way back to float rows for a prompt's GEMM. Included inside the
// anonymous namespace of such a TU (after ATen, ATen/Parallel.h, <cstring>, <vector> and
// panel4.h's kPanelRows).
#pragma once

inline void check_pair(const char* op, const char* what, const at::Tensor& row,
                       const at::Tensor& panel, at::ScalarType dt, int64_t numel) {
  TORCH_CHECK(row.scalar_type() == dt && panel.scalar_type() == dt && row.is_contiguous() &&
                  panel.is_contiguous() && row.numel() == numel && panel.numel() == numel,
              op, ": ", what, " must be contiguous ", dt, " tensors of ", numel,
              " elements, got ", row.sizes(), " and ", panel.sizes());
}

// [N, C] elements of `es` bytes (row layout, C per output) -> [N/16, C, 16] (panel), tile t.
inline void interleave(const uint8_t* src, uint8_t* dst, int64_t t, int64_t C, int es) {
  for (int j = 0; j < 16; ++j)
    for (int64_t c = 0; c < C; ++c)
      std::memcpy(dst + ((t * C + c) * 16 + j) * es, src + ((t * 16 + j) * C + c) * es, es);
}

// The inverse for one tile: panel tile t of [N/16, C, 16] -> its 16 rows [16, C] at dst.
inline void deinterleave(const uint8_t* src, uint8_t* dst, int64_t t, int64_t C, int es) {
  for (int j = 0; j < 16; ++j)
    for (int64_t c = 0; c < C; ++c)
      std::memcpy(dst + (j * C + c) * es, src + ((t * C + c) * 16 + j) * es, es);
}

// Row-layout nibbles q uint8 [N, K/2] (byte i: columns 2 i low, 2 i + 1 high) -> tile t of
// the panel's [N/16, K/8, 64] (byte 4 j + b of octet o: columns 8 o + b low, 8 o + 4 + b
// high of output 16 t + j).
inline void nibbles_to_panel_tile(const uint8_t* q, uint8_t* qp, int64_t t, int64_t K) {
  const int64_t oct = K / 8;
  for (int j = 0; j < 16; ++j) {
    const int64_t n = t * 16 + j;
    for (int64_t o = 0; o < oct; ++o) {
      // row bytes 4o..4o+3 hold (w0, w1), (w2, w3), (w4, w5), (w6, w7) of the octet
      const uint8_t* b = q + n * (K / 2) + 4 * o;
      uint8_t* p = qp + (t * oct + o) * 64 + 4 * j;
      p[0] = static_cast<uint8_t>((b[0] & 0x0F) | ((b[2] & 0x0F) << 4));
      p[1] = static_cast<uint8_t>((b[0] >> 4) | (b[2] & 0xF0));
      p[2] = static_cast<uint8_t>((b[1] & 0x0F) | ((b[3] & 0x0F) << 4));
      p[3] = static_cast<uint8_t>((b[1] >> 4) | (b[3] & 0xF0));
    }
  }
}

// The inverse for tile t: its 16 rows of nibbles, [16, K/2] at q.
inline void nibbles_from_panel_tile(const uint8_t* qp, uint8_t* q, int64_t t, int64_t K) {
  const int64_t oct = K / 8;
  for (int64_t o = 0; o < oct; ++o) {
    // panel bytes (p0, p1, p2, p3) -> row bytes (p0.lo | p1.lo << 4, p2.lo | p3.lo << 4,
    // p0.hi | p1.hi << 4, p2.hi | p3.hi << 4), a lane (4 bytes, one output) at a time; the
    // 16 lanes in one loop the compiler vectorizes, then one 4-byte store per output row
    uint32_t lanes[16];
    std::memcpy(lanes, qp + (t * oct + o) * 64, 64);
    for (int j = 0; j < 16; ++j) {
      const uint32_t lo = lanes[j] & 0x0F0F0F0Fu, hi = (lanes[j] >> 4) & 0x0F0F0F0Fu;
      const uint32_t x = lo | (lo >> 4), y = hi | (hi >> 4);  // bytes 0 and 2 hold pairs
      lanes[j] = (x & 0xFFu) | ((x >> 8) & 0xFF00u) | ((y & 0xFFu) << 16) |
                 ((y << 8) & 0xFF000000u);
    }
    for (int j = 0; j < 16; ++j) std::memcpy(q + j * (K / 2) + 4 * o, &lanes[j], 4);
  }
}

// The way back, for a prompt's GEMM: rows [row0, row0 + R) of a panel weight of N rows and K
// columns into out [R, K] fp32 or bf16 (row0 and R multiples of 16), each tile turned back
// into its 16 rows (`unpermute(t, q, s, m)` fills per-thread row buffers) and dequantized by
// the row layout's kernels (`dequantize(q, s, m, rows_out, bf16)`), so a prompt's bf16 GEMM
// over a panel weight multiplies the very numbers it would over the row layout.
template <class Unpermute, class Dequantize>
void panel_rows(const char* op, int64_t N, int64_t K, size_t qbytes, int64_t row0,
                at::Tensor& out, const Unpermute& unpermute, const Dequantize& dequantize) {
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(1) == K && out.is_contiguous(),
              op, ": out must be contiguous fp32 or bf16 [R, ", K, "]");
  const int64_t R = out.size(0), ng = K / 32;
  TORCH_CHECK(row0 >= 0 && row0 % kPanelRows == 0 && R % kPanelRows == 0 && row0 + R <= N,
              op, ": rows [", row0, ", ", row0 + R, ") of ", N, " must be whole 16-row tiles");
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  const size_t osz = bf16 ? 2 : 4;
  at::parallel_for(row0 / kPanelRows, (row0 + R) / kPanelRows, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> q(kPanelRows * qbytes);
    std::vector<uint16_t> s(kPanelRows * ng), m(kPanelRows * ng);
    for (int64_t t = t0; t < t1; ++t) {
      unpermute(t, q.data(), s.data(), m.data());
      dequantize(q.data(), s.data(), m.data(),
                 static_cast<char*>(out.data_ptr()) + (t * kPanelRows - row0) * K * osz, bf16);
    }
  });
}
