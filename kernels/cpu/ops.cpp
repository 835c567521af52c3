// Checking launchers and torch.library registration of localchat's CPU kernels
// (namespace ``localchat_cpu``). The ISA is an argument (0 scalar, 1 AVX2, 2 AVX-512); the
// Python side (localchat.kernels.cpu) resolves it from the CPU's flags and
// LOCALCHAT_CPU_ISA, clamped here to what the CPU supports.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dequant.h"
#include "isa.h"
#include "kscales.h"
#include "quant.h"
#include "strip_gemm.h"

namespace localchat_cpu {
namespace {

int64_t best_isa() { return cpu_best_isa(); }
bool has_vnni() { return cpu_has_vnni(); }
int64_t clamp_isa(int64_t isa) { return cpu_clamp_isa(isa); }

// Ends the calling thread's OpenMP worker threads (OpenMP 5.0 omp_pause_resource_all; the
// next parallel region on this thread starts new ones). libgomp spins a worker waiting for
// the next region ~300k iterations, but only 100 while it manages more threads than there
// are CPUs: a process whose main thread loaded the model (one team) and whose engine thread
// decodes (a second team) would sleep and wake its workers at every kernel. Returns false
// where OpenMP is not compiled in or the pause failed.
bool release_thread_pool() {
#ifdef _OPENMP
  return omp_pause_resource_all(omp_pause_soft) == 0;
#else
  return false;
#endif
}

typedef void (*RowsFn)(const QuantArgs&, int64_t, int64_t);

// x [M, K] (fp32 / bf16 / fp16, any strides) -> a contiguous fp32 copy; for int4 block-major
// [K/32][M][32], each 32-column block permuted as quant.h describes (int4_src_col).
template <class T>
void widen_rows(const at::Tensor& x, float* dst, bool permute) {
  const int64_t M = x.size(0), K = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const T* src = x.data_ptr<T>();
  int perm[32];
  for (int i = 0; i < 32; ++i) perm[i] = permute ? int4_src_col(i) : i;
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = src + m * s0;
    float* d = dst + m * K;
    if (!permute && s1 == 1) {
      for (int64_t k = 0; k < K; ++k) d[k] = static_cast<float>(xr[k]);
      continue;
    }
    for (int64_t kb = 0; kb < K; kb += 32) {
      float* db = permute ? dst + (kb / 32 * M + m) * 32 : d + kb;  // int4: [K/32][M][32]
      for (int i = 0; i < 32 && kb + i < K; ++i)
        db[i] = static_cast<float>(xr[(kb + perm[i]) * s1]);
    }
  }
}

at::Tensor widen(const at::Tensor& x, bool permute) {
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  float* d = out.data_ptr<float>();
  switch (x.scalar_type()) {
    case at::kFloat: widen_rows<float>(x, d, permute); break;
    case at::kBFloat16: widen_rows<at::BFloat16>(x, d, permute); break;
    case at::kHalf: widen_rows<at::Half>(x, d, permute); break;
    default: TORCH_CHECK(false, "x must be fp32/bf16/fp16");
  }
  return out;
}

// Checks the scale / min tensors of the exact kernels: [N, ngroups] fp32 or fp16 (both one
// dtype); returns whether they are fp16. Contiguous ones are read in place.
bool exact_scales(const char* op, const at::Tensor& scales, const at::Tensor* mins, int64_t N,
                  int64_t ng) {
  const auto dt = scales.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kHalf) && scales.numel() == N * ng &&
                  scales.size(0) == N,
              op, ": scales must be fp32 or fp16 [", N, ", ", ng, "], got ", scales.sizes(),
              " ", dt);
  if (mins)
    TORCH_CHECK(mins->scalar_type() == dt && mins->numel() == N * ng && mins->size(0) == N,
                op, ": mins must be [", N, ", ", ng, "] of the scales' dtype (fp32 or fp16)");
  return dt == at::kHalf;
}

template <class T>
void narrow_cols(const float* src, T* dst, int64_t M, int64_t N, int64_t c0, int64_t c1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = c0; c < c1; ++c) dst[m * N + c] = static_cast<T>(src[m * N + c]);
}

