// Checking launchers and torch.library registration (a fragment of namespace
// ``localchat_cpu``) of the CPU attention, KV-store, RMSNorm, rotary and SiLU kernels.
// Contracts: localchat.kernels.reference. The ISA argument (0 scalar, 1 AVX2, 2 AVX-512) is
// clamped to what the CPU runs; the kernels are in attn_{scalar,avx2,avx512}.cpp, and the
// decode attention's vdpbf16ps scores in attn_dot.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "attn.h"
#include "isa.h"

namespace localchat_cpu {
namespace {

const AttnKernels& kernels_for(int64_t isa) {
  const int64_t use = cpu_clamp_isa(isa);
  return use == 2 ? attn_kernels_avx512() : use == 1 ? attn_kernels_avx2()
                                                     : attn_kernels_scalar();
}

// The decode tasks: attn_dot.cpp's where the avx512 level runs on a CPU with AVX512_BF16 and
// bf16_dot asks for them (they differ only for bf16 query and caches), else the ISA's own.
using DecodeTaskFn = void (*)(const DecodeArgs&, int64_t, int64_t);
DecodeTaskFn decode_for(int64_t isa, bool bf16_dot) {
  static const bool has_dot = cpu_has_avx512_bf16();
  if (bf16_dot && has_dot && cpu_clamp_isa(isa) == 2) return attn_decode_dot;
  return kernels_for(isa).decode;
}

int elem_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default: TORCH_CHECK(false, op, ": dtype must be fp32/bf16/fp16, got ", t.scalar_type());
  }
  return kF32;
}

// Shape / dtype checks shared by the decode and verify launchers.
void check_paged(const char* op, const at::Tensor& query, const at::Tensor& key_cache,
                 const at::Tensor& value_cache, const at::Tensor& block_tables) {
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4 && value_cache.dim() == 4, op,
              ": query [S, H, D], caches [num_blocks, block_size, H_kv, D]");
  const int64_t H = query.size(1), D = query.size(2), HKV = key_cache.size(2);
  TORCH_CHECK(key_cache.sizes() == value_cache.sizes() && key_cache.size(3) == D, op,
              ": key/value caches ", key_cache.sizes(), " / ", value_cache.sizes(),
              " for head_dim ", D);
  TORCH_CHECK(HKV > 0 && H % HKV == 0 && H / HKV <= kMaxGroup, op, ": ", H,
              " query heads over ", HKV, " kv heads (at most ", kMaxGroup, " per kv head)");
  TORCH_CHECK(D % 16 == 0 && D <= kMaxHeadDim, op, ": head_dim ", D,
              " must be a multiple of 16 up to ", kMaxHeadDim);
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (query.scalar_type() == key_cache.scalar_type() ||
                   (query.scalar_type() == at::kFloat &&
                    (key_cache.scalar_type() == at::kHalf ||
                     key_cache.scalar_type() == at::kBFloat16))),
              op, ": the caches must share the query's dtype, or be fp16 / bf16 under an fp32 "
              "query; got ", query.scalar_type(), " over ", key_cache.scalar_type(), " / ",
              value_cache.scalar_type());
  TORCH_CHECK(block_tables.dim() == 2, op, ": block_tables [S, max_blocks]");
}

