"""Frozen, validated engine configuration.

``ModelConfig`` is the engine's view of a checkpoint's ``config.json`` (or of GGUF metadata,
which transformers converts to the same ``PretrainedConfig``). ``CacheConfig`` and
``SchedulerConfig`` size the paged KV cache and the step budget; ``EngineConfig`` bundles them
with the device and dtype. Vocabulary follows vLLM (``num_kv_heads``, ``block_size``,
``max_num_batched_tokens``, ``max_num_seqs``, ``max_model_len``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a device or dtype is resolved, not to read configs
    import torch


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of a decoder-only transformer.

    Built with :meth:`from_hf_config` from a transformers ``PretrainedConfig``. Sizes are
    counts (heads, layers, tokens); ``rope_scaling`` is the HF dict (``rope_type`` "llama3",
    "linear", ...) or ``None``.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict[str, Any] | None = None
    hidden_act: str = "silu"
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r} (only silu)")

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ModelConfig:
        """Convert a transformers ``PretrainedConfig`` (Llama, Mistral, Qwen2 or Qwen3).

        Raises ``ValueError`` when a required field is missing or inconsistent.
        """
        archs = getattr(hf_config, "architectures", None) or []
        arch = archs[0] if archs else _ARCH_FROM_MODEL_TYPE.get(hf_config.model_type, "")
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
        rope_scaling = getattr(hf_config, "rope_scaling", None)
        rope_theta = getattr(hf_config, "rope_theta", None)
        rope_params = getattr(hf_config, "rope_parameters", None)
        if rope_params:  # transformers >= 5 moves rope settings into rope_parameters
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = dict(rope_params)
        if rope_scaling is not None and rope_scaling.get("rope_type",
                                                         rope_scaling.get("type")) == "default":
            rope_scaling = None
        return cls(
            architecture=arch,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_hidden_layers=hf_config.num_hidden_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            max_position_embeddings=getattr(hf_config, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(hf_config, "attention_bias", False))
            or arch == "Qwen2ForCausalLM",
            qk_norm=arch == "Qwen3ForCausalLM",
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            hidden_act=getattr(hf_config, "hidden_act", "silu"),
            sliding_window=getattr(hf_config, "sliding_window", None)
            if getattr(hf_config, "use_sliding_window", True) else None,
        )


_ARCH_FROM_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache geometry.

    ``block_size`` is tokens per block; ``num_blocks`` is the pool size (``None``: sized from
    ``kv_cache_memory_bytes`` or the device's memory at engine start).
    ``enable_prefix_caching`` reuses cached full blocks of earlier requests with the same
    token prefix (``KVCacheManager.get_computed_blocks``). ``kv_cache_dtype`` (one of
    :data:`KV_CACHE_DTYPES`) is the cache's element type: ``"auto"`` is the model's dtype,
    except fp16 under an fp32 CPU engine (as llama.cpp's default f16 cache: half the bytes,
    faster decode attention over long contexts); an explicit 16-bit type under fp32
    activations is taken on CPU only (``EngineConfig.resolved_kv_dtype``).
    """

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")


# CacheConfig.kv_cache_dtype's values
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets: at most ``max_num_seqs`` sequences and ``max_num_batched_tokens``
    tokens per model forward; ``max_model_len`` caps prompt + output tokens per request
    (``None``: the model's ``max_position_embeddings``, capped at 8192 on CPU).

    ``batch_invariant`` (CPU engines): each request's tokens get the bits they get alone,
    whatever else is batched (decode rows and prompt tokens in separate steps, prompt chunks
    never cut for another request, a step of more than 16 rows run as forwards that each
    compute what their requests would alone: ``Scheduler``, ``ModelRunner.step_groups``).
    Off, a step mixes everything in one forward, as vLLM does: more throughput for prompts
    that arrive together (``scripts/bench_burst.py``: 8 prompts of 40 tokens on
    Qwen2.5-Coder-1.5B, 2 threads, their first tokens in 2.3 s instead of 3.8 s), replies
    that may change with the batch."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    batch_invariant: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")


# Weight formats ``QuantConfig.scheme`` accepts (``quant.schemes.QuantScheme`` plus "auto").
# "auto" is resolved by the memory planner in LLMEngine.from_path (engine/memory/auto.py);
# resolve_scheme, used by load_model, treats it as the unquantized format.
SCHEME_NAMES = ("auto", "native", "none", "fp8", "int8", "int4")


