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

namespace localchat_cpu {
namespace {

typedef void (*Int6Fn)(const Int6Args&, int64_t, int64_t);

// Checks the four weight tensors against K; returns N.
int64_t check_int6(const char* op, const at::Tensor& qlow, const at::Tensor& qhigh,
                   const at::Tensor& scales, const at::Tensor& super_scales, int64_t K) {
  TORCH_CHECK(K > 0 && K % 256 == 0, op, ": K=", K, " must be a positive multiple of 256");
  TORCH_CHECK(qlow.dim() == 2 && qlow.scalar_type() == at::kByte && qlow.is_contiguous() &&
                  qlow.size(1) * 2 == K,
              op, ": qlow must be contiguous uint8 [N, ", K / 2, "], got ", qlow.sizes(), " ",
              qlow.scalar_type());
  const int64_t N = qlow.size(0);
  TORCH_CHECK(qhigh.dim() == 2 && qhigh.scalar_type() == at::kByte && qhigh.is_contiguous() &&
                  qhigh.size(0) == N && qhigh.size(1) * 4 == K,
              op, ": qhigh must be contiguous uint8 [", N, ", ", K / 4, "], got ", qhigh.sizes(),
              " ", qhigh.scalar_type());
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

void check_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf,
              op, ": x must be fp32/bf16/fp16, got ", x.scalar_type());
}

// Threads split output columns; each output is computed by one thread in a fixed order.
void run_cols(const Int6Args& a, Int6Fn fn) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.K * a.M));
  at::parallel_for(0, a.N, grain, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

at::Tensor int6_matmul_a8(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                          const at::Tensor& scales, const at::Tensor& super_scales, int64_t isa) {
  check_x("int6_matmul_a8", x);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t N = check_int6("int6_matmul_a8", qlow, qhigh, scales, super_scales, K);
  Int6Args a = weight_args(qlow, qhigh, scales, super_scales, N, K);
  a.M = M;
  // fp32 / bf16 rows are read in place (unit column stride); fp16 is widened once.
  const bool direct = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                      x.stride(1) == 1;
  const at::Tensor xs = direct ? x : x.to(at::kFloat).contiguous();
  const bool bf16 = xs.scalar_type() == at::kBFloat16;
  // per-thread scratch that only grows (a decode step makes many calls)
  thread_local std::vector<char> buf;
  const auto up = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t n_xq = up(M * K), n_d = up(M * (K / 32) * 4), n_dv = up(M * (K / 32) * 16),
                n_c = up(M * (K / 8) * 4);
  const size_t total = n_xq + n_d + n_dv + n_c + 64;
  if (buf.size() < total) buf.resize(total);
  char* p = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  int8_t* xq = reinterpret_cast<int8_t*>(p);
  float* d = reinterpret_cast<float*>(p + n_xq);
  float* dv = reinterpret_cast<float*>(p + n_xq + n_d);
  int32_t* corr = reinterpret_cast<int32_t*>(p + n_xq + n_d + n_dv);
  A8Args qa{};
  qa.M = M;
  qa.K = K;
  qa.Kp = K;
  qa.group_size = 32;
  qa.ngroups = K / 32;
  const A8Buffers b{xq, nullptr, d, dv, nullptr, nullptr};
  const int64_t use = cpu_clamp_isa(isa);
  static const bool vnni_ok = cpu_has_vnni();
  const bool vnni = use == 2 && vnni_ok;
  (vnni ? a8_quantize_avx512 : use >= 1 ? a8_quantize_avx2 : a8_quantize_scalar)(
      xs.data_ptr(), bf16, xs.stride(0), qa, b, true);
  // corr[m, 16 c + L] = -32 * (the 8 activations lane L of chunk c meets)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < K / 128; ++c) {
      const int8_t* q = xq + m * K + 128 * c;
      for (int L = 0; L < 16; ++L) {
        int32_t s = 0;
        for (int t = 0; t < 4; ++t) s += q[4 * L + t] + q[64 + 4 * L + t];
        corr[m * (K / 8) + 16 * c + L] = -32 * s;
      }
    }
  a.xq = xq;
  a.corr = corr;
  a.dact = d;
  a.dv = dv;
  at::Tensor out = at::empty({M, N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = bf16;
  run_cols(a, vnni ? int6_a8_vnni : use >= 1 ? int6_a8_avx2 : int6_a8_scalar);
  return x.scalar_type() == out.scalar_type() ? out : out.to(x.scalar_type());
}

at::Tensor int6_matmul(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                       const at::Tensor& scales, const at::Tensor& super_scales, int64_t isa) {
  check_x("int6_matmul", x);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t N = check_int6("int6_matmul", qlow, qhigh, scales, super_scales, K);
  Int6Args a = weight_args(qlow, qhigh, scales, super_scales, N, K);
  a.M = M;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  a.x = xf.data_ptr<float>();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = false;
  const int64_t use = cpu_clamp_isa(isa);
  run_cols(a, use == 2 ? int6_f32_avx512 : use == 1 ? int6_f32_avx2 : int6_f32_scalar);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

void int6_dequantize(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     const at::Tensor& super_scales, at::Tensor out, int64_t isa) {
  TORCH_CHECK(qlow.dim() == 2, "int6_dequantize: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int6("int6_dequantize", qlow, qhigh, scales, super_scales, K);
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(0) == N && out.size(1) == K && out.is_contiguous(),
              "int6_dequantize: out must be contiguous fp32 or bf16 [", N, ", ", K, "], got ",
              out.sizes(), " ", out.scalar_type());
  const Int6Args a = weight_args(qlow, qhigh, scales, super_scales, N, K);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  void* o = out.data_ptr();
  const int64_t use = cpu_clamp_isa(isa);
  void (*fn)(const Int6Args&, void*, bool, int64_t, int64_t) =
      use == 2 ? int6_dequant_rows_avx512 : use == 1 ? int6_dequant_rows_avx2
                                                    : int6_dequant_rows_scalar;
  const int64_t grain = std::max<int64_t>(1, 16384 / K);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { fn(a, o, bf16, r0, r1); });
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
  m.def("gguf_repack_q6(Tensor raw, Tensor(a!) qlow, Tensor(b!) qhigh, Tensor(c!) scales, "
        "Tensor(d!) super_scales, Tensor? rows) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int6_matmul_a8", &localchat_cpu::int6_matmul_a8);
  m.impl("int6_matmul", &localchat_cpu::int6_matmul);
  m.impl("int6_dequantize", &localchat_cpu::int6_dequantize);
  m.impl("gguf_repack_q6", &localchat_cpu::gguf_repack_q6);
}
