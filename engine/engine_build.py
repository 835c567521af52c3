"""Building an ``LLMEngine`` from a model path, and sizing its KV pool.

``build_engine`` is ``LLMEngine.from_path``'s body: the context length (capped on CPU), the
memory planner's weight format for ``--quant auto`` (target and draft planned together), the
tokenizer, the target and draft weights, and on CUDA both KV pools planned once every weight is
loaded. ``plan_num_blocks`` is the KV pool an engine gets when nothing set ``cache.num_blocks``.
Reference design: vLLM's engine construction (``LLMEngine.from_engine_args``) and its KV-cache
profiling, here planned from the footprint model instead of a profiling run.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from .config import EngineConfig, ModelConfig
from .loader import is_gguf, load_model, load_model_config
from .memory.footprint import kv_bytes
from .outputs import float_format
from .quant.schemes import auto_fp32_takes_a8
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# On CPU the KV pool may take at most this fraction of available RAM.
_CPU_KV_RAM_FRACTION = 0.25
_CPU_DEFAULT_MAX_MODEL_LEN = 8192

_E = TypeVar("_E", bound="LLMEngine")

__all__ = ["build_engine", "loaded_weight_format", "plan_num_blocks", "resolve_auto_quant"]


def resolve_auto_quant(path, model_config: ModelConfig, config: EngineConfig,
                       max_model_len: int, cache_dir) -> tuple[EngineConfig, int]:
    """``config`` with ``quant.scheme`` set by the memory planner, and the context it allows
    (the target and, when set, the draft planned together)."""
    from .loader import default_group_size
    from .memory.auto import choose_scheme

    draft = config.speculative.draft_model if config.speculative.method == "draft_model" \
        else None
    draft_config = load_model_config(Path(draft), cache_dir) if draft else None
    from .loader.native import gguf_native_bytes, native_is_fast

    device = config.resolved_device()
    scheme, plan = choose_scheme(
        model_config, device, max_model_len, draft=draft_config,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        kv_cache_dtype=config.cache.kv_cache_dtype,
        int4_group_size=default_group_size(Path(path), None),
        native_bytes=gguf_native_bytes(path, model_config, device, config.resolved_dtype(),
                                       cache_dir)
        if is_gguf(Path(path)) and native_is_fast(path, device, cache_dir)
        else None,
        draft_native_bytes=gguf_native_bytes(draft, draft_config, device,
                                             config.resolved_dtype(),
                                             cache_dir) if draft else None)
    if plan.note:
        logger.warning(plan.note)
    quant = dataclasses.replace(config.quant, scheme=scheme)
    return dataclasses.replace(config, quant=quant), min(max_model_len, plan.context_len)


def build_engine(cls: type[_E], path: Path, config: EngineConfig | None = None, *,
                 cache_dir: Path | None = None) -> _E:
    """Load an HF folder or a ``.gguf`` file into a ``cls`` (``LLMEngine`` or a subclass).

    See ``LLMEngine.from_path`` (its public face) for the arguments and the errors raised.
    """
    config = config or EngineConfig()
    device, dtype = config.resolved_device(), config.resolved_dtype()
    if Path(path).is_dir():  # say what an incomplete folder lacks, before any loading
        from .loader.checks import check_model_folder

        check_model_folder(Path(path))
    model_config = load_model_config(path, cache_dir)
    max_model_len = config.scheduler.max_model_len or model_config.max_position_embeddings
    if device.type == "cpu" and config.scheduler.max_model_len is None:
        max_model_len = min(max_model_len, _CPU_DEFAULT_MAX_MODEL_LEN)
    if config.quant.scheme == "auto":
        config, max_model_len = resolve_auto_quant(path, model_config, config,
                                                   max_model_len, cache_dir)
    tokenizer = Tokenizer.from_pretrained(Path(path), cache_dir=cache_dir)
    model = load_model(path, model_config, dtype=dtype, device=device,
                       max_position=max_model_len, cache_dir=cache_dir,
                       quant=config.quant, progress=config.quant.progress,
                       a8_fp32=auto_fp32_takes_a8(device, config.dtype, dtype))
    draft = config.speculative.draft_model
    draft_model = draft_config = None
    if draft is not None and config.speculative.method == "draft_model":
        from .spec_decode.speculator import Speculator

        draft_model, draft_config = Speculator.load_draft_model(
            Path(draft), model_config, config, max_model_len, cache_dir=cache_dir)
    if device.type == "cuda" and config.cache.num_blocks is None \
            and config.cache.kv_cache_memory_bytes is None:
        # Every weight is loaded, nothing else allocated: plan both KV pools, the
        # activations and the graph pool together (memory/kv_pools.py).
        from .memory.kv_pools import plan_cuda_pools

        config, _ = plan_cuda_pools(model, model_config, draft_model, draft_config,
                                    config, max_model_len)
    engine = cls(model, model_config, tokenizer, config, max_model_len,
                 model_name=Path(path).name)
    if draft_model is not None:
        engine.speculator = Speculator.build(
            draft_model, draft_config, model_config, config,
            engine.num_blocks * config.cache.block_size, engine.max_model_len)
    elif config.speculative.method == "ngram":
        from .spec_decode.speculator import Speculator

        engine.speculator = Speculator.build_ngram(model_config, config, engine.max_model_len)
    return engine


def plan_num_blocks(config: EngineConfig, model_config: ModelConfig, device: torch.device,
                    kv_dtype: torch.dtype, max_model_len: int) -> int:
    """KV blocks for one full context (``max_model_len`` tokens) shared by every running
    sequence, as the memory planner counts it (``localchat plan``'s default of one sequence;
    llama.cpp's ``n_ctx``): ``max_num_seqs`` bounds concurrency, not the pool, and requests
    that outgrow the pool together are preempted and recomputed. Capped by a memory budget
    (``kv_cache_memory_bytes``, else on CUDA 90% of free memory, on CPU 25% of available
    RAM). ``build_engine`` on CUDA plans instead (``memory.kv_pools.plan_cuda_pools``: with the
    draft, the measured activations and the graph pool) and passes ``cache.num_blocks``.
    A budget below one full context caps ``max_model_len`` (see ``LLMEngine.__init__``) unless
    the user set ``max_model_len``, which then sizes the pool for one sequence.

    Returns the number of blocks of ``config.cache.block_size`` tokens (at least 1): enough
    for ``max_model_len`` tokens, rounded up to a whole block, when the context fits.
    """
    block_size = config.cache.block_size
    budget = config.cache.kv_cache_memory_bytes
    if budget is None:
        if device.type == "cuda":
            budget = int(torch.cuda.mem_get_info(device)[0] * 0.9)
        else:
            from .memory.budget import available_memory_bytes

            budget = int(available_memory_bytes("cpu") * _CPU_KV_RAM_FRACTION)
    tokens = min(max_model_len, budget // kv_bytes(model_config, 1, kv_dtype))
    if config.scheduler.max_model_len is not None:
        tokens = max(tokens, max_model_len)
    if tokens >= max_model_len:
        # Whole blocks covering the context (a context of 100 tokens takes 7 blocks of 16):
        # rounding down left a sequence without slots for its last tokens.
        return -(-max_model_len // block_size)
    return max(1, tokens // block_size)


def loaded_weight_format(model, dtype: torch.dtype) -> tuple[str, int | None]:
    """The loaded model's weight format (its ``quant_scheme``, set by ``load_model``; else the
    float format of ``dtype``) and the group size of its group-wise layers (None if none)."""
    scheme = getattr(model, "quant_scheme", None)
    if scheme is None or not scheme.is_quantized:
        return float_format(dtype), None
    group = next((m.quant_method.group_size for m in model.modules()
                  if hasattr(getattr(m, "quant_method", None), "group_size")), None)
    return str(scheme.value), group
