"""The CPU decoder stack: a decode or verification step's layers in one C++ call.

A CPU step of at most ``kernels.CPU_MAX_ROWS`` rows spends a large share of its time in the
host's per-layer work: some 14 Python-level calls per layer (norms, the linear methods' checks,
views, RoPE, the KV store, attention), each a few microseconds of interpreter and dispatch.
SmolLM2-135M's 30 layers cost about as much host time as its weights' reads
(``scripts/bench_host.py``). :class:`CpuDecoderStack` describes the model once to
``torch.classes.localchat_cpu.DecoderStack`` (``kernels/cpu/stack_ops.cpp``), which then runs
every layer in C++ calling the same ops with the same arguments as the Python layers
(``LlamaDecoderLayer.forward``), so the hidden states are the same bits. Each linear layer's
calls come from its method's ``decode_plan``.

The stack is used only where every piece would take the C++ kernels in Python too: CPU
tensors, the C++ kernels built, fp32/bf16/fp16 activations with norm weights and KV cache of
that dtype, an fp32 RoPE table, ``head_dim`` a multiple of 16 up to 256, at most 16 query heads
per KV head, no per-head q/k norm (Qwen3), every linear with a ``decode_plan``; and per step:
decode-only, or query chunks with ``max_query_len`` given (verification, short prompts).
``LOCALCHAT_CPU_STACK=0`` turns it off. Reference design: vLLM's CPU model runner and
llama.cpp's per-model graphs (own code).
"""

from __future__ import annotations

import torch

from localchat import kernels

from ..attention_metadata import AttentionMetadata

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _linear(stack, layer, dtype) -> int | None:
    """Describe ``layer`` to ``stack``; its id, or None when it has no decode plan."""
    plan = layer.quant_method.decode_plan(layer, dtype)
    if plan is None:
        return None
    parts, bias = plan
    lid = stack.begin_linear(bias)
    for name, args in parts:
        pattern, tensors, ints, floats = "", [], [], []
        for a in args:
            if a is kernels.INPUT:
                pattern += "x"
            elif a is None:
                pattern += "n"
            elif isinstance(a, torch.Tensor):
                pattern += "t"
                tensors.append(a)
            elif isinstance(a, bool):
                pattern += "b"
                ints.append(int(a))
            elif isinstance(a, int):
                pattern += "i"
                ints.append(a)
            elif isinstance(a, float):
                pattern += "f"
                floats.append(a)
            else:
                return None
        stack.add_part(lid, name, pattern, tensors, ints, floats)
    return lid


class CpuDecoderStack:
    """Builds and caches the C++ stacks of one ``LlamaModel``, one per key (the KV pool, the
    activation dtype, the ISA level, the integer-dot switch): an automatically fp32 engine
    alternates two, integer-dot decode steps and exact prompt steps (``LLMEngine.step``)."""

    MAX_STACKS = 2

    def __init__(self) -> None:
        self._stacks: dict[tuple, object] = {}
        self._key: tuple | None = None  # the last step's key and stack (None: not built)
        self._stack = None

    def get(self, model, hidden: torch.Tensor, kv_caches, attn_metadata: AttentionMetadata):
        """The stack for this step, or None where the Python layers must run it."""
        if not (hidden.is_cpu and hidden.dim() == 2 and hidden.shape[0] <= kernels.CPU_MAX_ROWS
                and kernels.cpu_stack_enabled()):
            return None
        if not attn_metadata.is_decode_only and attn_metadata.max_query_len is None:
            return None
        cpu = kernels._cpu()
        if cpu is None or kernels._kernels_env() == "triton" or not kv_caches:
            return None
        dtype, isa = hidden.dtype, cpu.active_isa()
        key = (kv_caches[0].data_ptr(), tuple(kv_caches[0].shape), len(kv_caches), dtype, isa,
               kernels.cpu_a8_enabled(dtype), cpu.int4_a8_isa())
        if key not in self._stacks:
            if len(self._stacks) >= self.MAX_STACKS:
                self._stacks.clear()  # e.g. a new KV pool: the old stacks point at the old one
            self._stacks[key] = self._build(model, dtype, kv_caches, isa)
        self._key, self._stack = key, self._stacks[key]
        return self._stack

    @staticmethod
    def _build(model, dtype: torch.dtype, kv_caches, isa: int):
        if dtype not in _FLOATS or len(kv_caches) != len(model.layers) \
                or not hasattr(torch.classes.localchat_cpu, "DecoderStack"):
            return None
        first = model.layers[0].self_attn
        h, kvh, d = first.num_heads, first.num_kv_heads, first.head_dim
        if first.qk_norm or d % 16 or d > 256 or h % kvh or h // kvh > 16:
            return None
        eps = model.layers[0].input_layernorm.eps
        stack = torch.classes.localchat_cpu.DecoderStack(h, kvh, d, float(first.attn.scale),
                                                         float(eps), isa)
        for layer, kv in zip(model.layers, kv_caches):
            attn = layer.self_attn
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            rope = attn.rotary_emb.cos_sin_cache
            if any(n.eps != eps or n.weight.dtype != dtype or n.weight.dim() != 1
                   for n in norms) or attn.qk_norm or attn.attn.scale != first.attn.scale \
                    or rope.dtype != torch.float32 or not kernels.kv_readable(dtype, kv.dtype) \
                    or not kv.is_contiguous() or kv.dim() != 5 or kv.shape[3] != kvh:
                return None
            ids = [_linear(stack, lin, dtype) for lin in (
                attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
            if None in ids:
                return None
            stack.add_layer(norms[0].weight, ids[0], ids[1], norms[1].weight, ids[2], ids[3],
                            rope, kv)
        return stack
