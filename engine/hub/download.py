"""Hub snapshots users can trust: only safe files, a disk check first, progress, clear errors.

``hub_snapshot(repo_id, revision)`` returns the local folder of a Hugging Face Hub repo at a
revision, from the standard HF cache when it is complete there, else downloaded with
``huggingface_hub.snapshot_download``. Resuming: files already complete are kept and only the
missing ones are fetched again; a dropped connection resumes the file in progress with an HTTP
``Range`` request; a file is written to a temporary ``blobs/*.incomplete`` and linked into the
snapshot only when whole, so an interrupted download never looks complete (huggingface_hub
2.x names that file per process and deletes it on failure, so the file that a killed process
was fetching restarts from byte 0 on the next run). Only the files in ``HUB_ALLOW_PATTERNS`` are fetched (weights
as safetensors, configs, tokenizer and chat-template files; never pickles or ONNX). Before
fetching, the sizes listed by the Hub are checked against the free space of the cache's disk.
``HF_TOKEN``, ``HF_HUB_OFFLINE``, ``HF_HOME`` and ``HF_ENDPOINT`` are honoured (read by
``huggingface_hub``); the token is never printed: every message passes through ``_redact``.
Every failure is a one-line ``ModelNotFoundError`` or ``ModelDownloadError``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tqdm.std import tqdm as _base_tqdm

from ..errors import ModelDownloadError, ModelNotFoundError

HUB_ALLOW_PATTERNS = [
    "*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "*.tiktoken",
    "chat_template.json", "chat_template.jinja",
]  # fmt: skip
# Mistral repos duplicate the weights as consolidated.safetensors; Llama ones ship original/.
HUB_IGNORE_PATTERNS = ["consolidated*", "original/*"]
# Kept free on the cache's disk beyond the download itself (bytes).
DISK_MARGIN_BYTES = 64 * 2**20

Progress = Callable[[str], None]
_NO_CONFIG = "no config.json (not an HF-format model repo)"
_NO_SAFETENSORS = "no .safetensors weights (localchat never loads pickled weights)"


class NoHFWeightsError(ModelDownloadError):
    """The Hub lists no safetensors for the repo (nothing was fetched): not an HF-format
    repo; ``resolve`` then looks for its GGUF files (``hub_gguf``)."""


def hub_snapshot(repo_id: str, revision: str | None, *, download: bool = True,
                 progress: Progress | None = None) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` (``None``: the default branch).

    From the HF cache when complete there; else, when ``download``, fetched from the Hub after
    a free-disk check, with a byte progress bar (size, rate, ETA) on stderr when ``progress``
    is given (``progress`` also gets one line announcing the download). Raises
    ``ModelNotFoundError`` (no such repo or revision; not cached and not ``download``) or
    ``ModelDownloadError`` (gated, offline with nothing cached, network, disk full, missing
    files; ``NoHFWeightsError``, before any download, when the Hub lists no safetensors).
    """
    name = repo_id + (f"@{revision}" if revision else "")
    try:
        return _snapshot(repo_id, revision, name, local_only=True)
    except (ModelNotFoundError, ModelDownloadError) as err:
        if not download:
            raise
        partial = "partly" in str(err) or "incomplete" in str(err)
    import huggingface_hub

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        what = "only partly downloaded" if partial else "not in the local Hugging Face cache"
        raise ModelDownloadError(
            f"{name} is {what} and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it"
        )
    cache = Path(huggingface_hub.constants.HF_HUB_CACHE)
    with hub_errors(repo_id, revision, name, local_only=False), _quiet_listing():
        files = huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS,
            ignore_patterns=HUB_IGNORE_PATTERNS, dry_run=True, tqdm_class=SilentProgress,
        )
    names = {f.filename for f in files}
    if not any(n.endswith(".safetensors") for n in names):  # fetch nothing of a GGUF repo
        raise NoHFWeightsError(f"{name} is incomplete: " + (
            _NO_SAFETENSORS if "config.json" in names else _NO_CONFIG))
    todo = [f for f in files if f.will_download]
    need = sum(f.file_size or 0 for f in todo)
    with fetching(name, f"{len(todo)} files", need, cache, progress) as bar:
        return _snapshot(repo_id, revision, name, local_only=False, tqdm_class=bar)


