// The launcher half shared by the two bit-plane layouts, int5 (qa5_ops.cpp) and int6
// (qa6_ops.cpp): both hold a 4-bit low plane `qlow` [N, K / 2] in the int4 nibble order and a
// high plane `qhigh` [N, K / qhigh_div], and their Args structs (qa5.h Int5Args, qa6.h
// Int6Args) share the activation / output fields (xq, corr, dact, dv, x, out, out_bf16, M, N,
// K). What differs (scale tensors, the offset u - q, the kernels) stays in each ops file.
// Included inside namespace localchat_cpu { namespace { ... } } of each ops TU (ATen headers,
// isa.h, qa8.h and strip_gemm.h already included there).

// x [M, K] fp32 / bf16 / fp16.
inline void check_plane_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf,
              op, ": x must be fp32/bf16/fp16, got ", x.scalar_type());
}

// Checks K (a positive multiple of k_align) and the two planes; returns N.
inline int64_t check_planes(const char* op, const at::Tensor& qlow, const at::Tensor& qhigh,
                            int64_t K, int64_t k_align, int64_t qhigh_div) {
  TORCH_CHECK(K > 0 && K % k_align == 0, op, ": K=", K, " must be a positive multiple of ",
              k_align);
  TORCH_CHECK(qlow.dim() == 2 && qlow.scalar_type() == at::kByte && qlow.is_contiguous() &&
                  qlow.size(1) * 2 == K,
              op, ": qlow must be contiguous uint8 [N, ", K / 2, "], got ", qlow.sizes(), " ",
              qlow.scalar_type());
  const int64_t N = qlow.size(0);
  TORCH_CHECK(qhigh.dim() == 2 && qhigh.scalar_type() == at::kByte && qhigh.is_contiguous() &&
                  qhigh.size(0) == N && qhigh.size(1) * qhigh_div == K,
              op, ": qhigh must be contiguous uint8 [", N, ", ", K / qhigh_div, "], got ",
              qhigh.sizes(), " ", qhigh.scalar_type());
  return N;
}

// Threads split output columns; each output is computed by one thread in a fixed order.
template <class Args>
void plane_run_cols(const Args& a, void (*fn)(const Args&, int64_t, int64_t)) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.K * a.M));
  at::parallel_for(0, a.N, grain, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

// The integer-dot matmul over `a` (weights, N and K set): x quantized by qa8's int4-layout
// quantizer into per-thread scratch, corr[m, 16 c + L] = -offset * (the 8 activations lane L of
// chunk c meets; for the AVX2 kernel the layout's own per-256-column sums instead,
// Args::put_avx2_sums), then the VNNI / AVX2 / scalar kernel by the clamped ISA (level 2 without
// VNNI takes AVX2). Output [M, N] in x's dtype (bf16 x: bf16 from the kernel; fp16 x: fp32
// rounded once).
template <class Args>
at::Tensor plane_matmul_a8(const at::Tensor& x, Args a, int32_t offset, int64_t isa,
                           void (*vnni_fn)(const Args&, int64_t, int64_t),
                           void (*avx2_fn)(const Args&, int64_t, int64_t),
                           void (*scalar_fn)(const Args&, int64_t, int64_t)) {
  const int64_t M = x.size(0), K = a.K, N = a.N;
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
  // the AVX2 kernels take each layout's own per-256-column sums (Args::put_avx2_sums) in
  // place of corr
  const bool avx2 = !vnni && use >= 1;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < K / 128; ++c) {
      const int8_t* q = xq + m * K + 128 * c;
      int32_t lane[16];
      for (int L = 0; L < 16; ++L) {
        int32_t s = 0;
        for (int t = 0; t < 4; ++t) s += q[4 * L + t] + q[64 + 4 * L + t];
        lane[L] = s;
      }
      if (avx2) Args::put_avx2_sums(lane, m, c, K, corr);
      else
        for (int L = 0; L < 16; ++L) corr[m * (K / 8) + 16 * c + L] = -offset * lane[L];
    }
  a.xq = xq;
  a.corr = corr;
  a.avx2_sums = corr;
  a.dact = d;
  a.dv = dv;
  at::Tensor out = at::empty({M, N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = bf16;
  plane_run_cols(a, vnni ? vnni_fn : use >= 1 ? avx2_fn : scalar_fn);
  return x.scalar_type() == out.scalar_type() ? out : out.to(x.scalar_type());
}

// The exact fp32-activation matmul over `a`: x widened to fp32 once, the AVX-512 / AVX2 /
// scalar kernel by the clamped ISA. Output [M, N] in x's dtype (computed in fp32).
template <class Args>
at::Tensor plane_matmul_f32(const at::Tensor& x, Args a, int64_t isa,
                            void (*avx512_fn)(const Args&, int64_t, int64_t),
                            void (*avx2_fn)(const Args&, int64_t, int64_t),
                            void (*scalar_fn)(const Args&, int64_t, int64_t)) {
  a.M = x.size(0);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  a.x = xf.data_ptr<float>();
  at::Tensor out = at::empty({a.M, a.N}, x.options().dtype(at::kFloat));
  a.out = out.data_ptr();
  a.out_bf16 = false;
  const int64_t use = cpu_clamp_isa(isa);
  plane_run_cols(a, use == 2 ? avx512_fn : use == 1 ? avx2_fn : scalar_fn);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// Rows of the weight in `a` (N, K set) dequantized into out [N, K] (contiguous fp32 or bf16),
// rows split over threads.
template <class Args>
void plane_dequantize(const char* op, const Args& a, at::Tensor out, int64_t isa,
                      void (*avx512_fn)(const Args&, void*, bool, int64_t, int64_t),
                      void (*avx2_fn)(const Args&, void*, bool, int64_t, int64_t),
                      void (*scalar_fn)(const Args&, void*, bool, int64_t, int64_t)) {
  const int64_t N = a.N, K = a.K;
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                  out.dim() == 2 && out.size(0) == N && out.size(1) == K && out.is_contiguous(),
              op, ": out must be contiguous fp32 or bf16 [", N, ", ", K, "], got ",
              out.sizes(), " ", out.scalar_type());
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  void* o = out.data_ptr();
  const int64_t use = cpu_clamp_isa(isa);
  void (*fn)(const Args&, void*, bool, int64_t, int64_t) =
      use == 2 ? avx512_fn : use == 1 ? avx2_fn : scalar_fn;
  const int64_t grain = std::max<int64_t>(1, 16384 / K);
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { fn(a, o, bf16, r0, r1); });
}

// The weight in `a` for the AMX prefill GEMM (strip_gemm.h), its rows through the layout's
// bf16 fill (amx.h: int5_rows_bf16_amx / int6_rows_bf16_amx).
template <class Args>
struct PlaneFill {
  const Args* a;
  void (*fn)(const Args&, int64_t, int64_t, uint16_t*);
};

template <class Args>
void plane_fill(const void* ctx, int64_t r0, int64_t r1, uint16_t* rows) {
  const PlaneFill<Args>& f = *static_cast<const PlaneFill<Args>*>(ctx);
  f.fn(*f.a, r0, r1, rows);
}

// x [M, K] bf16 @ the weight in `a` (N, K set) dequantized to bf16 .T -> [M, N] bf16, through
// the AMX strip GEMM (AMX CPUs only).
template <class Args>
at::Tensor plane_dequant_mm(const char* op, const at::Tensor& x, const Args& a,
                            void (*fill_fn)(const Args&, int64_t, int64_t, uint16_t*)) {
  const PlaneFill<Args> f{&a, fill_fn};
  return strip_gemm(op, x, a.N, a.K, plane_fill<Args>, &f);
}
