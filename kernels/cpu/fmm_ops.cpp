// Checking launcher and torch.library registration (a fragment of namespace ``localchat_cpu``)
// of the float-weight matmul for few rows (fmm.h): decode and draft verification over fp32 /
// bf16 / fp16 weights, batch invariant (F.linear is not: oneDNN's bf16 GEMM sums K in an
// order that depends on M, e.g. K = 4864 or 8960 at M = 5). The ISA argument (0 scalar, 1
// AVX2, 2 AVX-512) is clamped to what the CPU runs.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "fmm.h"
#include "isa.h"

namespace localchat_cpu {
namespace {

// x [M, K] -> fp32 [M, K], each full block of 2 * lanes columns stored as [even | odd]
// columns (fmm.h's pair order for bf16 weights; lanes = 0: unpermuted).
template <class T>
void widen_x(const at::Tensor& x, float* dst, int64_t lanes) {
  const int64_t M = x.size(0), K = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const T* src = x.data_ptr<T>();
  const int64_t B = 2 * lanes, Kv = lanes ? K / B * B : 0;
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = src + m * s0;
    float* d = dst + m * K;
    for (int64_t kb = 0; kb < Kv; kb += B)
      for (int64_t j = 0; j < lanes; ++j) {
        d[kb + j] = static_cast<float>(xr[(kb + 2 * j) * s1]);
        d[kb + lanes + j] = static_cast<float>(xr[(kb + 2 * j + 1) * s1]);
      }
    for (int64_t k = Kv; k < K; ++k) d[k] = static_cast<float>(xr[k * s1]);
  }
}

// MXCSR DAZ + FTZ for the calling thread while alive (the bf16 pair order's denormal handling,
// that of vdpbf16ps); restores the previous mode.
struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int saved;
  explicit FlushDenormals(bool on) : saved(_mm_getcsr()) {
    if (on) _mm_setcsr(saved | 0x8040u);
  }
  ~FlushDenormals() { _mm_setcsr(saved); }
#else
  explicit FlushDenormals(bool) {}
#endif
};

template <class T>
void narrow_block(const float* src, T* dst, int64_t M, int64_t N, int64_t c0, int64_t c1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = c0; c < c1; ++c) dst[m * N + c] = static_cast<T>(src[m * N + c]);
}

typedef void (*FmmFn)(const FmmArgs&, int64_t, int64_t);

int fmm_wtype(at::ScalarType t) {
  return t == at::kBFloat16 ? kFmmBF16 : t == at::kHalf ? kFmmF16 : kFmmF32;
}

// The shared launcher: checks x / bias, widens x (and bias) to fp32, runs fn over blocks of
// `block` output columns on the torch thread pool and rounds each block's fp32 results to
// x.dtype on the thread that computed them.
at::Tensor fmm_run(const char* op, const at::Tensor& x, const at::Tensor& w, int64_t N,
                   const c10::optional<at::Tensor>& bias, FmmFn fn, int64_t block,
                   int64_t pair_lanes = 0, bool dot = false) {
  const int64_t M = x.size(0), K = x.size(1);
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kBFloat16 || xt == at::kHalf, op,
              ": x must be fp32/bf16/fp16, got ", xt);
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, op, ": bias must be [", N, "], got ",
                bias->sizes());
  at::Tensor x32;
  if (pair_lanes == 0 && xt == at::kFloat) {
    x32 = x.contiguous();
  } else {
    x32 = at::empty({M, K}, x.options().dtype(at::kFloat));
    if (xt == at::kFloat) widen_x<float>(x, x32.data_ptr<float>(), pair_lanes);
    else if (xt == at::kBFloat16) widen_x<at::BFloat16>(x, x32.data_ptr<float>(), pair_lanes);
    else widen_x<at::Half>(x, x32.data_ptr<float>(), pair_lanes);
  }
  at::Tensor xbf = dot ? x.contiguous() : at::Tensor();
  at::Tensor b32 = has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor out32 = at::empty({M, N}, x.options().dtype(at::kFloat));
  at::Tensor out = xt == at::kFloat ? out32 : at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) {
    if (has_bias) out.copy_(b32.unsqueeze(0).expand({M, N}));
    else out.zero_();
    return out;
  }
  FmmArgs a{x32.data_ptr<float>(), w.data_ptr(), fmm_wtype(w.scalar_type()),
            dot ? reinterpret_cast<const uint16_t*>(xbf.data_ptr()) : nullptr,
            has_bias ? b32.data_ptr<float>() : nullptr, out32.data_ptr<float>(), M, N, K,
            w.stride(0)};
  const bool flush = pair_lanes > 0;
  // Each output is computed by one thread in a fixed order (the thread count changes no
  // result); a task holds at least ~32K weights.
  const int64_t blocks = (N + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, 32768 / (block * K));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * block, c1 = std::min(b1 * block, N);
    {
      FlushDenormals guard(flush);
      fn(a, c0, c1);
    }
    if (xt == at::kBFloat16)
      narrow_block(a.out, out.data_ptr<at::BFloat16>(), M, N, c0, c1);
    else if (xt == at::kHalf)
      narrow_block(a.out, out.data_ptr<at::Half>(), M, N, c0, c1);
  });
  return out;
}

