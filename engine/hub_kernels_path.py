"""Keep this repository's ``kernels/`` folder from standing in for the Hub's ``kernels``
package.

transformers (5.x) depends on the PyPI package ``kernels`` and imports it as soon as it is
installed (``transformers.integrations.hub_kernels``, at ``import transformers.activations``).
In a source checkout, this project's ``kernels/`` folder (installed as ``localchat.kernels``)
sits at the repository root; when that root is on ``sys.path`` (``python -m ...`` or ``python
-c`` started there, pytest's rootdir insertion), ``import kernels`` finds the folder instead of
the package, transformers' ``from kernels import CUDAProperties`` fails, and every GGUF load,
tokenizer and config read fails with it. Installed wheels never see the folder.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import PathFinder
from pathlib import Path

_KERNELS_FOLDER = Path(__file__).resolve().parents[1] / "kernels"


def unshadow_hub_kernels() -> None:
    """If ``import kernels`` would import this checkout's ``kernels/`` folder, import the
    installed ``kernels`` package into ``sys.modules`` instead, found on ``sys.path`` without
    the repository root. No-op when ``kernels`` is already imported, is not shadowed, or is
    not installed (transformers then sees no package version and leaves it alone)."""
    if "kernels" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("kernels")
    except (ImportError, ValueError):
        return
    if spec is None or spec.origin is None:
        return
    if Path(spec.origin).resolve().parent != _KERNELS_FOLDER:
        return
    root = _KERNELS_FOLDER.parent
    path = [p for p in sys.path if _resolved(p) != root]
    real = PathFinder.find_spec("kernels", path)
    if real is None or real.loader is None:
        return
    module = importlib.util.module_from_spec(real)
    sys.modules["kernels"] = module
    try:
        real.loader.exec_module(module)
    except Exception:  # a broken install: transformers reports it as it would anyway
        del sys.modules["kernels"]


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except OSError:
        return None
