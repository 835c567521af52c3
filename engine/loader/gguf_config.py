"""transformers' config of a GGUF file, built from a one-pass header read.

``AutoConfig.from_pretrained(folder, gguf_file=...)`` parses the file with ``gguf.GGUFReader``
(11-14 s for a Qwen2.5 file with its 151k-token vocabulary on this project's 2-core CPU), and
``AutoTokenizer`` does it again to learn the model type. For the architectures the engine runs
(:data:`FAST_ARCHITECTURES`) this module builds the same config dictionary from
``gguf_header.read_gguf_header`` (0.1-0.3 s) with transformers' own key tables
(``GGUF_TO_TRANSFORMERS_MAPPING``), following the rules of transformers'
``load_gguf_checkpoint`` for these architectures (the architecture rename to ``mistral``, tied
embeddings when the file has no ``output.weight``, the vocabulary size from the token list when
the file gives none), and hands it to the config class's ``from_dict``. Any other
architecture returns ``None`` and the caller keeps transformers' own path. The test
``tests/engine/loader/test_gguf_header.py`` checks the result against ``AutoConfig`` on the
bundled models.
"""

from __future__ import annotations

from typing import Any

from .gguf_header import GGUFHeader

# the GGUF architectures whose conversion is checked against transformers' (the engine's
# Llama / Mistral, Qwen2 and Qwen3 models)
FAST_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})


def model_type_of(header: GGUFHeader) -> str:
    """The transformers ``model_type`` of the file: its architecture, or ``mistral`` for a
    ``llama`` file whose ``general.name`` is ``mistral`` (transformers' rule)."""
    arch = header.architecture
    if "llama" in arch and header.metadata.get("general.name") == "mistral":
        return "mistral"
    return arch


def hf_config_dict(header: GGUFHeader) -> dict[str, Any] | None:
    """The config dictionary transformers derives from this GGUF's metadata, or ``None``
    when the architecture is not one of :data:`FAST_ARCHITECTURES`."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    arch = header.architecture
    if arch not in FAST_ARCHITECTURES:
        return None
    updated = model_type_of(header)
    mapping = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    config: dict[str, Any] = {
        "tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors),
    }
    for key, value in header.metadata.items():
        key = key.replace(arch, updated)
        prefix, _, rest = key.partition(".")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]  # transformers unwraps one-element values
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, updated)
        renamed = mapping.get(prefix, {}).get(rest, -1)
        if renamed not in (-1, None):
            config[renamed] = value
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in header.metadata:
        config["vocab_size"] = len(header.metadata["tokenizer.ggml.tokens"])
    return config


def hf_config_from_header(header: GGUFHeader):
    """A transformers ``PretrainedConfig`` for this GGUF (see the module docstring), or
    ``None`` for an architecture this module does not convert."""
    config = hf_config_dict(header)
    if config is None:
        return None
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[config["model_type"]].from_dict(config)