@dataclass(frozen=True)
class QuantConfig:
    """Weight format: ``scheme`` is "auto" | "none" | "int8" | "int4" | "fp8" (see
    ``engine/quant``; "auto" is the memory planner's choice, made in ``LLMEngine.from_path``;
    ``load_model`` alone treats it as "none"). ``group_size`` is int4's group along the input
    dim (weights per scale): ``None`` picks 32 for GGUF checkpoints (their weights are stored
    in 32-weight blocks, so a 4-bit source re-quantized on the same blocks is reproduced
    exactly) and 128 otherwise (``engine/quant/int4.py``). ``use_cache`` keeps quantized
    weights in the user cache so later loads skip quantizing. ``progress`` prints a one-line
    counter on stderr while a first load repacks a GGUF (``loader/native.py``; the CLI sets it
    when stderr is a terminal). ``background_write``: a first load hands the cache entry to a
    thread that writes it while the model answers (``quant.cache.save_quantized``; the CLI
    sets it; the interpreter waits for the write at exit); off, the load returns after it.

    Raises ``ValueError`` for an unknown scheme or a group size other than 32, 64 or 128.
    """

    scheme: str = "auto"
    group_size: int | None = None
    use_cache: bool = True
    progress: bool = False
    background_write: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEME_NAMES:
            raise ValueError(
                f"unknown quantization {self.scheme!r} (choose from {', '.join(SCHEME_NAMES)})"
            )
        if self.group_size not in (None, 32, 64, 128):
            raise ValueError(f"group_size must be 32, 64 or 128, got {self.group_size}")


SPEC_METHODS = ("draft_model", "ngram")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: ``method`` ``"draft_model"`` drafts with the model at
    ``draft_model`` (its local path, an HF folder or ``.gguf``; ``None`` turns speculation
    off), ``"ngram"`` by prompt lookup (``spec_decode.ngram``: no draft model;
    ``draft_model`` unused); ``num_speculative_tokens`` the most draft tokens per step (k),
    ``adaptive`` lets each request's k follow its acceptance rate and the measured step costs
    (``spec_decode.adaptive``); ``draft_vocab_size`` (tokens, or None: all) the draft
    model's vocabulary, its output layer's first rows: BPE token ids run in merge order,
    roughly by frequency, so the first 65,536 of Qwen2.5's 151,936 hold 98-99% of the tokens
    of code and English text while the draft's output layer reads 43% of its bytes (a third
    of the 0.5B draft's step); a token past it is never drafted and the target supplies it
    (after FR-Spec, Zhao et al. 2025, frequency-ranked draft vocabularies).

    Raises ``ValueError`` when ``num_speculative_tokens`` is not in [1, 16], ``method`` is
    not one of :data:`SPEC_METHODS` or ``draft_vocab_size`` is not positive.
    """

    draft_model: str | None = None
    num_speculative_tokens: int = 4
    adaptive: bool = True
    method: str = "draft_model"
    draft_vocab_size: int | None = 65536

    def __post_init__(self) -> None:
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be between 1 and 16, got "
                             f"{self.num_speculative_tokens}")
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPEC_METHODS)}, "
                             f"got {self.method!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be positive, got {self.draft_vocab_size}")

    @property
    def enabled(self) -> bool:
        """Whether requests are drafted for at all."""
        return self.method == "ngram" or self.draft_model is not None


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``LLMEngine`` needs besides the model files.

    ``dtype`` of ``None`` picks the unquantized format: bfloat16 on CUDA and on CPUs with
    native bf16 arithmetic (AVX-512 BF16 / AMX), float32 on other CPUs. ``quant`` picks the
    weight format (``QuantConfig``).
    """

    device: str | None = None
    dtype: torch.dtype | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    seed: int = 0

    def resolved_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        from .quant.schemes import default_float_dtype

        return default_float_dtype(self.resolved_device())

    def resolved_kv_dtype(self) -> torch.dtype:
        """The KV cache's element type (``CacheConfig.kv_cache_dtype``; see
        :func:`kv_cache_dtype`). Raises ``ValueError`` for a type the attention kernels do
        not read under this engine's activations."""
        return kv_cache_dtype(self.cache.kv_cache_dtype, self.resolved_device().type,
                              self.resolved_dtype())


def kv_cache_dtype(setting: str, device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for ``setting`` (:data:`KV_CACHE_DTYPES`) on a
    ``device_type`` engine computing in ``dtype``: ``"auto"`` is ``dtype``, except fp16 under
    fp32 on CPU; an explicit type is taken when it is ``dtype`` or, on CPU under fp32, fp16 or
    bf16 (the C++ decode attention widens them to fp32; ``store_kv_cache`` rounds the new K/V
    to them, to nearest even). Raises ``ValueError`` otherwise (the message names the
    setting and why)."""
    import torch

    cpu_fp32 = device_type == "cpu" and dtype == torch.float32
    if setting == "auto":
        return torch.float16 if cpu_fp32 else dtype
    chosen = getattr(torch, setting)
    if chosen == dtype or (cpu_fp32 and chosen in (torch.float16, torch.bfloat16)):
        return chosen
    raise ValueError(f"kv_cache_dtype {setting} needs a CPU engine computing in float32 (or "
                     f"that dtype itself); this one computes in {str(dtype).split('.')[-1]} "
                     f"on {device_type}")