// Runs fn over column blocks on the torch thread pool; the result in out_like's dtype (a
// bf16 / fp16 result is rounded from the fp32 sums by the thread that computed them).
at::Tensor run_rows(const at::Tensor& out_like, QuantArgs args, RowsFn fn) {
  const auto dt = out_like.scalar_type();
  at::Tensor out32 = at::empty({args.M, args.N}, out_like.options().dtype(at::kFloat));
  at::Tensor out = dt == at::kFloat ? out32 : at::empty({args.M, args.N}, out_like.options());
  args.out = out32.data_ptr<float>();
  // Split output columns in blocks of 4 (the widest tile); each output element is computed
  // by one thread in a fixed order, so the thread count does not change the result.
  const int64_t blocks = (args.N + 3) / 4;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, 4 * args.K));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * 4, c1 = std::min(b1 * 4, args.N);
    fn(args, c0, c1);
    if (dt == at::kBFloat16)
      narrow_cols(args.out, out.data_ptr<at::BFloat16>(), args.M, args.N, c0, c1);
    else if (dt == at::kHalf)
      narrow_cols(args.out, out.data_ptr<at::Half>(), args.M, args.N, c0, c1);
  });
  return out;
}

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t group_size, int64_t isa,
                       const c10::optional<at::Tensor>& super_scales) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int4_matmul: x [M, K] and qweight [N, K/2]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) * 2 == K,
              "int4_matmul: qweight must be uint8 [N, K/2], got ", qweight.sizes(), " for K=", K);
  TORCH_CHECK(group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_matmul: group_size ", group_size, " must be a multiple of 32 dividing K=", K);
  const int64_t ng = K / group_size;
  const bool two_level = super_scales.has_value() && super_scales->defined();
  KScales ks{};
  const bool half = two_level ? false : exact_scales("int4_matmul", scales, &mins, N, ng);
  if (two_level) ks = check_kscales("int4_matmul", scales, mins, *super_scales, N, K, group_size);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_matmul: x must be fp32/bf16/fp16");
  at::Tensor xp = widen(x, true);
  at::Tensor q = qweight.contiguous(), s = scales.contiguous(), m = mins.contiguous();
  QuantArgs a{xp.data_ptr<float>(), q.data_ptr(), s.data_ptr(), m.data_ptr(), half,
              nullptr, M, N, K, group_size, ng};
  const int64_t use = clamp_isa(isa);
  RowsFn fn = use == kAvx512 ? int4_rows_avx512 : use == kAvx2 ? int4_rows_avx2
                                                               : int4_rows_scalar;
  if (two_level) a.super = reinterpret_cast<const uint16_t*>(ks.sup);  // read in place
  return run_rows(x, a, fn);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int8_matmul: x [M, K] and qweight [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.size(1) == K,
              "int8_matmul: qweight must be int8 [N, K], got ", qweight.sizes(), " for K=", K);
  TORCH_CHECK(group_size > 0 && K % group_size == 0,
              "int8_matmul: group_size ", group_size, " must divide K=", K);
  const int64_t ng = K / group_size;
  const bool has_min = mins.has_value() && mins->defined();
  const bool half = exact_scales("int8_matmul", scales, has_min ? &*mins : nullptr, N, ng);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int8_matmul: x must be fp32/bf16/fp16");
  at::Tensor x32 = (x.scalar_type() == at::kFloat && x.is_contiguous()) ? x : widen(x, false);
  at::Tensor q = qweight.contiguous(), s = scales.contiguous();
  at::Tensor m = has_min ? mins->contiguous() : at::Tensor();
  QuantArgs a{x32.data_ptr<float>(), q.data_ptr(), s.data_ptr(),
              has_min ? m.data_ptr() : nullptr, half, nullptr, M, N, K, group_size, ng};
  const int64_t use = clamp_isa(isa);
  RowsFn fn = use == kAvx512 ? int8_rows_avx512 : use == kAvx2 ? int8_rows_avx2
                                                               : int8_rows_scalar;
  return run_rows(x, a, fn);
}


