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

namespace localchat_cpu {
namespace {

typedef void (*Int5Fn)(const Int5Args&, int64_t, int64_t);

// Checks the three weight tensors against K; returns N.
int64_t check_int5(const char* op, const at::Tensor& qlow, const at::Tensor& qhigh,
                   const at::Tensor& scales, int64_t K) {
  TORCH_CHECK(K > 0 && K % 128 == 0, op, ": K=", K, " must be a positive multiple of 128");
  TORCH_CHECK(qlow.dim() == 2 && qlow.scalar_type() == at::kByte && qlow.is_contiguous() &&
                  qlow.size(1) * 2 == K,
              op, ": qlow must be contiguous uint8 [N, ", K / 2, "], got ", qlow.sizes(), " ",
              qlow.scalar_type());
  const int64_t N = qlow.size(0);
  TORCH_CHECK(qhigh.dim() == 2 && qhigh.scalar_type() == at::kByte && qhigh.is_contiguous() &&
                  qhigh.size(0) == N && qhigh.size(1) * 8 == K,
              op, ": qhigh must be contiguous uint8 [", N, ", ", K / 8, "], got ", qhigh.sizes(),
              " ", qhigh.scalar_type());
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

void check_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf,
              op, ": x must be fp32/bf16/fp16, got ", x.scalar_type());
}

// Threads split output columns; each output is computed by one thread in a fixed order.
void run_cols(const Int5Args& a, Int5Fn fn) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.K * a.M));
  at::parallel_for(0, a.N, grain, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

at::Tensor int5_matmul_a8(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                          const at::Tensor& scales, int64_t isa) {
  check_x("int5_matmul_a8", x);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t N = check_int5("int5_matmul_a8", qlow, qhigh, scales, K);
  Int5Args a = weight_args(qlow, qhigh, scales, N, K);
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
  // corr[m, 16 c + L] = -16 * (the 8 activations lane L of chunk c meets)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < K / 128; ++c) {
      const int8_t* q = xq + m * K + 128 * c;
      for (int L = 0; L < 16; ++L) {
        int32_t s = 0;
        for (int t = 0; t < 4; ++t) s += q[4 * L + t] + q[64 + 4 * L + t];
        corr[m * (K / 8) + 16 * c + L] = -16 * s;
      }
    }
  a.xq = xq;
  a.corr = corr;
  a.dact = d;
  a.dv = dv;
  at::Tensor out = at::empty({M, N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = bf16;
  run_cols(a, vnni ? int5_a8_vnni : use >= 1 ? int5_a8_avx2 : int5_a8_scalar);
  return x.scalar_type() == out.scalar_type() ? out : out.to(x.scalar_type());
}

at::Tensor int5_matmul(const at::Tensor& x, const at::Tensor& qlow, const at::Tensor& qhigh,
                       const at::Tensor& scales, int64_t isa) {
  check_x("int5_matmul", x);
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t N = check_int5("int5_matmul", qlow, qhigh, scales, K);
  Int5Args a = weight_args(qlow, qhigh, scales, N, K);
  a.M = M;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  a.x = xf.data_ptr<float>();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = false;
  const int64_t use = cpu_clamp_isa(isa);
  run_cols(a, use == 2 ? int5_f32_avx512 : use == 1 ? int5_f32_avx2 : int5_f32_scalar);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

void int5_dequantize(const at::Tensor& qlow, const at::Tensor& qhigh, const at::Tensor& scales,
                     at::Tensor out, int64_t isa) {
  TORCH_CHECK(qlow.dim() == 2, "int5_dequantize: qlow must be uint8 [N, K/2], got ",
              qlow.sizes());
  const int64_t K = qlow.size(1) * 2;
  const int64_t N = check_int5("int5_dequantize", qlow, qhigh, scales, K);
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(0) == N && out.size(1) == K && out.is_contiguous(),
              "int5_dequantize: out must be contiguous fp32 or bf16 [", N, ", ", K, "], got ",
              out.sizes(), " ", out.scalar_type());
  const Int5Args a = weight_args(qlow, qhigh, scales, N, K);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  void* o = out.data_ptr();
  const int64_t use = cpu_clamp_isa(isa);
  void (*fn)(const Int5Args&, void*, bool, int64_t, int64_t) =
      use == 2 ? int5_dequant_rows_avx512 : use == 1 ? int5_dequant_rows_avx2
                                                    : int5_dequant_rows_scalar;
  const int64_t grain = std::max<int64_t>(1, 16384 / K);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { fn(a, o, bf16, r0, r1); });
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
  m.def("gguf_repack_q5(Tensor raw, Tensor(a!) qlow, Tensor(b!) qhigh, Tensor(c!) scales, "
        "Tensor? rows) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int5_matmul_a8", &localchat_cpu::int5_matmul_a8);
  m.impl("int5_matmul", &localchat_cpu::int5_matmul);
  m.impl("int5_dequantize", &localchat_cpu::int5_dequantize);
  m.impl("gguf_repack_q5", &localchat_cpu::gguf_repack_q5);
}
