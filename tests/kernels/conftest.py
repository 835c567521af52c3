"""Kernel tests: run the Triton kernels in Triton's CPU interpreter when there is no GPU.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a kernel (and again at some
launch-time checks), so the Triton modules are imported here with the variable set, and an
autouse fixture sets it again around each test in this folder; the process environment is
restored afterwards, so other test folders never see it. On a CUDA machine nothing is set and
the kernels run natively. Without Triton the ``test_triton_*`` modules skip
(``pytest.importorskip``).

The interpreter computes ``tl.dot`` with ``np.matmul``; numpy's bundled multi-threaded OpenBLAS
takes ~25 ms per 64x128x64 product on a busy 2-core machine (threads waiting for a core) against
~0.1 ms single-threaded, so the interpreter runs limit that BLAS to one thread (best effort,
through OpenBLAS's own ``set_num_threads`` entry point; nothing else in the process uses numpy
BLAS for heavy work).
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import importlib.util
import os

import pytest
import torch

NEEDS_INTERPRETER = not torch.cuda.is_available()
TRITON_MODULES = ("triton_kv", "triton_norm", "triton_rope", "triton_decode", "triton_prefill",
                  "triton_quant")



def _numpy_blas_one_thread() -> str | None:
    """Set numpy's bundled OpenBLAS to one thread; returns the symbol used, or None."""
    import numpy

    root = os.path.dirname(numpy.__file__)
    libs = glob.glob(os.path.join(root, "..", "numpy.libs", "*openblas*")) + glob.glob(
        os.path.join(root, ".libs", "*openblas*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(1)
                return sym
    return None


if importlib.util.find_spec("triton") is not None and NEEDS_INTERPRETER:
    _numpy_blas_one_thread()
    _before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for _name in TRITON_MODULES:
            importlib.import_module(f"localchat.kernels.{_name}")
    finally:
        if _before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _before


@pytest.fixture(autouse=True)
def _triton_interpreter(monkeypatch):
    """Keep ``TRITON_INTERPRET=1`` set while a kernel test runs on a machine without CUDA."""
    if NEEDS_INTERPRETER:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture
def device() -> torch.device:
    """Where the kernel tests put their tensors: CUDA when present, else the CPU interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def built() -> bool:
    """The C++ CPU kernels, built (skips the test without a compiler; fails when a compiler is
    present but the build failed, unless ``LOCALCHAT_KERNELS=reference`` turns them off)."""
    import shutil

    from localchat.kernels import cpu

    ok = cpu.available()
    if os.environ.get("LOCALCHAT_KERNELS", "").lower() != "reference":
        have_compiler = shutil.which(os.environ.get("CXX", "c++")) is not None
        assert ok == have_compiler, "a C++ compiler is present but the CPU kernels did not build"
    if not ok:
        pytest.skip("no C++ compiler: the kernels under test are not built")  # CPU-only tool
    return ok