@contextlib.contextmanager
def fetching(name: str, what: str, size: int, cache: Path, progress: Progress | None):
    """The start of a Hub download of ``what`` (``size`` bytes) into ``cache``: the free-disk
    check, the announcing line to ``progress`` (when given), then, inside, the tqdm class
    for ``snapshot_download`` (a byte bar on stderr when ``progress`` is given; Ctrl+C
    cancels it within a chunk). Raises ``ModelDownloadError`` when the disk is too full."""
    check_free_disk(cache, size, name)
    if progress is not None:
        progress(f"downloading {name} from the Hugging Face Hub: {what}, {_size(size)} "
                 f"into {cache}")
    cancel = threading.Event()
    with _cancel_on_sigint(cancel):
        yield _progress_class(name, cancel, shown=progress is not None)


def check_free_disk(folder: Path, need_bytes: int, name: str) -> None:
    """Raise ``ModelDownloadError`` when the disk holding ``folder`` (or its nearest existing
    parent) has less than ``need_bytes + DISK_MARGIN_BYTES`` free."""
    probe = Path(folder)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need_bytes + DISK_MARGIN_BYTES:
        raise ModelDownloadError(
            f"not enough disk space for {name}: it needs {_size(need_bytes)} and "
            f"{_size(DISK_MARGIN_BYTES)} kept free, but {probe} has {_size(free)} free; free "
            "some space or point HF_HOME at a larger disk"
        )


def missing_files(folder: Path) -> str | None:
    """Why an HF snapshot folder is unusable (no config, no or missing safetensors), or None."""
    if not (folder / "config.json").is_file():
        return _NO_CONFIG
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return "unreadable model.safetensors.index.json"
        absent = sorted(s for s in shards if not (folder / s).is_file())
        if absent:
            return "missing " + ", ".join(absent)
    elif not any(folder.glob("*.safetensors")):
        return _NO_SAFETENSORS
    return None


# -- helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_listing():
    """huggingface_hub's own warning of a listing that matches none of our patterns ("No
    files matched ...", a GGUF-only repo) kept off stderr: what to say is ours to decide."""
    import logging

    log = logging.getLogger("huggingface_hub._snapshot_download")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _snapshot(repo_id: str, revision: str | None, name: str, *, local_only: bool,
              tqdm_class=None) -> Path:
    import huggingface_hub

    with hub_errors(repo_id, revision, name, local_only=local_only):
        folder = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=HUB_ALLOW_PATTERNS,
            ignore_patterns=HUB_IGNORE_PATTERNS,
            local_files_only=local_only,
            **({"tqdm_class": tqdm_class} if tqdm_class is not None else {}),
        )
    path = Path(folder)
    missing = missing_files(path)
    if missing:
        error = ModelNotFoundError if local_only else ModelDownloadError
        raise error(f"{name} is incomplete: {missing}")
    return path


@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None, name: str, *, local_only: bool):
    """Map ``huggingface_hub`` and HTTP client exceptions to one-line localchat errors."""
    try:
        yield
    except Exception as exc:
        ours = _translate(exc, repo_id, revision, name, local_only)
        if ours is None:
            raise
        raise ours from None