// Runs the decode tasks for S query rows: row i attends to the first lens[i] tokens of block
// table row (bt_row ? bt_row[i] : i).
at::Tensor run_decode(const char* op, const at::Tensor& query, const at::Tensor& key_cache,
                      const at::Tensor& value_cache, const at::Tensor& bt,
                      const std::vector<int64_t>& lens, const int64_t* bt_row, double scale,
                      int64_t isa, bool bf16_dot) {
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t HKV = key_cache.size(2), BS = key_cache.size(1);
  const int dt = elem_type(query, op), cdt = elem_type(key_cache, op);
  at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
  at::Tensor kc = key_cache.stride(3) == 1 ? key_cache : key_cache.contiguous();
  at::Tensor vc = value_cache.stride(3) == 1 ? value_cache : value_cache.contiguous();
  at::Tensor out = at::empty({S, H, D}, query.options());
  // Tasks: (row, kv head, partition of kDecodePart tokens), so two threads share even one
  // sequence with few kv heads; the split depends only on each row's length.
  std::vector<int64_t> tasks, seq_task0(S);
  int64_t n_multi = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t np = lens[i] <= kDecodePart ? 1 : (lens[i] + kDecodePart - 1) / kDecodePart;
    seq_task0[i] = static_cast<int64_t>(tasks.size() / 3);
    n_multi += np > 1 ? np * HKV : 0;
    for (int64_t h = 0; h < HKV; ++h)
      for (int64_t p = 0; p < np; ++p) tasks.insert(tasks.end(), {i, h, p});
  }
  const int64_t n_tasks = static_cast<int64_t>(tasks.size() / 3);
  at::Tensor partials = at::empty({n_multi ? n_tasks * (H / HKV) * (D + 2) : 0},
                                  query.options().dtype(at::kFloat));
  DecodeArgs a{q.data_ptr(), q.stride(0), q.stride(1), kc.data_ptr(), vc.data_ptr(),
               kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1),
               vc.stride(2), bt.data_ptr<int64_t>(), bt.stride(0), bt_row, lens.data(),
               out.data_ptr(), H, HKV, D, BS, static_cast<float>(scale), dt, cdt, tasks.data(),
               seq_task0.data(), n_multi ? partials.data_ptr<float>() : nullptr};
  const AttnKernels& k = kernels_for(isa);
  const DecodeTaskFn decode = decode_for(isa, bf16_dot);
  // Rows that read one block-table row (a verification's or a short prompt chunk's query
  // rows) run their tasks of one (kv head, partition) back to back on one thread, so the
  // partition's K / V rows come from L1 / L2 for all but the first (each task computes the
  // same bits in any order; partials stay indexed by task).
  std::vector<int64_t> order(n_tasks);
  for (int64_t t = 0; t < n_tasks; ++t) order[t] = t;
  if (bt_row != nullptr)
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      const int64_t *u = &tasks[3 * x], *v = &tasks[3 * y];
      return std::make_tuple(bt_row[u[0]], u[1], u[2]) <
             std::make_tuple(bt_row[v[0]], v[1], v[2]);
    });
  at::parallel_for(0, n_tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) decode(a, order[t], order[t] + 1);
  });
  if (n_multi)
    at::parallel_for(0, S * HKV, 4, [&](int64_t i0, int64_t i1) { k.decode_combine(a, i0, i1); });
  return out;
}

at::Tensor paged_attention_decode(const at::Tensor& query, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t isa,
                                  bool bf16_dot) {
  const char* op = "paged_attention_decode";
  check_paged(op, query, key_cache, value_cache, block_tables);
  const int64_t S = query.size(0), BS = key_cache.size(1);
  TORCH_CHECK(block_tables.size(0) == S && seq_lens.dim() == 1 && seq_lens.size(0) == S, op,
              ": block_tables [S, max_blocks], seq_lens [S]");
  at::Tensor bt = block_tables.to(at::kLong).contiguous();
  at::Tensor sl = seq_lens.to(at::kLong).contiguous();
  const int64_t* slp = sl.data_ptr<int64_t>();
  const int64_t max_blocks = bt.size(1);
  for (int64_t i = 0; i < S; ++i)
    TORCH_CHECK(slp[i] >= 0 && (slp[i] + BS - 1) / BS <= max_blocks, op, ": seq_lens[", i,
                "] = ", slp[i], " exceeds its block table (", max_blocks, " blocks of ", BS, ")");
  return run_decode(op, query, key_cache, value_cache, bt, std::vector<int64_t>(slp, slp + S),
                    nullptr, scale, isa, bf16_dot);
}

