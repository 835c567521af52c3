"""localchat.engine: the inference engine (control plane and model code). Entry point:
``localchat.engine.llm_engine.LLMEngine``."""
