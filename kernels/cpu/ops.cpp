// Checking launchers and torch.library registration of localchat's CPU kernels
// (namespace ``localchat_cpu``). The ISA is an argument (0 scalar, 1 AVX2, 2 AVX-512); the
// Python side (localchat.kernels.cpu) resolves it from the CPU's flags and
// LOCALCHAT_CPU_ISA, clamped here to what the CPU supports.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "dequant.h"
#include "qa8.h"
#include "quant.h"

namespace localchat_cpu {
namespace {

int64_t best_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma"))
    return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#endif
  return kScalar;
}

bool has_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return best_isa() == kAvx512 && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

int64_t clamp_isa(int64_t isa) {
  static const int64_t best = best_isa();
  return std::max<int64_t>(kScalar, std::min(isa, best));
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
                       const at::Tensor& mins, int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int4_matmul: x [M, K] and qweight [N, K/2]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) * 2 == K,
              "int4_matmul: qweight must be uint8 [N, K/2], got ", qweight.sizes(), " for K=", K);
  TORCH_CHECK(group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_matmul: group_size ", group_size, " must be a multiple of 32 dividing K=", K);
  const int64_t ng = K / group_size;
  const bool half = exact_scales("int4_matmul", scales, &mins, N, ng);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_matmul: x must be fp32/bf16/fp16");
  at::Tensor xp = widen(x, true);
  at::Tensor q = qweight.contiguous(), s = scales.contiguous(), m = mins.contiguous();
  QuantArgs a{xp.data_ptr<float>(), q.data_ptr(), s.data_ptr(), m.data_ptr(), half,
              nullptr, M, N, K, group_size, ng};
  const int64_t use = clamp_isa(isa);
  RowsFn fn = use == kAvx512 ? int4_rows_avx512 : use == kAvx2 ? int4_rows_avx2
                                                               : int4_rows_scalar;
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


// out [N, K] fp32 <- q * s + m of the int4 rows qweight [N, K/2] (fp32 or fp16 scales/mins
// [N, K/G]): the same fp32 values every kernel dequantizes to (fma, one rounding; exact for
// GGUF scales), or those values rounded to bf16 (out bf16). For blocks of rows of a prefill
// GEMM (M > CPU_MAX_ROWS).
template <class ST, class OT>
void dequant4_rows(const uint8_t* q, const ST* s, const ST* m, OT* out, int64_t r0,
                   int64_t r1, int64_t K, int64_t G) {
  const int64_t ng = K / G;
  for (int64_t n = r0; n < r1; ++n) {
    const uint8_t* qr = q + n * (K / 2);
    OT* o = out + n * K;
    for (int64_t g = 0; g < ng; ++g) {
      const float sc = static_cast<float>(s[n * ng + g]), mn = static_cast<float>(m[n * ng + g]);
      OT table[16];
      for (int v = 0; v < 16; ++v)
        table[v] = static_cast<OT>(std::fma(static_cast<float>(v), sc, mn));
      for (int64_t j = g * G / 2; j < (g + 1) * G / 2; ++j) {
        o[2 * j] = table[qr[j] & 0x0F];
        o[2 * j + 1] = table[qr[j] >> 4];
      }
    }
  }
}

void int4_dequantize(const at::Tensor& qweight, const at::Tensor& scales, const at::Tensor& mins,
                     int64_t group_size, at::Tensor out) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "int4_dequantize: qweight must be contiguous uint8 [N, K/2]");
  const int64_t N = qweight.size(0), K = qweight.size(1) * 2;
  TORCH_CHECK(group_size > 0 && group_size % 2 == 0 && K % group_size == 0,
              "int4_dequantize: group_size ", group_size, " must divide K=", K);
  const int64_t ng = K / group_size;
  const bool half = exact_scales("int4_dequantize", scales, &mins, N, ng);
  TORCH_CHECK(scales.is_contiguous() && mins.is_contiguous(),
              "int4_dequantize: scales and mins must be contiguous");
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.is_contiguous() && out.sizes() == at::IntArrayRef({N, K}),
              "int4_dequantize: out must be contiguous fp32 or bf16 [", N, ", ", K, "]");
  const uint8_t* q = qweight.data_ptr<uint8_t>();
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  if (clamp_isa(kAvx512) == kAvx512 && group_size % 32 == 0) {  // the vector path: same values
    const Int4DequantArgs a{q, scales.data_ptr(), mins.data_ptr(), half, out.data_ptr(), bf16,
                            K, group_size, ng};
    at::parallel_for(0, N, 16, [&](int64_t r0, int64_t r1) { int4_dequant_rows_avx512(a, r0, r1); });
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

// ---- integer-dot (W4A8 / W8A8) matmuls, qa8.h -------------------------------------------

typedef void (*A8Fn)(const A8Args&, int64_t, int64_t);

// Checks the scale / min tensors: [N, ngroups] fp32 or fp16, contiguous, both one dtype.
bool a8_scales(const char* op, const at::Tensor& scales, const at::Tensor* mins, int64_t N,
               int64_t ng) {
  const auto dt = scales.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kHalf) && scales.numel() == N * ng &&
                  scales.size(0) == N && scales.is_contiguous(),
              op, ": scales must be contiguous fp32 or fp16 [", N, ", ", ng, "], got ",
              scales.sizes(), " ", dt);
  if (mins)
    TORCH_CHECK(mins->scalar_type() == dt && mins->numel() == N * ng && mins->is_contiguous(),
                op, ": mins must be contiguous [", N, ", ", ng, "] of the scales' dtype");
  return dt == at::kHalf;
}