void int4_dequantize(const at::Tensor& qweight, const at::Tensor& scales, const at::Tensor& mins,
                     int64_t group_size, at::Tensor out,
                     const c10::optional<at::Tensor>& super_scales, int64_t isa) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "int4_dequantize: qweight must be contiguous uint8 [N, K/2]");
  const int64_t N = qweight.size(0), K = qweight.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % 2 == 0 && K % group_size == 0,
              "int4_dequantize: group_size ", group_size, " must divide K=", K);
  const int64_t ng = K / group_size;
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.is_contiguous() && out.sizes() == at::IntArrayRef({N, K}),
              "int4_dequantize: out must be contiguous fp32 or bf16 [", N, ", ", K, "]");
  const uint8_t* q = qweight.data_ptr<uint8_t>();
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  if (super_scales.has_value() && super_scales->defined()) {
    // two-level scales: chunks of rows with widened fp32 scales (kscales.h)
    const KScales ks = check_kscales("int4_dequantize", scales, mins, *super_scales, N, K,
                                     group_size);
    const int64_t use = clamp_isa(isa);  // G = 32: both vector paths apply
    const size_t osz = bf16 ? 2 : 4;
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      for_kscale_chunks(ks, n0, n1, [&](int64_t r0, int64_t r1, float* s, float* m) {
        const uint8_t* qc = q + r0 * (K / 2);
        void* oc = static_cast<char*>(out.data_ptr()) + r0 * K * osz;
        if (use != kScalar) {
          const Int4DequantArgs a{qc, s, m, false, oc, bf16, K, group_size, ng};
          if (use == kAvx512) int4_dequant_rows_avx512(a, 0, r1 - r0);
          else int4_dequant_rows_avx2(a, 0, r1 - r0);
        } else if (bf16) {
          dequant4_rows(qc, s, m, static_cast<at::BFloat16*>(oc), 0, r1 - r0, K, group_size);
        } else {
          dequant4_rows(qc, s, m, static_cast<float*>(oc), 0, r1 - r0, K, group_size);
        }
      });
    });
    return;
  }
  const bool half = exact_scales("int4_dequantize", scales, &mins, N, ng);
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous(),
              "int4_dequantize: scales and mins must be contiguous");
  const int64_t use = clamp_isa(isa);
  if (use != kScalar && group_size % 32 == 0) {  // the vector paths: the same values
    const Int4DequantArgs a{q, scales.data_ptr(), mins.data_ptr(), half, out.data_ptr(), bf16,
                            K, group_size, ng};
    const auto rows = use == kAvx512 ? int4_dequant_rows_avx512 : int4_dequant_rows_avx2;
    at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) { rows(a, r0, r1); });
    return;
  }
  at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) {
    if (half && bf16)
      dequant4_rows(q, scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>(),
                    out.data_ptr<at::BFloat16>(), r0, r1, K, group_size);
    else if (half)
      dequant4_rows(q, scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>(),
                    out.data_ptr<float>(), r0, r1, K, group_size);
    else if (bf16)
      dequant4_rows(q, scales.data_ptr<float>(), mins.data_ptr<float>(),
                    out.data_ptr<at::BFloat16>(), r0, r1, K, group_size);
    else
      dequant4_rows(q, scales.data_ptr<float>(), mins.data_ptr<float>(),
                    out.data_ptr<float>(), r0, r1, K, group_size);
  });
}

// The int4 weight for the AMX prefill GEMM (strip_gemm.h): rows dequantized to bf16 by the
// AVX-512 row kernel, the values int4_dequantize writes.
struct Int4Fill {
  const uint8_t* q;
  const char* scales;  // [N, ng] fp32 / fp16 (plain), unused with ks
  const char* mins;
  size_t ssz;          // bytes per scale
  bool half, two_level;
  KScales ks;
  int64_t K, G, ng;
};

