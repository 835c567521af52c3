"""One GGUF file from any Hugging Face Hub repo (``org/name:Q4_K_M``, a file's URL).

What Ollama's ``hf.co/org/name:Q4_K_M`` and llama.cpp's ``-hf org/name:Q4_K_M`` give: a quant
tag is matched against the repo's ``.gguf`` file names (case-insensitive, as a whole token:
``Q4_K`` does not pick ``Q4_K_M``), a path ending in ``.gguf`` names the file exactly, and a
plain ``org/name`` whose repo holds GGUF files but no safetensors takes its ``Q4_K_M`` file.
Multimodal projectors (``mmproj*``) are never picked; split GGUF files are refused (the loader
reads one file). Only the chosen file is downloaded, into the standard HF cache, through
``download.py``'s machinery (free-disk check, progress, Ctrl+C, one-line errors, resume); a
cached file resolves without the network.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from ..errors import ModelDownloadError, ModelNotFoundError
from .download import fetching, hub_errors
from .resolve import GgufSpec

DEFAULT_TAG = "Q4_K_M"  # what a plain spec takes, as Ollama does
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})$", re.IGNORECASE)
# A quant label in a file name: Q4_K_M, IQ2_XXS, Q8_0, UD-Q4_K_XL, F16, BF16, MXFP4_MOE ...
_QUANT_RE = re.compile(r"(?:^|(?<=[-._/]))((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]{1,3})*|B?F16|F32|FP16|"
                       r"FP32|MXFP4(?:_MOE)?))(?=$|[-._/])", re.IGNORECASE)
_SHOWN = 12  # tags or files named in one error line


def tag_matches(tag: str, path: str) -> bool:
    """Whether quant ``tag`` names the GGUF file ``path``: a case-insensitive occurrence in the
    path (less ``.gguf``) bounded by its start or one of ``-._/`` before, and by its end or one
    of ``-./`` after, or by ``_`` unless a short quant suffix follows (``Q4_K`` is not in
    ``x-Q4_K_M.gguf``; ``Q4_K_M`` is in ``x-Q4_K_M_imatrix.gguf``). Raises nothing."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    for m in re.finditer(re.escape(tag), stem, re.IGNORECASE):
        start, end = m.span()
        if start and stem[start - 1] not in "-._/":
            continue
        rest = stem[end:]
        if not rest or rest[0] in "-./":
            return True
        if rest[0] == "_" and not re.match(r"_[A-Za-z0-9]{1,3}(?:$|[-._/])", rest):
            return True
    return False


def quant_label(path: str) -> str | None:
    """The quant label of a GGUF file name, upper-cased (``model.q4_k_m.gguf`` -> ``Q4_K_M``),
    or ``None``. Raises nothing."""
    stem = _SPLIT_RE.sub("", path[:-5] if path.lower().endswith(".gguf") else path)
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


def model_ggufs(paths) -> list[str]:
    """The ``.gguf`` files of a repo listing that can be models (no ``mmproj*``), sorted."""
    return sorted(p for p in paths if p.lower().endswith(".gguf")
                  and not p.rsplit("/", 1)[-1].lower().startswith("mmproj"))


def is_split(path: str) -> bool:
    """Whether ``path`` is one part of a split GGUF (``*-00001-of-00003.gguf``; a file of one
    part, ``-00001-of-00001``, is whole)."""
    m = _SPLIT_RE.search(path[:-5])
    return m is not None and int(m.group(2)) > 1


def choose(spec: GgufSpec, paths) -> str:
    """The file of ``paths`` (a repo listing) that ``spec`` names.

    Raises ``ModelNotFoundError`` with one line: no GGUF file at all, no match (naming the
    tags there are), several matches (naming them; asks for the path form), a split GGUF,
    or a named ``mmproj`` file.
    """
    paths = list(paths)
    ggufs = model_ggufs(paths)
    if spec.file is not None:
        if spec.file in ggufs:
            return _single(spec, [spec.file])
        if spec.file in paths and spec.file.rsplit("/", 1)[-1].lower().startswith("mmproj"):
            raise ModelNotFoundError(f"{spec.name} is a multimodal projector (mmproj), not a "
                                     "model" + _offer(spec, ggufs, "; "))
        raise ModelNotFoundError(f"{spec.repo_name} has no file {spec.file}"
                                 + _offer(spec, ggufs, "; "))
    if not ggufs:
        raise ModelNotFoundError(f"{spec.repo_name} holds no GGUF model file (':{spec.tag}' "
                                 f"names one); for an HF-format repo give {spec.repo_name} alone")
    tag = spec.tag or DEFAULT_TAG
    matches = [p for p in ggufs if tag_matches(tag, p)]
    if not matches:
        if spec.tag is None:
            raise ModelNotFoundError(f"{spec.repo_name} holds GGUF files, none of them "
                                     f"{DEFAULT_TAG}" + _offer(spec, ggufs, "; "))
        raise ModelNotFoundError(f"{spec.repo_name} has no {tag} GGUF file"
                                 + _offer(spec, ggufs, "; "))
    return _single(spec, matches)


def _single(spec: GgufSpec, matches: list[str]) -> str:
    """The one file of ``matches``, or ``ModelNotFoundError`` (split, several)."""
    whole = [p for p in matches if not is_split(p)]
    if len(whole) == 1 and len(matches) == 1:
        return whole[0]
    if not whole:
        first = matches[0]
        parts = int(_SPLIT_RE.search(first[:-5]).group(2))
        raise ModelNotFoundError(
            f"{spec.name} is a split GGUF file ({first}, {parts} parts): split GGUF files are "
            "not supported yet; join the parts into one file (llama-gguf-split --merge) and "
            "give its path")
    listed = _listed(whole + [p for p in matches if p not in whole])
    raise ModelNotFoundError(f"{spec.name} matches several GGUF files ({listed}); name one "
                             f"by its path: {spec.repo_name}:{whole[0]}")


