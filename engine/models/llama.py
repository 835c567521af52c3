"""Llama-family decoder (Llama 2/3/3.1/3.2, SmolLM2, Mistral, Qwen2, Qwen3).

One definition covers the four HF architectures; they differ only in flags read from
``ModelConfig``: Qwen2 has a bias on q/k/v, Qwen3 RMS-normalizes q and k per head before RoPE,
Llama 3.x scales RoPE frequencies. Projections are fused (``qkv_proj``, ``gate_up_proj``);
``load_weights`` maps HF parameter names onto them. Inside the decoder stack submodules are
called through ``.forward`` directly: ``nn.Module.__call__``'s hook machinery costs about a
microsecond per call, some 300 calls per SmolLM2 step, and no module of the engine carries
hooks (register one on the top-level model if you need one). For the same reason the model's
parameters, buffers and submodules are mirrored into instance attributes
(``layers/module_attrs.py``): each ``self.<submodule>`` read would otherwise cost a failed
lookup plus ``nn.Module.__getattr__``, some 640 reads per step. On CPU, forwards of up to 16
rows skip the Python layers altogether: ``cpu_stack.py`` runs the same ops from C++. Reference design: transformers'
``modeling_llama.py`` / ``modeling_qwen3.py`` and vLLM's ``llama.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from localchat import kernels

from ..attention_metadata import AttentionMetadata
from ..config import ModelConfig
from ..layers import greedy_head
from ..layers.attention import Attention
from ..layers.embedding import VocabEmbedding
from ..layers.linear import Linear, MergedLinear, QKVLinear
from ..layers.module_attrs import mirror_module_attributes
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from ..sampler import row_argmax
from .cpu_stack import CpuDecoderStack


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int) -> None:
        super().__init__()
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.head_dim = config.head_dim
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.qkv_proj = QKVLinear(
            config.hidden_size, config.q_size, config.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(config.q_size, config.hidden_size)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, max_position, config.rope_theta, config.rope_scaling
        )
        self.attn = Attention(
            config.num_heads, config.num_kv_heads, config.head_dim, config.head_dim**-0.5
        )
        self.qkv_split = [config.num_heads, config.num_kv_heads, config.num_kv_heads]

    def forward(self, positions, hidden_states, kv_cache, attn_metadata):
        num_tokens = hidden_states.shape[0]
        qkv = self.qkv_proj.forward(hidden_states)
        # One view to [tokens, heads, head_dim] and one split over the heads: q, k, v come
        # out already in the attention layer's shapes (no reshape per tensor).
        # (``split_with_sizes``: ``Tensor.split`` is a Python wrapper around it.)
        q, k, v = qkv.view(num_tokens, -1, self.head_dim).split_with_sizes(
            self.qkv_split, dim=1)
        if self.qk_norm:
            q = self.q_norm.forward(q)
            k = self.k_norm.forward(k)
        q, k = self.rotary_emb.forward(positions, q, k)
        out = self.attn.forward(q, k, v, kv_cache, attn_metadata)
        return self.o_proj.forward(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [config.intermediate_size] * 2)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(kernels.silu_and_mul(self.gate_up_proj.forward(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, max_position)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, kv_cache, attn_metadata):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm.forward(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm.forward(hidden_states, residual)
        hidden_states = self.self_attn.forward(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm.forward(hidden_states, residual)
        return self.mlp.forward(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, max_position) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.cpu_stack = CpuDecoderStack()

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        # a quantized embedding dequantizes its rows to fp32; activations follow the norms
        hidden_states = self.embed_tokens.forward(input_ids)
        if hidden_states.dtype != self.norm.weight.dtype:  # a no-op .to() still costs an op
            hidden_states = hidden_states.to(self.norm.weight.dtype)
        stack = self.cpu_stack.get(self, hidden_states, kv_caches, attn_metadata)
        if stack is not None:  # CPU decode / verification rows: the same ops, called from C++
            meta = attn_metadata
            hidden_states, residual = stack.forward(
                hidden_states, positions, meta.slot_mapping, meta.block_tables, meta.seq_lens,
                None if meta.is_decode_only else meta.query_start_loc)
        else:
            residual = None
            for layer, kv_cache in zip(self.layers, kv_caches):
                hidden_states, residual = layer.forward(
                    positions, hidden_states, residual, kv_cache, attn_metadata
                )
        hidden_states, _ = self.norm.forward(hidden_states, residual)
        return hidden_states

    def forward_groups(self, batches, kv_caches) -> list[torch.Tensor]:
        """:meth:`forward` of several batches, ``(input_ids, positions, attn_metadata)``
        each (on the CPU: a step's prompt chunks of more than ``kernels.CPU_MAX_ROWS`` rows,
        which take the Python layers), one layer at a time: layer i of every batch, then
        layer i + 1, each weight dequantized once for all of them
        (``cpu_prefill.shared_dequantization``) instead of once per batch. Each batch gets
        the bits its own ``forward`` gives: the same ops on its own rows, only their order
        among the batches changes. Returns the batches' final hidden states, in order."""
        from ..quant.cpu_prefill import shared_dequantization

        states = []
        for input_ids, _, _ in batches:
            hidden_states = self.embed_tokens.forward(input_ids)
            if hidden_states.dtype != self.norm.weight.dtype:
                hidden_states = hidden_states.to(self.norm.weight.dtype)
            states.append((hidden_states, None))
        for layer, kv_cache in zip(self.layers, kv_caches):
            with shared_dequantization():
                states = [layer.forward(positions, hidden, residual, kv_cache, meta)
                          for (hidden, residual), (_, positions, meta) in zip(states, batches)]
        return [self.norm.forward(hidden, residual)[0] for hidden, residual in states]