int64_t fmm_use(int64_t isa) {
  return cpu_clamp_isa(isa);
}

// x [M, K] fp32 / bf16 / fp16 (any strides) @ weight [N, K].T (+ bias [N]) -> [M, N] in
// x.dtype. weight fp32 / bf16 / fp16 with unit stride along K (rows may be padded, else it is
// copied); bias of any float dtype (widened to fp32, added before the one rounding).
at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight,
                        const c10::optional<at::Tensor>& bias, int64_t isa, bool bf16_dot) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "float_matmul: x [M, K] and weight [N, K], got ",
              x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(weight.size(1) == x.size(1), "float_matmul: weight ", weight.sizes(), " for K=",
              x.size(1));
  const auto wt = weight.scalar_type();
  TORCH_CHECK(wt == at::kFloat || wt == at::kBFloat16 || wt == at::kHalf,
              "float_matmul: weight must be fp32/bf16/fp16, got ", wt);
  at::Tensor w = (weight.stride(1) == 1 && weight.stride(0) >= weight.size(1)) ? weight
                                                                              : weight.contiguous();
  const int64_t use = fmm_use(isa);
  const bool bf16w = wt == at::kBFloat16;
  static const bool has_dot = cpu_has_avx512_bf16();
  // vdpbf16ps: bf16 x bf16 at the avx512 level on a CPU that has it (bf16_dot false: the
  // FMA twin, the same bits, for tests)
  const bool dot = bf16w && bf16_dot && has_dot && use == 2 && x.scalar_type() == at::kBFloat16;
  FmmFn fn = dot ? fmm_cols_dot : use == 2 ? fmm_cols_avx512 : use == 1 ? fmm_cols_avx2
                                                                         : fmm_cols_scalar;
  return fmm_run("float_matmul", x, w, w.size(0), bias, fn, kFmmBlock,
                 bf16w ? (use == 2 ? 16 : 8) : 0, dot);
}

// x [M, K] @ weight_t [K, N] (fp32, the CPU fp32 layers' transposed copy; unit stride along
// N) (+ bias [N]) -> [M, N] in x.dtype.
at::Tensor float_matmul_t(const at::Tensor& x, const at::Tensor& weight_t,
                          const c10::optional<at::Tensor>& bias, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && weight_t.dim() == 2,
              "float_matmul_t: x [M, K] and weight_t [K, N], got ", x.sizes(), " and ",
              weight_t.sizes());
  TORCH_CHECK(weight_t.size(0) == x.size(1), "float_matmul_t: weight_t ", weight_t.sizes(),
              " for K=", x.size(1));
  TORCH_CHECK(weight_t.scalar_type() == at::kFloat, "float_matmul_t: weight_t must be fp32, got ",
              weight_t.scalar_type());
  at::Tensor w = (weight_t.stride(1) == 1 && weight_t.stride(0) >= weight_t.size(1))
                     ? weight_t : weight_t.contiguous();
  const int64_t use = fmm_use(isa);
  return fmm_run("float_matmul_t", x, w, w.size(1), bias,
                 use == 2 ? fmmt_cols_avx512 : use == 1 ? fmmt_cols_avx2 : fmmt_cols_scalar,
                 kFmmBlockT);
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("float_matmul(Tensor x, Tensor weight, Tensor? bias, int isa, bool bf16_dot=True) "
        "-> Tensor");
  m.def("has_bf16_dot() -> bool", &localchat_cpu::cpu_has_avx512_bf16);
  m.def("float_matmul_t(Tensor x, Tensor weight_t, Tensor? bias, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("float_matmul", &localchat_cpu::float_matmul);
  m.impl("float_matmul_t", &localchat_cpu::float_matmul_t);
}
