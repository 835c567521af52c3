"""localchat.engine: the inference engine (control plane and model code). Entry point:
``localchat.engine.llm_engine.LLMEngine``."""

from .hub_kernels_path import unshadow_hub_kernels

# Before any module of the engine imports transformers (see hub_kernels_path).
unshadow_hub_kernels()