# HF name fragment -> (our fused parameter fragment, shard id)
_STACKED = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)


def _two_pass_head(head: nn.Module, hidden_states: torch.Tensor) -> bool:
    """Whether the output layer ``head`` is quantized and its CPU rows of fp32 activations
    take the integer-dot kernels (the engine's ``a8_fp32`` mode): ``compute_logits`` then
    runs two passes, ``greedy_token_ids`` one (``layers/greedy_head.py``)."""
    return head.weight is None and hidden_states.is_cpu \
        and kernels.cpu_a8_enabled(torch.float32)


class LlamaForCausalLM(nn.Module):
    """Causal LM head over ``LlamaModel``.

    ``forward(input_ids [num_tokens] int64, positions [num_tokens] int64, kv_caches
    (list per layer of [2, num_blocks, block_size, num_kv_heads, head_dim]), attn_metadata)``
    returns hidden states ``[num_tokens, hidden_size]``; ``compute_logits(hidden [n, hidden])``
    returns fp32 logits ``[n, vocab_size]`` (call it only on rows that are sampled).
    ``max_position`` sizes the RoPE table (tokens).
    """

    def __init__(self, config: ModelConfig, max_position: int | None = None) -> None:
        super().__init__()
        self.config = config
        max_position = max_position or config.max_position_embeddings
        self.model = LlamaModel(config, max_position)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size)
        # Parameters, buffers and submodules read as instance attributes (no
        # ``nn.Module.__getattr__`` per read: layers/module_attrs.py); loaders that replace
        # them later (materialize, process_weights_after_loading) stay visible.
        mirror_module_attributes(self)

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def forward_groups(self, batches, kv_caches) -> list[torch.Tensor]:
        """``LlamaModel.forward_groups``: several batches' hidden states, one layer at a
        time, each weight dequantized once."""
        return self.model.forward_groups(batches, kv_caches)

    def compute_logits(self, hidden_states: torch.Tensor, draft: bool = False,
                       vocab_size: int | None = None) -> torch.Tensor:
        """Logits ``[n, vocab_size]`` fp32 of ``hidden_states [n, hidden_size]`` (the model's
        dtype). ``draft=True`` (a speculative decoder's draft model, whose logits only choose
        which tokens the target verifies): where the quantized CPU output layer would take
        :func:`localchat.kernels.a8_two_pass` it takes one integer-dot pass, logits within
        ~1.0 instead of ~0.005 of the exact kernel's, for a 1-row call instead of a 2-row
        one. ``vocab_size`` (a draft's vocabulary, ``spec_decode.proposer``): only the output
        layer's first ``vocab_size`` rows are computed (``LinearMethod.apply_prefix``), the
        other logits are -inf."""
        # tied: the embedding matrix doubles as the output layer
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        method = head.quant_method
        n = head.out_features
        if vocab_size is not None and vocab_size < n:
            n = vocab_size

            def apply(layer, x):
                return method.apply_prefix(layer, x, vocab_size)
        else:
            apply = method.apply
        if head.weight is None and hidden_states.is_cpu \
                and hidden_states.dtype != torch.float32:
            # a quantized CPU output layer: fp32 logits straight from its integer-dot kernel,
            # never rounded to bf16 (kernels.a8_fp32)
            with kernels.a8_fp32():
                logits = apply(head, hidden_states.float())
        elif not draft and _two_pass_head(head, hidden_states):
            # fp32 hidden states where the engine decodes through the integer-dot kernels
            # (LLMEngine.a8_fp32): logits within ~0.005 of the exact kernel's. One int8
            # rounding of the activations here moves them by 0.1-1.0 and flips near-ties
            # (SmolLM2's first answer token); the exact kernel costs ~2.5x a 1-row call
            logits = kernels.a8_two_pass(lambda x: apply(head, x), hidden_states)
        else:
            logits = apply(head, hidden_states)
        logits = logits if logits.dtype == torch.float32 else logits.float()
        if n < head.out_features:
            logits = F.pad(logits, (0, head.out_features - n), value=float("-inf"))
        return logits

    def greedy_token_ids(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[n]`` int64: the argmax of each row's logits (``hidden_states [n, hidden_size]``),
        the lower id on ties. Where :meth:`compute_logits` would take the two integer-dot
        passes (a quantized CPU output layer with fp32 activations) and the layer carries its
        error bound, one pass and an exact rescoring of the few tokens the bound admits
        (``layers/greedy_head.py``): the argmax of the exact logits, the output layer's time
        cut by about a third. Otherwise the argmax of :meth:`compute_logits`."""
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        if hidden_states.dtype == torch.float32 and _two_pass_head(head, hidden_states) \
                and greedy_head.has_bound(head):
            return greedy_head.greedy_token_ids(head, hidden_states)
        return row_argmax(self.compute_logits(hidden_states))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into the fused parameters.

        Returns the set of our parameter names that were loaded. Unknown names (rotary
        inv_freq buffers, ``lm_head`` of a tied model) are ignored.

        Raises ``ValueError`` on a shape mismatch.
        """
        modules = dict(self.named_modules())
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            for hf_frag, ours, shard in _STACKED:
                if hf_frag in name:
                    target = name.replace(hf_frag, ours)
                    module_name, _, pname = target.rpartition(".")
                    modules[module_name].load_shard(pname, tensor, shard)
                    loaded.add(f"{target}:{shard}")
                    break
            else:
                if name not in params:
                    continue
                param = params[name]
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                        f"model {tuple(param.shape)}"
                    )
                param.data.copy_(tensor)
                loaded.add(name)
        return loaded

    @staticmethod
    def weight_target(hf_name: str) -> tuple[str, str, str | int | None]:
        """``(module name, parameter name, shard id)`` an HF tensor loads into (shard
        ``None`` for unfused parameters), e.g. ``model.layers.0.self_attn.q_proj.weight`` ->
        ``("model.layers.0.self_attn.qkv_proj", "weight", "q")``."""
        for hf_frag, ours, shard in _STACKED:
            if hf_frag in hf_name:
                module, _, pname = hf_name.replace(hf_frag, ours).rpartition(".")
                return module, pname, shard
        module, _, pname = hf_name.rpartition(".")
        return module, pname, None

    def expected_weights(self) -> set[str]:
        """Names ``load_weights`` must report for a complete checkpoint."""
        names: set[str] = set()
        for name, param in self.named_parameters():
            if ".qkv_proj." in name:
                names |= {f"{name}:{s}" for s in ("q", "k", "v")}
            elif ".gate_up_proj." in name:
                names |= {f"{name}:{s}" for s in (0, 1)}
            else:
                names.add(name)
        return names


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: the Llama layout (sliding-window attention is not used by v0.3)."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: Llama layout with a bias on q/k/v (``config.attention_bias``)."""


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: Llama layout with per-head RMSNorm on q and k (``config.qk_norm``)."""