void int4_fill(const void* ctx, int64_t r0, int64_t r1, uint16_t* rows) {
  const Int4Fill& f = *static_cast<const Int4Fill*>(ctx);
  if (f.two_level && f.ng > kAmxMaxGroups) {  // rows too long for its stack buffers
    for_kscale_chunks(f.ks, r0, r1, [&](int64_t c0, int64_t c1, float* s, float* m) {
      int4_rows_bf16_amx(f.q + c0 * (f.K / 2), s, m, false, f.K, c1 - c0,
                         rows + (c0 - r0) * f.K);
    });
    return;
  }
  if (f.two_level) {  // groups of 32: the table-lookup rows of the AMX unit (amx.h)
    int4k_rows_bf16_amx(f.q + r0 * (f.K / 2), f.ks.sc + r0 * f.ng, f.ks.mn + r0 * f.ng,
                        reinterpret_cast<const uint16_t*>(f.ks.sup) + r0 * (f.ng / 8) * 2, f.K,
                        r1 - r0, rows);
    return;
  }
  if (f.G == 32) {  // fp32 or fp16 (Q4_0 / Q4_1) scales: the table-lookup rows
    int4_rows_bf16_amx(f.q + r0 * (f.K / 2), f.scales + r0 * f.ng * f.ssz,
                       f.mins + r0 * f.ng * f.ssz, f.half, f.K, r1 - r0, rows);
    return;
  }
  const Int4DequantArgs a{f.q + r0 * (f.K / 2), f.scales + r0 * f.ng * f.ssz,
                          f.mins + r0 * f.ng * f.ssz, f.half, rows, true, f.K, f.G, f.ng};
  int4_dequant_rows_avx512(a, 0, r1 - r0);
}

// x [M, K] bf16 @ the int4 weight's dequantized (bf16) rows .T -> [M, N] bf16, through the
// AMX strip GEMM (strip_gemm.h; AMX CPUs only). Same weight arguments as int4_dequantize.
at::Tensor int4_dequant_mm(const at::Tensor& x, const at::Tensor& qweight,
                           const at::Tensor& scales, const at::Tensor& mins, int64_t group_size,
                           const c10::optional<at::Tensor>& super_scales) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "int4_dequant_mm: qweight must be contiguous uint8 [N, K/2]");
  const int64_t N = qweight.size(0), K = qweight.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_dequant_mm: group_size ", group_size, " must be a multiple of 32 dividing K=",
              K);
  Int4Fill f{qweight.data_ptr<uint8_t>(), nullptr, nullptr, 4, false, false, KScales{}, K,
             group_size, K / group_size};
  if (super_scales.has_value() && super_scales->defined()) {
    f.two_level = true;
    f.ks = check_kscales("int4_dequant_mm", scales, mins, *super_scales, N, K, group_size);
  } else {
    f.half = exact_scales("int4_dequant_mm", scales, &mins, N, f.ng);
    TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous(),
                "int4_dequant_mm: scales and mins must be contiguous");
    f.scales = static_cast<const char*>(scales.data_ptr());
    f.mins = static_cast<const char*>(mins.data_ptr());
    f.ssz = f.half ? 2 : 4;
  }
  return strip_gemm("int4_dequant_mm", x, N, K, int4_fill, &f);
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY(localchat_cpu, m) {
  m.def("best_isa() -> int", &localchat_cpu::best_isa);
  m.def("has_vnni() -> bool", &localchat_cpu::has_vnni);
  m.def("release_thread_pool() -> bool", &localchat_cpu::release_thread_pool);
  m.def("int4_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "int isa, Tensor? super_scales=None) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int group_size, "
        "int isa) -> Tensor");
  m.def("int4_dequantize(Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "Tensor(a!) out, Tensor? super_scales=None, int isa=2) -> ()");
  m.def("int4_dequant_mm(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "Tensor? super_scales=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_matmul", &localchat_cpu::int4_matmul);
  m.impl("int8_matmul", &localchat_cpu::int8_matmul);
  m.impl("int4_dequantize", &localchat_cpu::int4_dequantize);
  m.impl("int4_dequant_mm", &localchat_cpu::int4_dequant_mm);
}