// The activation buffers of one call (qa8.h), in a per-thread scratch that only grows: a
// decode step makes a few hundred of these calls, each would otherwise allocate six tensors.
A8Buffers a8_scratch(const A8Args& a, bool int4) {
  thread_local std::vector<char> buf;
  const int64_t M = a.M, Kp = a.Kp;
  const auto up = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t n_xq = up(M * Kp), n_nc = int4 ? 0 : up(M * (Kp / 4) * 4),
                n_d = up(M * (Kp / 32) * 4), n_dv = up(M * (Kp / 32) * 8 * 4),
                n_xs = a.mins ? up(M * a.ngroups * 4) : 0, n_tbl = up(Kp / 32 * 4);
  const size_t total = n_xq + n_nc + n_d + n_dv + n_xs + n_tbl + 64;
  if (buf.size() < total) buf.resize(total);
  char* p = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  A8Buffers b;
  b.xq = reinterpret_cast<int8_t*>(p);
  p += n_xq;
  b.ncorr = int4 ? nullptr : reinterpret_cast<int32_t*>(p);
  p += n_nc;
  b.d = reinterpret_cast<float*>(p);
  p += n_d;
  b.dv = reinterpret_cast<float*>(p);
  p += n_dv;
  b.xs = a.mins ? reinterpret_cast<float*>(p) : nullptr;
  p += n_xs;
  int32_t* tbl = reinterpret_cast<int32_t*>(p);
  for (int64_t i = 0; i < Kp / 32; ++i)
    tbl[i] = static_cast<int32_t>(std::min(i, a.K / 32 - 1) * 32 / a.group_size);
  b.blk2grp = tbl;
  return b;
}

typedef void (*A8QuantFn)(const void*, bool, int64_t, const A8Args&, const A8Buffers&, bool);

at::Tensor run_a8(const at::Tensor& x, A8Args a, bool int4, A8Fn fn, A8QuantFn quant) {
  // fp32 / bf16 rows are read in place (unit column stride); fp16 is widened once.
  const bool direct = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                      x.stride(1) == 1;
  const at::Tensor xs = direct ? x : x.to(at::kFloat).contiguous();
  const bool bf16 = xs.scalar_type() == at::kBFloat16;
  const A8Buffers b = a8_scratch(a, int4);
  quant(xs.data_ptr(), bf16, xs.stride(0), a, b, int4);
  a.xq = b.xq;
  a.ncorr = b.ncorr;
  a.d = b.d;
  a.dv = b.dv;
  a.xs = b.xs;
  a.blk2grp = b.blk2grp;
  at::Tensor out = at::empty({a.M, a.N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = bf16;
  // Threads split output columns; each output is computed by one thread in a fixed order.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.K * a.M));
  at::parallel_for(0, a.N, grain, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
  return x.scalar_type() == out.scalar_type() ? out : out.to(x.scalar_type());
}

A8Fn pick_a8(int64_t isa, A8Fn vnni, A8Fn avx2, A8Fn scalar) {
  const int64_t use = clamp_isa(isa);
  static const bool vnni_ok = has_vnni();
  if (use == kAvx512 && vnni_ok) return vnni;
  return use >= kAvx2 ? avx2 : scalar;
}

// The quantizer of the same ISA level as pick_a8's kernel (the same integers on every one).
A8QuantFn pick_a8_quant(int64_t isa) {
  const int64_t use = clamp_isa(isa);
  static const bool vnni_ok = has_vnni();
  if (use == kAvx512 && vnni_ok) return a8_quantize_avx512;
  return use >= kAvx2 ? a8_quantize_avx2 : a8_quantize_scalar;
}

at::Tensor int4_matmul_a8(const at::Tensor& x, const at::Tensor& qweight,
                          const at::Tensor& scales, const at::Tensor& mins, int64_t group_size,
                          int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int4_matmul_a8: x [M, K], qweight [N, K/2]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) * 2 == K &&
                  qweight.is_contiguous(),
              "int4_matmul_a8: qweight must be contiguous uint8 [N, K/2], got ", qweight.sizes(),
              " for K=", K);
  TORCH_CHECK(K > 0 && group_size > 0 && group_size % 32 == 0 && K % group_size == 0,
              "int4_matmul_a8: group_size ", group_size, " must be a multiple of 32 dividing K=",
              K);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int4_matmul_a8: x must be fp32/bf16/fp16");
  const int64_t ng = K / group_size;
  const bool half = a8_scales("int4_matmul_a8", scales, &mins, N, ng);
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qweight.data_ptr(),
           scales.data_ptr(), mins.data_ptr(), half, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, group_size, ng};
  return run_a8(x, a, true, pick_a8(isa, int4_a8_vnni, int4_a8_avx2, int4_a8_scalar),
                pick_a8_quant(isa));
}

