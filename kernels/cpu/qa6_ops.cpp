// Checking launchers, the GGUF Q6_K repack and the torch.library registration of the int6
// layout's CPU kernels (qa6.h; kernels in qa6_{scalar,avx2,avx512,vnni}.cpp). The activation
// quantizer of int6_matmul_a8 is qa8's (a8_quantize_*, int4 layout), unchanged. The ISA is an
// argument (0 scalar, 1 AVX2, 2 AVX-512), clamped to what the CPU has; at level 2 the
// integer-dot matmul needs VNNI and takes the AVX2 path without it (as int4_matmul_a8 does).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "isa.h"
#include "repack_rows.h"
#include "qa6.h"
#include "qa8.h"
#include "strip_gemm.h"

namespace localchat_cpu {
namespace {

#include "plane_ops.h"

// Checks the weight tensors against K; returns N.
int64_t check_int6(const char* op, const at::Tensor& qlow, const at::Tensor& qhigh,
                   const at::Tensor& scales, const at::Tensor& super_scales, int64_t K) {
  const int64_t N = check_planes(op, qlow, qhigh, K, 256, 4);
  TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kChar && scales.is_contiguous() &&
                  scales.size(0) == N && scales.size(1) * 16 == K,
              op, ": scales must be contiguous int8 [", N, ", ", K / 16, "], got ",
              scales.sizes(), " ", scales.scalar_type());
  TORCH_CHECK(super_scales.dim() == 2 && super_scales.scalar_type() == at::kHalf &&
                  super_scales.is_contiguous() && super_scales.size(0) == N &&
                  super_scales.size(1) * 256 == K,
              op, ": super_scales must be contiguous fp16 [", N, ", ", K / 256, "], got ",
              super_scales.sizes(), " ", super_scales.scalar_type());
  return N;
}

Int6Args weight_args(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     const at::Tensor& super_scales, int64_t N, int64_t K) {
  Int6Args a{};
  a.qlow = qlow.data_ptr<uint8_t>();
  a.qhigh = qhigh.data_ptr<uint8_t>();
  a.scales = scales.data_ptr<int8_t>();
  a.ssc = reinterpret_cast<const uint16_t*>(super_scales.data_ptr<at::Half>());
  a.N = N;
  a.K = K;
  return a;
}

at::Tensor int6_matmul_a8(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                          const at::Tensor& scales, const at::Tensor& super_scales, int64_t isa) {
  check_plane_x("int6_matmul_a8", x);
  const int64_t K = x.size(1);
  const int64_t N = check_int6("int6_matmul_a8", qlow, qhigh, scales, super_scales, K);
  return plane_matmul_a8(x, weight_args(qlow, qhigh, scales, super_scales, N, K), 32, isa,
                         int6_a8_vnni, int6_a8_avx2, int6_a8_scalar);
}

at::Tensor int6_matmul(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                       const at::Tensor& scales, const at::Tensor& super_scales, int64_t isa) {
  check_plane_x("int6_matmul", x);
  const int64_t K = x.size(1);
  const int64_t N = check_int6("int6_matmul", qlow, qhigh, scales, super_scales, K);
  return plane_matmul_f32(x, weight_args(qlow, qhigh, scales, super_scales, N, K), isa,
                          int6_f32_avx512, int6_f32_avx2, int6_f32_scalar);
}

void int6_dequantize(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     const at::Tensor& super_scales, at::Tensor out, int64_t isa) {
  TORCH_CHECK(qlow.dim() == 2, "int6_dequantize: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int6("int6_dequantize", qlow, qhigh, scales, super_scales, K);
  plane_dequantize("int6_dequantize", weight_args(qlow, qhigh, scales, super_scales, N, K),
                   out, isa, int6_dequant_rows_avx512, int6_dequant_rows_avx2,
                   int6_dequant_rows_scalar);
}

// x [M, K] bf16 @ the int6 weight dequantized to bf16 .T -> [M, N] bf16, through the AMX
// strip GEMM (strip_gemm.h; AMX CPUs only). Weight arguments as int6_dequantize's.
at::Tensor int6_dequant_mm(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                           const at::Tensor& scales, const at::Tensor& super_scales) {
  TORCH_CHECK(qlow.dim() == 2, "int6_dequant_mm: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int6("int6_dequant_mm", qlow, qhigh, scales, super_scales, K);
  const auto a = weight_args(qlow, qhigh, scales, super_scales, N, K);
  return plane_dequant_mm("int6_dequant_mm", x, a, int6_rows_bf16_amx);
}


// One Q6_K block (210 bytes: ql[128], qh[64], sc[16] int8, d fp16) -> two chunks of the int6
// layout: qlow 128 bytes, qhigh 64 bytes, scales 16, super scale 1. Block element
// 128 h + 32 r + l (h = 0, 1; r = 0..3; l = 0..31) has low bits (ql[64 h + 32 (r & 1) + l] >>
// 4 (r >> 1)) & 15 and high bits (qh[32 h + l] >> 2 r) & 3 (ggml's dequantize_row_q6_K).
inline void repack_q6_block(const uint8_t* __restrict b, uint8_t* __restrict lo,
                            uint8_t* __restrict hi, int8_t* __restrict sc,
                            uint16_t* __restrict d) {
  for (int h = 0; h < 2; ++h) {
    uint8_t u[128];
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      u[l] = static_cast<uint8_t>((ql[l] & 0x0F) | ((qh[l] & 3) << 4));
      u[32 + l] = static_cast<uint8_t>((ql[32 + l] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
      u[64 + l] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      u[96 + l] = static_cast<uint8_t>((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
    for (int i = 0; i < 64; ++i)
      lo[64 * h + i] = static_cast<uint8_t>((u[2 * i] & 0x0F) | ((u[2 * i + 1] & 0x0F) << 4));
    for (int j = 0; j < 32; ++j)
      hi[32 * h + j] = static_cast<uint8_t>((u[2 * j] >> 4) | ((u[2 * j + 64] >> 4) << 2) |
                                            ((u[2 * j + 1] >> 4) << 4) |
                                            ((u[2 * j + 65] >> 4) << 6));
  }
  std::memcpy(sc, b + 192, 16);
  std::memcpy(d, b + 208, 2);
}

// raw (contiguous 1-D uint8: S source rows of K / 256 Q6_K blocks) -> the int6 tensors (N
// rows, written in place); rows (int64 [N], optional): output row r takes source row rows[r]
// (without it S == N). Pure byte shuffling, portable code; rows split over threads.
void gguf_repack_q6(const at::Tensor& raw, at::Tensor qlow, at::Tensor qhigh, at::Tensor scales,
                    at::Tensor super_scales, const c10::optional<at::Tensor>& rows) {
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 1 && raw.is_contiguous(),
              "gguf_repack_q6: raw must be contiguous 1-D uint8, got ", raw.sizes(), " ",
              raw.scalar_type());
  TORCH_CHECK(qlow.dim() == 2, "gguf_repack_q6: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int6("gguf_repack_q6", qlow, qhigh, scales, super_scales, K);
  const int64_t nblk = K / 256, row_bytes = nblk * 210;
  TORCH_CHECK(raw.numel() % row_bytes == 0, "gguf_repack_q6: ", raw.numel(),
              " bytes are not whole rows of ", row_bytes);
  const int64_t S = raw.numel() / row_bytes;
  at::Tensor rows_c;
  const int64_t* rp = checked_source_rows("gguf_repack_q6", rows, N, S, raw.numel(), rows_c);

  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* lo = qlow.data_ptr<uint8_t>();
  uint8_t* hi = qhigh.data_ptr<uint8_t>();
  int8_t* sc = scales.data_ptr<int8_t>();
  uint16_t* d = reinterpret_cast<uint16_t*>(super_scales.data_ptr<at::Half>());
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / row_bytes);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* s = src + (rp ? rp[r] : r) * row_bytes;
      for (int64_t j = 0; j < nblk; ++j)
        repack_q6_block(s + 210 * j, lo + r * (K / 2) + 128 * j, hi + r * (K / 4) + 64 * j,
                        sc + r * (K / 16) + 16 * j, d + r * nblk + j);
    }
  });
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("int6_matmul_a8(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales, "
        "Tensor super_scales, int isa) -> Tensor");
  m.def("int6_matmul(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales, "
        "Tensor super_scales, int isa) -> Tensor");
  m.def("int6_dequantize(Tensor qlow, Tensor qhigh, Tensor scales, Tensor super_scales, "
        "Tensor(a!) out, int isa) -> ()");
  m.def("int6_dequant_mm(Tensor x, Tensor qlow, Tensor qhigh, Tensor scales, "
        "Tensor super_scales) -> Tensor");
  m.def("gguf_repack_q6(Tensor raw, Tensor(a!) qlow, Tensor(b!) qhigh, Tensor(c!) scales, "
        "Tensor(d!) super_scales, Tensor? rows) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int6_matmul_a8", &localchat_cpu::int6_matmul_a8);
  m.impl("int6_matmul", &localchat_cpu::int6_matmul);
  m.impl("int6_dequantize", &localchat_cpu::int6_dequantize);
  m.impl("int6_dequant_mm", &localchat_cpu::int6_dequant_mm);
  m.impl("gguf_repack_q6", &localchat_cpu::gguf_repack_q6);
}