def _offer(spec: GgufSpec, ggufs: list[str], sep: str) -> str:
    """``"; name one: org/name:Q8_0 (or Q4_0, F16)"`` for the GGUF files there are."""
    tags: list[str] = []
    for path in ggufs:
        tag = quant_label(path) or path
        if tag not in tags:
            tags.append(tag)
    if not tags:
        return ""
    more = f" (or {_listed(tags[1:])})" if len(tags) > 1 else ""
    return f"{sep}name one: {spec.repo_name}:{tags[0]}{more}"


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f", ... ({len(items)} in all)" if len(items) > _SHOWN else "")


# -- resolving -------------------------------------------------------------------------------


def cached_gguf(spec: GgufSpec, *, download: bool) -> Path | None:
    """The cached file ``spec`` names, from the HF cache alone (no network), or ``None``.

    The repo listing is the one the HF cache keeps for the cached commit (written by
    ``snapshot_download``), else the snapshot folder's files. A plain spec (no tag, no file)
    gives ``None`` for a repo that holds safetensors (an HF-format repo). Raises
    ``ModelNotFoundError`` only when ``download`` is false and the kept listing (an exact one)
    shows that ``spec`` names no single file (as ``choose``).
    """
    snap = _cached_snapshot(spec.repo_id, spec.revision)
    if snap is None:
        return None
    folder, listing, exact = snap
    plain = spec.tag is None and spec.file is None
    if plain and (not model_ggufs(listing) or any(p.endswith(".safetensors") for p in listing)):
        return None
    try:
        path = choose(spec, listing)
    except ModelNotFoundError:
        if exact and not download:
            raise
        return None
    target = folder / path
    return target if target.is_file() else None


def hub_gguf(spec: GgufSpec, *, download: bool = True, progress=None,
             not_hf: ModelDownloadError | None = None) -> Path:
    """The local path of the GGUF file ``spec`` names: from the HF cache when there, else
    (``download``) the repo's file list is fetched, one file chosen (``choose``) and only that
    file downloaded into the HF cache, after a free-disk check, with a progress line and byte
    bar on stderr when ``progress`` is given. ``not_hf``: the error of a plain spec's HF-format
    attempt, raised again when the repo holds no GGUF file either.

    Raises ``ModelNotFoundError`` (no such repo, revision or file; no single match, a split
    GGUF; not cached and not ``download``) or ``ModelDownloadError`` (gated, offline with
    nothing cached, network, disk full).
    """
    cached = cached_gguf(spec, download=download)
    if cached is not None:
        return cached
    if not download:
        raise ModelNotFoundError(f"{spec.name} is not downloaded yet; run "
                                 f"`localchat pull {spec.name}`")
    import huggingface_hub
    from huggingface_hub import constants

    name = spec.name
    if constants.HF_HUB_OFFLINE:
        raise ModelDownloadError(f"{name} is not in the local Hugging Face cache and "
                                 "HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it")
    files = _remote_files(spec)
    if not_hf is not None and not model_ggufs(files):
        raise not_hf
    path = choose(spec, files)
    size = files[path] or 0
    cache = Path(constants.HF_HUB_CACHE)
    with fetching(name, path, size, cache, progress) as bar, \
            hub_errors(spec.repo_id, spec.revision, name, local_only=False):
        folder = huggingface_hub.snapshot_download(
            spec.repo_id, revision=spec.revision, allow_patterns=[glob.escape(path)],
            tqdm_class=bar)
    target = Path(folder) / path
    if not target.is_file():  # the branch moved between the listing and the download
        raise ModelDownloadError(f"{name}: {path} is gone from the Hub's latest revision; "
                                 f"run `localchat pull {name}` again")
    return target


def _remote_files(spec: GgufSpec) -> dict[str, int | None]:
    """``{path: bytes}`` of every file of the repo at the revision: the commit first (one
    call that fails at once when the Hub is unreachable; ``list_repo_tree`` retries for ~20 s),
    then its listing."""
    from huggingface_hub import HfApi

    with hub_errors(spec.repo_id, spec.revision, spec.repo_name, local_only=False):
        api = HfApi()
        commit = api.repo_info(spec.repo_id, revision=spec.revision or "main").sha
        entries = list(api.list_repo_tree(spec.repo_id, revision=commit, recursive=True))
    return {e.path: getattr(e, "size", None) for e in entries if hasattr(e, "size")}


def _cached_snapshot(repo_id: str, revision: str | None
                     ) -> tuple[Path, list[str], bool] | None:
    """(snapshot folder, repo listing, whether the listing is the Hub's whole one) of the
    cached commit of ``repo_id`` at ``revision``, or ``None`` when none is cached."""
    import huggingface_hub
    from huggingface_hub import constants

    storage = Path(constants.HF_HUB_CACHE) / (
        "models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        commit = rev
    else:
        try:
            commit = (storage / "refs" / rev).read_text().strip()
        except (OSError, ValueError):
            return None
    folder = storage / "snapshots" / commit
    if not commit or not folder.is_dir():
        return None
    try:  # the listing snapshot_download keeps (huggingface_hub >= 2.4)
        listing = [f.path for f in huggingface_hub.get_cached_repo_tree(repo_id, revision=commit)]
        return folder, listing, True
    except Exception:  # noqa: BLE001 - an older huggingface_hub or none kept: the folder's
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        return folder, files, False