// Causal attention of short query chunks (speculative verification, small prefill chunks):
// query row j of sequence i (its q_len_i = query_start_loc[i+1] - query_start_loc[i] new
// tokens are the last of its seq_lens[i]) attends to the first seq_lens[i] - q_len_i + j + 1
// tokens, computed by the decode tasks as a decode step at that position would: the result
// equals paged_attention_decode's for that position bit for bit.
at::Tensor paged_attention_verify(const at::Tensor& query, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache,
                                  const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                                  const at::Tensor& block_tables, double scale, int64_t isa,
                                  bool bf16_dot) {
  const char* op = "paged_attention_verify";
  check_paged(op, query, key_cache, value_cache, block_tables);
  const int64_t T = query.size(0), S = seq_lens.size(0), BS = key_cache.size(1);
  TORCH_CHECK(seq_lens.dim() == 1 && query_start_loc.dim() == 1 &&
                  query_start_loc.size(0) == S + 1 && block_tables.size(0) == S, op,
              ": query_start_loc [S + 1], seq_lens [S], block_tables [S, max_blocks]");
  at::Tensor bt = block_tables.to(at::kLong).contiguous();
  at::Tensor sl = seq_lens.to(at::kLong).contiguous();
  at::Tensor qsl = query_start_loc.to(at::kLong).contiguous();
  const int64_t *slp = sl.data_ptr<int64_t>(), *qp = qsl.data_ptr<int64_t>();
  TORCH_CHECK(qp[0] == 0 && qp[S] == T, op, ": query_start_loc must run from 0 to ", T);
  const int64_t max_blocks = bt.size(1);
  std::vector<int64_t> lens(T), rows(T);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t q_len = qp[i + 1] - qp[i];
    TORCH_CHECK(q_len >= 0 && q_len <= slp[i] && (slp[i] + BS - 1) / BS <= max_blocks, op,
                ": sequence ", i, " has ", q_len, " query tokens of seq_lens ", slp[i],
                " over ", max_blocks, " blocks of ", BS);
    for (int64_t j = 0; j < q_len; ++j) {
      lens[qp[i] + j] = slp[i] - q_len + j + 1;
      rows[qp[i] + j] = i;
    }
  }
  return run_decode(op, query, key_cache, value_cache, bt, lens, rows.data(), scale, isa,
                    bf16_dot);
}

void store_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                    at::Tensor value_cache, const at::Tensor& slot_mapping) {
  const char* op = "store_kv_cache";
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes() && key_cache.dim() == 4 &&
                  value_cache.sizes() == key_cache.sizes(), op,
              ": key/value [T, H_kv, D], caches [num_blocks, block_size, H_kv, D]");
  const int64_t T = key.size(0), HKV = key.size(1), D = key.size(2);
  TORCH_CHECK(key_cache.size(2) == HKV && key_cache.size(3) == D, op, ": key ", key.sizes(),
              " does not fit cache ", key_cache.sizes());
  TORCH_CHECK(key.scalar_type() == value.scalar_type() &&
                  key_cache.scalar_type() == value_cache.scalar_type(), op,
              ": key and value must share a dtype, and so must the caches");
  (void)elem_type(key, op);  // fp32 / bf16 / fp16 only
  (void)elem_type(key_cache, op);
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), op,
              ": caches must be contiguous");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == T, op, ": slot_mapping [T]");
  at::Tensor sm = slot_mapping.to(at::kLong).contiguous();
  // another dtype than the cache's (an fp32 engine's 16-bit cache): rounded to it first, to
  // nearest even, as Tensor.to rounds
  const auto cdt = key_cache.scalar_type();
  at::Tensor k = key.scalar_type() != cdt ? key.to(cdt).contiguous()
                 : key.stride(2) == 1 && key.stride(1) == D ? key : key.contiguous();
  at::Tensor v = value.scalar_type() != cdt ? value.to(cdt).contiguous()
                 : value.stride(2) == 1 && value.stride(1) == D ? value : value.contiguous();
  const int64_t slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* s = sm.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(s[t] >= -1 && s[t] < slots, op, ": slot_mapping[", t, "] = ", s[t],
                " outside the cache's ", slots, " slots");
  const int64_t row = HKV * D * key_cache.element_size();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  const int64_t ks0 = k.stride(0) * k.element_size(), vs0 = v.stride(0) * v.element_size();
  char* kc = static_cast<char*>(key_cache.data_ptr());
  char* vc = static_cast<char*>(value_cache.data_ptr());
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (s[t] < 0) continue;
      std::memcpy(kc + s[t] * row, kp + t * ks0, row);
      std::memcpy(vc + s[t] * row, vp + t * vs0, row);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> norm_impl(const at::Tensor& x,
                                             const c10::optional<at::Tensor>& residual,
                                             const at::Tensor& weight, double eps, int64_t isa,
                                             const char* op) {
  const int64_t H = x.size(-1);
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == H, op, ": x [..., ", H,
              "], weight ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight and x must share a dtype");
  const int dt = elem_type(x, op);
  at::Tensor xc = x.contiguous(), w = weight.contiguous();
  at::Tensor r, ro;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), op,
                ": residual must match x");
    r = residual->contiguous();
    ro = at::empty_like(xc);
  }
  at::Tensor out = at::empty_like(xc);
  NormArgs a{xc.data_ptr(), r.defined() ? r.data_ptr() : nullptr, w.data_ptr(), out.data_ptr(),
             ro.defined() ? ro.data_ptr() : nullptr, H, static_cast<float>(eps), dt};
  const int64_t rows = H ? xc.numel() / H : 0;
  const AttnKernels& k = kernels_for(isa);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, H));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) { k.norm(a, r0, r1); });
  return {out, ro};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t isa) {
  return std::get<0>(norm_impl(x, c10::nullopt, weight, eps, isa, "rms_norm"));
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps,
                                                      int64_t isa) {
  return norm_impl(x, residual, weight, eps, isa, "fused_add_rms_norm");
}

