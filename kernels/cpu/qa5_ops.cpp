// Checking launchers, the GGUF Q5_0 repack and the torch.library registration of the int5
// layout's CPU kernels (qa5.h; kernels in qa5_{scalar,avx2,avx512,vnni}.cpp). The activation
// quantizer of int5_matmul_a8 is qa8's (a8_quantize_*, int4 layout), unchanged. The ISA is an
// argument (0 scalar, 1 AVX2, 2 AVX-512), clamped to what the CPU has; at level 2 the
// integer-dot matmul needs VNNI and takes the AVX2 path without it (as int6_matmul_a8 does).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "isa.h"
#include "repack_rows.h"
#include "qa5.h"
#include "qa8.h"
#include "strip_gemm.h"

namespace localchat_cpu {
namespace {

#include "plane_ops.h"

// Checks the weight tensors against K; returns N.
int64_t check_int5(const char* op, const at::Tensor& qlow, const at::Tensor& qhigh,
                   const at::Tensor& scales, int64_t K) {
  const int64_t N = check_planes(op, qlow, qhigh, K, 128, 8);
  TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kHalf && scales.is_contiguous() &&
                  scales.size(0) == N && scales.size(1) * 32 == K,
              op, ": scales must be contiguous fp16 [", N, ", ", K / 32, "], got ",
              scales.sizes(), " ", scales.scalar_type());
  return N;
}

Int5Args weight_args(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     int64_t N, int64_t K) {
  Int5Args a{};
  a.qlow = qlow.data_ptr<uint8_t>();
  a.qhigh = qhigh.data_ptr<uint8_t>();
  a.sc = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  a.N = N;
  a.K = K;
  return a;
}

at::Tensor int5_matmul_a8(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                          const at::Tensor& scales, int64_t isa) {
  check_plane_x("int5_matmul_a8", x);
  const int64_t K = x.size(1);
  const int64_t N = check_int5("int5_matmul_a8", qlow, qhigh, scales, K);
  return plane_matmul_a8(x, weight_args(qlow, qhigh, scales, N, K), 16, isa,
                         int5_a8_vnni, int5_a8_avx2, int5_a8_scalar);
}

at::Tensor int5_matmul(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                       const at::Tensor& scales, int64_t isa) {
  check_plane_x("int5_matmul", x);
  const int64_t K = x.size(1);
  const int64_t N = check_int5("int5_matmul", qlow, qhigh, scales, K);
  return plane_matmul_f32(x, weight_args(qlow, qhigh, scales, N, K), isa,
                          int5_f32_avx512, int5_f32_avx2, int5_f32_scalar);
}

void int5_dequantize(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     at::Tensor out, int64_t isa) {
  TORCH_CHECK(qlow.dim() == 2, "int5_dequantize: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int5("int5_dequantize", qlow, qhigh, scales, K);
  plane_dequantize("int5_dequantize", weight_args(qlow, qhigh, scales, N, K), out, isa,
                   int5_dequant_rows_avx512, int5_dequant_rows_avx2,
                   int5_dequant_rows_scalar);
}

// x [M, K] bf16 @ the int5 weight dequantized to bf16 .T -> [M, N] bf16, through the AMX
// strip GEMM (strip_gemm.h; AMX CPUs only). Weight arguments as int5_dequantize's.
at::Tensor int5_dequant_mm(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                           const at::Tensor& scales) {
  TORCH_CHECK(qlow.dim() == 2, "int5_dequant_mm: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int5("int5_dequant_mm", qlow, qhigh, scales, K);
  const auto a = weight_args(qlow, qhigh, scales, N, K);
  return plane_dequant_mm("int5_dequant_mm", x, a, int5_rows_bf16_amx);
}


// Four Q5_0 blocks (22 bytes each: d fp16, qh uint32 LE, qs[16]) = one 128-column chunk ->
// qlow 64 bytes, qhigh 16 bytes, 4 scales. Block element e (0..31) has low bits qs[e & 15] >>
// 4 (e >> 4) and high bit (qh >> e) & 1 (ggml's dequantize_row_q5_0).
inline void repack_q5_chunk(const uint8_t* __restrict b, uint8_t* __restrict lo,
                            uint8_t* __restrict hi, uint16_t* __restrict d) {
  uint8_t u[128];
  for (int blk = 0; blk < 4; ++blk) {
    const uint8_t* s = b + 22 * blk;
    uint32_t qh;
    std::memcpy(&qh, s + 2, 4);
    std::memcpy(d + blk, s, 2);
    for (int j = 0; j < 16; ++j) {
      u[32 * blk + j] = static_cast<uint8_t>((s[6 + j] & 0x0F) | (((qh >> j) & 1) << 4));
      u[32 * blk + 16 + j] =
          static_cast<uint8_t>((s[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  }
  uint64_t me = 0, mo = 0;
  for (int i = 0; i < 64; ++i) {
    lo[i] = static_cast<uint8_t>((u[2 * i] & 0x0F) | ((u[2 * i + 1] & 0x0F) << 4));
    me |= static_cast<uint64_t>(u[2 * i] >> 4) << i;
    mo |= static_cast<uint64_t>(u[2 * i + 1] >> 4) << i;
  }
  for (int i = 0; i < 8; ++i) {  // little-endian bytes, whatever the host's order
    hi[i] = static_cast<uint8_t>(me >> (8 * i));
    hi[8 + i] = static_cast<uint8_t>(mo >> (8 * i));
  }
}

// raw (contiguous 1-D uint8: S source rows of K / 32 Q5_0 blocks) -> the int5 tensors (N rows,
// written in place); rows (int64 [N], optional): output row r takes source row rows[r]
// (without it S == N). Pure byte shuffling, portable code; rows split over threads.
void gguf_repack_q5(const at::Tensor& raw, at::Tensor qlow, at::Tensor qhigh, at::Tensor scales,
                    const c10::optional<at::Tensor>& rows) {
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 1 && raw.is_contiguous(),
              "gguf_repack_q5: raw must be contiguous 1-D uint8, got ", raw.sizes(), " ",
              raw.scalar_type());
  TORCH_CHECK(qlow.dim() == 2, "gguf_repack_q5: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int5("gguf_repack_q5", qlow, qhigh, scales, K);
  const int64_t nc = K / 128, row_bytes = (K / 32) * 22;
  TORCH_CHECK(raw.numel() % row_bytes == 0, "gguf_repack_q5: ", raw.numel(),
              " bytes are not whole rows of ", row_bytes);
  const int64_t S = raw.numel() / row_bytes;
  at::Tensor rows_c;
  const int64_t* rp = checked_source_rows("gguf_repack_q5", rows, N, S, raw.numel(), rows_c);

  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* lo = qlow.data_ptr<uint8_t>();
  uint8_t* hi = qhigh.data_ptr<uint8_t>();
  uint16_t* d = reinterpret_cast<uint16_t*>(scales.data_ptr<at::Half>());
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / row_bytes);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* s = src + (rp ? rp[r] : r) * row_bytes;
      for (int64_t c = 0; c < nc; ++c)
        repack_q5_chunk(s + 88 * c, lo + r * (K / 2) + 64 * c, hi + r * (K / 8) + 16 * c,
                        d + r * (K / 32) + 4 * c);
    }
  });
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int5_matmul_a8(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales, int isa) -> Tensor");
  m.def("int5_matmul(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales, int isa) -> Tensor");
  m.def("int5_dequantize(Tensor qlow, Tensor qhigh, Tensor scales, Tensor(a!) out, int isa) "
        "-> ()");
  m.def("int5_dequant_mm(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales) -> Tensor");
  m.def("gguf_repack_q5(Tensor raw, Tensor(a!) qlow, Tensor(b!) qhigh, Tensor(c!) scales, "
        "Tensor? rows) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int5_matmul_a8", &localchat_cpu::int5_matmul_a8);
  m.impl("int5_matmul", &localchat_cpu::int5_matmul);
  m.impl("int5_dequantize", &localchat_cpu::int5_dequantize);
  m.impl("int5_dequant_mm", &localchat_cpu::int5_dequant_mm);
  m.impl("gguf_repack_q5", &localchat_cpu::gguf_repack_q5);
}