def _translate(exc: BaseException, repo_id: str, revision: str | None, name: str,
               local_only: bool) -> Exception | None:
    """Our error for a Hub/HTTP exception, or ``None`` (a bug: keep the traceback)."""
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.DryRunError) and exc.__cause__ is not None:
        # the file list could not be fetched: the cause says why (gated, missing, offline)
        return _translate(exc.__cause__, repo_id, revision, name, local_only)
    if isinstance(exc, hf.GatedRepoError):
        return ModelDownloadError(
            f"{repo_id} is gated on the Hugging Face Hub: accept the terms on the model page "
            f"(https://huggingface.co/{repo_id}) and set HF_TOKEN to a token of that account"
            + (" (the HF_TOKEN set has no access yet)" if _token() else "")
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return ModelNotFoundError(
            f"no Hugging Face Hub repo {repo_id} (or it is private: set HF_TOKEN); "
            "run `localchat models` to list the aliases"
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return ModelNotFoundError(f"{repo_id} has no revision {revision!r}")
    if isinstance(exc, hf.HFValidationError):
        return ModelNotFoundError(f"{name!r} is not a valid Hub repo id")
    if isinstance(exc, hf.LocalEntryNotFoundError):
        # IncompleteSnapshotError (a partial download in the cache) is one of these.
        if local_only:
            partial = isinstance(exc, getattr(hf, "IncompleteSnapshotError", ()))
            what = "only partly downloaded" if partial else "not in the local Hugging Face cache"
            return ModelNotFoundError(f"{name} is {what}; run `localchat pull {name}`")
        return _network_error(name, exc.__cause__ or exc)
    if isinstance(exc, hf.HfHubHTTPError):
        return ModelDownloadError(f"cannot download {name}: {_redact(exc)}")
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return ModelDownloadError(
                f"disk full while downloading {name}; free some space and run "
                f"`localchat pull {name}` again (files already complete are kept)"
            )
        if isinstance(exc, ConnectionError):
            return _network_error(name, exc)
        return ModelDownloadError(f"cannot download {name}: {_redact(exc)}")
    if type(exc).__module__.split(".")[0] in {"httpx", "httpx2", "requests", "urllib3"}:
        return _network_error(name, exc)  # connection errors of the HTTP client
    return None


def _network_error(name: str, exc: BaseException | None) -> ModelDownloadError:
    import huggingface_hub

    if isinstance(exc, huggingface_hub.errors.OfflineModeIsEnabled):
        return ModelDownloadError(f"{name} is not cached and HF_HUB_OFFLINE is set")
    endpoint = huggingface_hub.constants.ENDPOINT
    return ModelDownloadError(
        f"cannot reach the Hugging Face Hub ({endpoint}) to download {name}, and it is not "
        f"cached: check the network connection ({_redact(exc) if exc else 'no response'})"
    )


def _token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - a broken token file must not hide the real error
        return os.environ.get("HF_TOKEN") or None


def _redact(exc: BaseException | str) -> str:
    """One line of at most 200 characters, with any Hugging Face token replaced by ``***``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for secret in {_token(), os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")}:
        if secret:
            text = text.replace(secret, "***")
    return text[:200]


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class DownloadCancelled(Exception):
    """Raised inside huggingface_hub's download threads after Ctrl+C (see ``_progress_class``)."""


class SilentProgress(_base_tqdm):
    """A tqdm class that prints nothing (``snapshot_download(tqdm_class=...)`` for the dry run
    and other small fetches)."""

    def __init__(self, *args, **kwargs):
        kwargs.pop("name", None)
        super().__init__(*args, **{**kwargs, "disable": True})


@contextlib.contextmanager
def _cancel_on_sigint(cancel: threading.Event):
    """While downloading, Ctrl+C sets ``cancel`` before raising ``KeyboardInterrupt``.

    ``snapshot_download`` fetches files in a thread pool and, on the way out, waits for every
    queued file; the worker threads check ``cancel`` on each chunk (through the progress bar)
    and stop, so an interrupted pull exits within a chunk (10 MiB) instead of finishing the
    whole repo. Only in the main thread (signal handlers live there); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        cancel.set()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress_class(name: str, cancel: threading.Event, *, shown: bool) -> type[_base_tqdm]:
    """A tqdm class for ``snapshot_download``: one bar on stderr for the bytes written (done /
    total, rate, ETA) when ``shown``; the file-count and transfer bars stay hidden. On a
    terminal it redraws in place; elsewhere it prints a line at most every 10 s. Every update
    raises ``DownloadCancelled`` once ``cancel`` is set (the download threads stop)."""
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())

    class ByteProgress(_base_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            desc = str(kwargs.get("desc") or "")
            byte_bar = kwargs.get("unit") == "B" and not desc.startswith("Downloading bytes")
            kwargs.update(
                desc=f"localchat: {name}", file=sys.stderr, disable=not (shown and byte_bar),
                mininterval=0.5 if tty else 10.0, dynamic_ncols=tty, ascii=not tty,
                bar_format="{desc}: {n_fmt}B / {total_fmt}B ({percentage:3.0f}%) "
                           "{rate_fmt}, ETA {remaining}",
            )
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if cancel.is_set():
                raise DownloadCancelled("interrupted")
            return super().update(n)

        def set_description(self, desc=None, refresh=True):  # keep our label
            pass

        def set_description_str(self, desc=None, refresh=True):
            pass

    return ByteProgress