at::Tensor int8_matmul_a8(const at::Tensor& x, const at::Tensor& qweight,
                          const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                          int64_t group_size, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && qweight.dim() == 2, "int8_matmul_a8: x [M, K], qweight [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.size(1) == K &&
                  qweight.is_contiguous(),
              "int8_matmul_a8: qweight must be contiguous int8 [N, K], got ", qweight.sizes(),
              " for K=", K);
  TORCH_CHECK(K > 0 && K % 32 == 0 && group_size > 0 && K % group_size == 0 &&
                  (group_size == 16 || group_size % 32 == 0),
              "int8_matmul_a8: group_size ", group_size,
              " must be 16 or a multiple of 32 dividing K=", K, " (K a multiple of 32)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf, "int8_matmul_a8: x must be fp32/bf16/fp16");
  const int64_t ng = K / group_size;
  const bool has_min = mins.has_value() && mins->defined();
  const bool half = a8_scales("int8_matmul_a8", scales, has_min ? &*mins : nullptr, N, ng);
  A8Args a{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, qweight.data_ptr(),
           scales.data_ptr(), has_min ? mins->data_ptr() : nullptr, half, nullptr, false,
           M, N, K, (K + 127) / 128 * 128, group_size, ng};
  return run_a8(x, a, false, pick_a8(isa, int8_a8_vnni, int8_a8_avx2, int8_a8_scalar),
                pick_a8_quant(isa));
}

// The activation quantizer alone (tests: the same integers on every ISA): x [M, K] fp32 / bf16
// (K % 32 == 0) -> (xq [M, Kp] int8 in the int4 or int8 layout of qa8.h, d [M, Kp / 32]).
std::tuple<at::Tensor, at::Tensor> a8_quantize(const at::Tensor& x, bool int4, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.size(1) % 32 == 0 && x.stride(1) == 1 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "a8_quantize: x must be fp32/bf16 [M, K] with K % 32 == 0 and unit column stride");
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 127) / 128 * 128;
  A8Args a{};
  a.M = M;
  a.K = K;
  a.Kp = Kp;
  a.group_size = 32;
  a.ngroups = K / 32;
  at::Tensor xq = at::empty({M, Kp}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, Kp / 32}, x.options().dtype(at::kFloat));
  at::Tensor dv = at::empty({M, Kp / 32 * 8}, x.options().dtype(at::kFloat));
  at::Tensor nc = at::empty({M, Kp / 4}, x.options().dtype(at::kInt));
  A8Buffers b{xq.data_ptr<int8_t>(), int4 ? nullptr : nc.data_ptr<int32_t>(),
              d.data_ptr<float>(), dv.data_ptr<float>(), nullptr, nullptr};
  pick_a8_quant(isa)(x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), a, b, int4);
  return {xq, d};
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY(localchat_cpu, m) {
  m.def("best_isa() -> int", &localchat_cpu::best_isa);
  m.def("has_vnni() -> bool", &localchat_cpu::has_vnni);
  m.def("a8_quantize(Tensor x, bool int4, int isa) -> (Tensor, Tensor)",
        &localchat_cpu::a8_quantize);
  m.def("int4_matmul_a8(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "int isa) -> Tensor");
  m.def("int8_matmul_a8(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, "
        "int group_size, int isa) -> Tensor");
  m.def("int4_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "int isa) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor qweight, Tensor scales, Tensor? mins, int group_size, "
        "int isa) -> Tensor");
  m.def("int4_dequantize(Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("int4_matmul", &localchat_cpu::int4_matmul);
  m.impl("int8_matmul", &localchat_cpu::int8_matmul);
  m.impl("int4_dequantize", &localchat_cpu::int4_dequantize);
  m.impl("int4_matmul_a8", &localchat_cpu::int4_matmul_a8);
  m.impl("int8_matmul_a8", &localchat_cpu::int8_matmul_a8);
}
