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

import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


class HubKernelsFinder:
    """A ``sys.meta_path`` finder for the top-level name ``kernels`` alone: the spec the
    ``sys.path`` entries other than the repository root give (the installed package), else
    None (the usual finders then run). Finding imports nothing, so the package (and the
    ``huggingface_hub`` and ``tqdm`` it imports) loads only when something imports it."""

    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if fullname != "kernels":
            return None
        return PathFinder.find_spec(fullname, [p for p in sys.path if _resolved(p) != _ROOT])


def unshadow_hub_kernels() -> None:
    """Put ``HubKernelsFinder`` first on ``sys.meta_path`` (once). Without an installed
    ``kernels`` package nothing changes: transformers then finds no package version and leaves
    the name alone."""
    if not any(f is HubKernelsFinder for f in sys.meta_path):
        sys.meta_path.insert(0, HubKernelsFinder)


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except OSError:
        return None
