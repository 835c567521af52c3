"""The built wheel holds every module of the tree (the package list is derived in setup.py).

Builds the wheel without build isolation (setuptools and wheel come with the dev extra), so
the test needs no network, then compares the wheel's file list with the repository's
``app/``, ``engine/``, ``kernels/`` and ``themes/`` folders.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"app": "localchat/app", "engine": "localchat/engine", "kernels": "localchat/kernels",
           "themes": "localchat/themes"}


def _tracked_files(suffixes: tuple[str, ...]) -> set[str]:
    """Wheel paths the repository's package folders should produce, e.g.
    ``localchat/engine/quant/int4.py`` for ``engine/quant/int4.py``."""
    out = subprocess.run(["git", "ls-files", *FOLDERS], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    want = set()
    for rel in out:
        if rel.endswith(suffixes):
            top, rest = rel.split("/", 1)
            want.add(f"{FOLDERS[top]}/{rest}")
    return want


def test_wheel_contains_every_module(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("localchat-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = _tracked_files((".py", ".tcss"))
    assert want, "no package files found in the repository"
    missing = sorted(want - names)
    assert not missing, f"modules missing from the wheel: {missing}"


def test_the_kernels_folder_does_not_stand_in_for_the_hub_package() -> None:
    """Started in the repository root (``python -m``, as the CLI tests run it), the root is on
    ``sys.path`` and ``import kernels`` would find this project's ``kernels/`` folder, not the
    PyPI package transformers 5.x imports: transformers' own import then failed and so did
    every GGUF load. The engine's package import puts the installed package in its place."""
    code = ("import sys, localchat.engine, transformers.activations; "
            "m = sys.modules.get('kernels'); print(m.__file__ if m else '')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not proc.stdout.strip().startswith(str(ROOT / "kernels"))
