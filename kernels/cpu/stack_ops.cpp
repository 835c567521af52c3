// The CPU decoder stack for decode and verification steps: one call runs every layer of a
// Llama-family model (RMSNorm, fused QKV projection, RoPE, KV store, paged attention, output
// projection, fused residual-add + RMSNorm, gate/up, SiLU x up, down) over at most 16 query
// rows, calling the same localchat_cpu ops with the same arguments as the Python layers do
// (engine/models/llama.py), so its output equals theirs bit for bit. What it removes is the
// host's part of a step: some 14 Python-level calls per layer, each a few microseconds of
// interpreter and dispatch (SmolLM2: about 5 ms of a 20 ms step on a 2 GHz core).
//
// Linear layers are opaque here: the Python side describes each one as a list of parts,
// each part an op of namespace localchat_cpu and its argument list with the input's slot
// marked (``pattern``: x input, t tensor, n None, i int, b bool, f float), the parts'
// outputs concatenated on the last dim (sharded layers), then an optional bias added.
// Reference design: the per-layer plans of llama.cpp's graph and vLLM's CPU model runner
// (own code).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace localchat_cpu {
namespace {

c10::OperatorHandle op_handle(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(("localchat_cpu::" + name).c_str(),
                                                        "");
}

struct LinearPart {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // args[x_slot] is replaced by the input per call
  int64_t x_slot;
};

struct StackLinear {
  std::vector<LinearPart> parts;
  c10::optional<at::Tensor> bias;
};

struct StackLayer {
  at::Tensor input_norm, post_norm, cos_sin_cache, key_cache, value_cache;
  int64_t qkv, o, gate_up, down;
};

using NormFn = at::Tensor(const at::Tensor&, const at::Tensor&, double, int64_t);
using AddNormFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                     const at::Tensor&, double, int64_t);
using RopeFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const at::Tensor&, int64_t);
using StoreFn = void(const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor,
                     const at::Tensor&);
using DecodeFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, double, int64_t, bool);
using VerifyFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                            int64_t, bool);
using SiluFn = at::Tensor(const at::Tensor&, int64_t);

}  // namespace

// One model's decoder stack (torch.classes.localchat_cpu.DecoderStack). Built once per model
// and KV pool by localchat.engine.models.cpu_stack; holds references to the model's tensors.
struct DecoderStack : torch::CustomClassHolder {
  int64_t num_heads, num_kv_heads, head_dim, isa;
  double scale, eps;
  std::vector<StackLinear> linears;
  std::vector<StackLayer> layers;
  c10::TypedOperatorHandle<NormFn> rms_norm_op;
  c10::TypedOperatorHandle<AddNormFn> add_norm_op;
  c10::TypedOperatorHandle<RopeFn> rope_op;
  c10::TypedOperatorHandle<StoreFn> store_op;
  c10::TypedOperatorHandle<DecodeFn> decode_op;
  c10::TypedOperatorHandle<VerifyFn> verify_op;
  c10::TypedOperatorHandle<SiluFn> silu_op;

