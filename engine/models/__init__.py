"""Model definitions and the registry keyed by HF architecture name."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..errors import UnsupportedArchitectureError
from .llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(config: ModelConfig) -> type[nn.Module]:
    """The class for ``config.architecture``.

    Raises ``UnsupportedArchitectureError`` naming the architecture and the supported ones.
    """
    try:
        return MODEL_REGISTRY[config.architecture]
    except KeyError:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise UnsupportedArchitectureError(
            f"unsupported model architecture {config.architecture or '(none)'!r}; "
            f"supported: {supported}"
        ) from None


__all__ = [
    "MODEL_REGISTRY",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "get_model_class",
]
