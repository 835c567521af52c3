"""Each model's recommended sampling, as defaults below the user's own settings.

Layers, lowest first: ``SamplingParams``' built-in defaults, then the model's recommendation,
then the config file, the environment and the command-line flags (the user's settings). The
recommendation comes from the catalog for catalog models (``CatalogEntry.sampling``: the model
card's values, e.g. SmolLM2's temperature 0.2, top-p 0.9), else from ``generation_config.json``
of a Hugging Face folder (transformers' generation defaults the model's authors ship;
``do_sample: false`` means greedy, temperature 0). GGUF files outside the catalog have none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# generation_config.json key -> SamplingParams field
_GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "repetition_penalty": "repetition_penalty"}


def from_generation_config(folder: Path) -> dict[str, Any]:
    """``SamplingParams`` values from ``folder/generation_config.json`` ({} when absent or
    unreadable); values ``SamplingParams`` refuses are left out."""
    try:
        data = json.loads((Path(folder) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if data.get("do_sample") is False:
        return {"temperature": 0.0}
    out = {field: data[key] for key, field in _GENERATION_KEYS.items()
           if isinstance(data.get(key), (int, float)) and not isinstance(data.get(key), bool)}
    return _valid(out)


def recommended_sampling(spec: str, source: Any = None) -> tuple[dict[str, Any], str | None]:
    """The model's recommended sampling and where it comes from (``"catalog smollm2-135m"``,
    ``"generation_config.json of <folder>"``), or ``({}, None)``.

    ``source`` is the resolved ``ModelSource`` when the caller has it; otherwise a catalog
    alias is looked up directly and other specs are resolved from the cache only (never a
    download). Raises nothing.
    """
    from localchat.engine.hub.catalog import resolve_alias

    entry = getattr(source, "catalog_entry", None) or resolve_alias(spec)
    if entry is not None and entry.sampling:
        return _valid(dict(entry.sampling)), f"catalog {entry.alias}"
    if source is None:
        try:
            from localchat.app.settings import cache_dir
            from localchat.engine.hub.resolve import resolve_model

            source = resolve_model(spec, cache_dir=cache_dir(), download=False)
        except Exception:  # noqa: BLE001 - not cached, not a model: no recommendation
            return {}, None
    entry = getattr(source, "catalog_entry", None)
    if entry is not None and entry.sampling:
        return _valid(dict(entry.sampling)), f"catalog {entry.alias}"
    if getattr(source, "format", None) == "hf":
        values = from_generation_config(Path(source.path))
        if values:
            return values, f"generation_config.json of {source.path}"
    return {}, None


def _valid(values: dict[str, Any]) -> dict[str, Any]:
    from localchat.engine.sampling_params import SamplingParams

    out = {}
    for name, value in values.items():
        try:
            SamplingParams(**{name: value})
        except (TypeError, ValueError):
            continue
        out[name] = value
    return out