  DecoderStack(int64_t num_heads_, int64_t num_kv_heads_, int64_t head_dim_, double scale_,
               double eps_, int64_t isa_)
      : num_heads(num_heads_), num_kv_heads(num_kv_heads_), head_dim(head_dim_), isa(isa_),
        scale(scale_), eps(eps_),
        rms_norm_op(op_handle("rms_norm").typed<NormFn>()),
        add_norm_op(op_handle("fused_add_rms_norm").typed<AddNormFn>()),
        rope_op(op_handle("apply_rope").typed<RopeFn>()),
        store_op(op_handle("store_kv_cache").typed<StoreFn>()),
        decode_op(op_handle("paged_attention_decode").typed<DecodeFn>()),
        verify_op(op_handle("paged_attention_verify").typed<VerifyFn>()),
        silu_op(op_handle("silu_and_mul").typed<SiluFn>()) {
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 &&
                    head_dim > 0,
                "DecoderStack: bad head counts");
  }

  // Start a new linear layer; returns its id.
  int64_t begin_linear(c10::optional<at::Tensor> bias) {
    linears.push_back(StackLinear{{}, std::move(bias)});
    return static_cast<int64_t>(linears.size()) - 1;
  }

  // Append a part (one op call) to linear ``id``.
  void add_part(int64_t id, const std::string& op, const std::string& pattern,
                std::vector<c10::optional<at::Tensor>> tensors, std::vector<int64_t> ints,
                std::vector<double> floats) {
    TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(linears.size()),
                "DecoderStack.add_part: no linear ", id);
    LinearPart part{op_handle(op), {}, -1};
    size_t ti = 0, ii = 0, fi = 0;
    for (size_t s = 0; s < pattern.size(); ++s) {
      switch (pattern[s]) {
        case 'x': part.x_slot = static_cast<int64_t>(s); part.args.emplace_back(); break;
        case 't':
          TORCH_CHECK(ti < tensors.size(), "DecoderStack.add_part: too few tensors");
          part.args.emplace_back(tensors[ti++]);
          break;
        case 'n': part.args.emplace_back(); break;
        case 'i':
          TORCH_CHECK(ii < ints.size(), "DecoderStack.add_part: too few ints");
          part.args.emplace_back(ints[ii++]);
          break;
        case 'b':
          TORCH_CHECK(ii < ints.size(), "DecoderStack.add_part: too few ints");
          part.args.emplace_back(ints[ii++] != 0);
          break;
        case 'f':
          TORCH_CHECK(fi < floats.size(), "DecoderStack.add_part: too few floats");
          part.args.emplace_back(floats[fi++]);
          break;
        default: TORCH_CHECK(false, "DecoderStack.add_part: bad pattern ", pattern);
      }
    }
    TORCH_CHECK(part.x_slot >= 0, "DecoderStack.add_part: the pattern has no input slot");
    TORCH_CHECK(ti == tensors.size() && ii == ints.size() && fi == floats.size(),
                "DecoderStack.add_part: arguments left over for ", pattern);
    linears[id].parts.push_back(std::move(part));
  }

  void add_layer(at::Tensor input_norm, int64_t qkv, int64_t o, at::Tensor post_norm,
                 int64_t gate_up, int64_t down, at::Tensor cos_sin_cache, at::Tensor kv_cache) {
    const auto n = static_cast<int64_t>(linears.size());
    for (int64_t id : {qkv, o, gate_up, down})
      TORCH_CHECK(id >= 0 && id < n && !linears[id].parts.empty(),
                  "DecoderStack.add_layer: linear ", id, " is empty");
    TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2,
                "DecoderStack.add_layer: kv_cache [2, num_blocks, block_size, H_kv, D]");
    layers.push_back(StackLayer{input_norm, post_norm, cos_sin_cache, kv_cache.select(0, 0),
                                kv_cache.select(0, 1), qkv, o, gate_up, down});
  }

  at::Tensor linear(int64_t id, const at::Tensor& x) const {
    const StackLinear& l = linears[id];
    std::vector<at::Tensor> outs;
    outs.reserve(l.parts.size());
    for (const LinearPart& p : l.parts) {
      std::vector<c10::IValue> stack = p.args;
      stack[p.x_slot] = x;
      p.op.callBoxed(&stack);
      outs.push_back(stack[0].toTensor());
    }
    at::Tensor y = outs.size() == 1 ? outs[0] : at::cat(outs, -1);
    if (l.bias.has_value()) y.add_(*l.bias);
    return y;
  }

  // hidden [T, hidden] (T <= 16), positions [T] int64, slot_mapping [T], block_tables
  // [S, max_blocks], seq_lens [S]; query_start_loc [S + 1] for verification (T > S), None
  // for decode (one row per sequence). Returns (hidden, residual) before the final norm.
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor hidden, at::Tensor positions,
                                             at::Tensor slot_mapping, at::Tensor block_tables,
                                             at::Tensor seq_lens,
                                             c10::optional<at::Tensor> query_start_loc) const {
    TORCH_CHECK(!layers.empty(), "DecoderStack.forward: no layers");
    const int64_t T = hidden.size(0);
    at::Tensor residual;
    for (size_t i = 0; i < layers.size(); ++i) {
      const StackLayer& L = layers[i];
      if (i == 0) {
        residual = hidden;
        hidden = rms_norm_op.call(hidden, L.input_norm, eps, isa);
      } else {
        std::tie(hidden, residual) = add_norm_op.call(hidden, residual, L.input_norm, eps, isa);
      }
      at::Tensor qkv = linear(L.qkv, hidden);
      auto qkv_split = qkv.view({T, -1, head_dim})
                           .split_with_sizes({num_heads, num_kv_heads, num_kv_heads}, 1);
      at::Tensor q, k;
      std::tie(q, k) = rope_op.call(positions, qkv_split[0], qkv_split[1], L.cos_sin_cache, isa);
      store_op.call(k, qkv_split[2], L.key_cache, L.value_cache, slot_mapping);
      at::Tensor attn = query_start_loc.has_value()
          ? verify_op.call(q, L.key_cache, L.value_cache, *query_start_loc, seq_lens,
                           block_tables, scale, isa, true)
          : decode_op.call(q, L.key_cache, L.value_cache, block_tables, seq_lens, scale, isa,
                           true);
      at::Tensor h = linear(L.o, attn.reshape({T, num_heads * head_dim}));
      std::tie(hidden, residual) = add_norm_op.call(h, residual, L.post_norm, eps, isa);
      hidden = linear(L.down, silu_op.call(linear(L.gate_up, hidden), isa));
    }
    return {hidden, residual};
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
};

}  // namespace localchat_cpu

TORCH_LIBRARY_FRAGMENT(localchat_cpu, m) {
  m.class_<localchat_cpu::DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, double, double, int64_t>())
      .def("begin_linear", &localchat_cpu::DecoderStack::begin_linear)
      .def("add_part", &localchat_cpu::DecoderStack::add_part)
      .def("add_layer", &localchat_cpu::DecoderStack::add_layer)
      .def("forward", &localchat_cpu::DecoderStack::forward)
      .def("num_layers", &localchat_cpu::DecoderStack::num_layers);
}