std::tuple<at::Tensor, at::Tensor> apply_rope(const at::Tensor& positions, const at::Tensor& query,
                                              const at::Tensor& key,
                                              const at::Tensor& cos_sin_cache, int64_t isa) {
  const char* op = "apply_rope";
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && key.size(0) == query.size(0) &&
                  key.size(2) == query.size(2), op,
              ": query [T, H, D], key [T, H_kv, D]");
  const int64_t T = query.size(0), D = query.size(2);
  TORCH_CHECK(D % 2 == 0 && cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == D &&
                  cos_sin_cache.scalar_type() == at::kFloat, op,
              ": cos_sin_cache must be fp32 [max_position, ", D, "]");
  TORCH_CHECK(key.scalar_type() == query.scalar_type(), op, ": query and key dtypes differ");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == T, op, ": positions [T]");
  const int dt = elem_type(query, op);
  at::Tensor pos = positions.to(at::kLong).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t max_pos = cos_sin_cache.size(0);
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(p[t] >= 0 && p[t] < max_pos, op, ": position ", p[t], " outside [0, ", max_pos,
                ")");
  at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
  at::Tensor k = key.stride(2) == 1 ? key : key.contiguous();
  at::Tensor cs = cos_sin_cache.contiguous();
  at::Tensor qo = at::empty(query.sizes(), query.options());
  at::Tensor ko = at::empty(key.sizes(), key.options());
  RopeArgs a{p, q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
             qo.data_ptr(), ko.data_ptr(), cs.data_ptr<float>(), query.size(1), key.size(1), D,
             dt};
  const AttnKernels& kr = kernels_for(isa);
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, (query.size(1) + key.size(1)) * D));
  at::parallel_for(0, T, grain, [&](int64_t t0, int64_t t1) { kr.rope(a, t0, t1); });
  return {qo, ko};
}

at::Tensor silu_and_mul(const at::Tensor& x, int64_t isa) {
  const char* op = "silu_and_mul";
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, op, ": x must be [T, 2 * intermediate]");
  const int dt = elem_type(x, op);
  at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const int64_t T = x.size(0), I = x.size(1) / 2;
  at::Tensor out = at::empty({T, I}, x.options());
  SiluArgs a{xc.data_ptr(), xc.stride(0), out.data_ptr(), I, dt};
  const AttnKernels& k = kernels_for(isa);
  // tasks: (row, block of kSiluBlock columns); each element is computed alone, so the split
  // changes no result
  const int64_t nb = (I + kSiluBlock - 1) / kSiluBlock;
  at::parallel_for(0, T * nb, 2, [&](int64_t t0, int64_t t1) { k.silu_mul(a, t0, t1); });
  return out;
}

}  // namespace
}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.def("paged_attention_decode(Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_tables, Tensor seq_lens, float scale, int isa, bool bf16_dot=True) "
        "-> Tensor");
  m.def("paged_attention_verify(Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor query_start_loc, Tensor seq_lens, Tensor block_tables, float scale, int isa, "
        "bool bf16_dot=True) -> Tensor");
  m.def("store_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping) -> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, int isa) -> Tensor");
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, int isa) "
        "-> (Tensor, Tensor)");
  m.def("apply_rope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int isa) "
        "-> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(localchat_cpu, CPU, m) {
  m.impl("paged_attention_decode", &localchat_cpu::paged_attention_decode);
  m.impl("paged_attention_verify", &localchat_cpu::paged_attention_verify);
  m.impl("store_kv_cache", &localchat_cpu::store_kv_cache);
  m.impl("rms_norm", &localchat_cpu::rms_norm);
  m.impl("fused_add_rms_norm", &localchat_cpu::fused_add_rms_norm);
  m.impl("apply_rope", &localchat_cpu::apply_rope);
  m.impl("silu_and_mul", &localchat_cpu::silu_and_mul);
}
