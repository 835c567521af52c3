"""Building and loading localchat's C++ CPU extension (``torch.ops.localchat_cpu``): the
sources, the compiler flags, the per-version build folder in the user cache, and the one-time
build with its fallback line. Re-exported by ``localchat.kernels.cpu`` (call ``available``
through it: tests replace it there)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

SOURCES = ("ops.cpp", "quant_scalar.cpp", "quant_avx2.cpp", "quant_avx512.cpp",
           "qa8_ops.cpp", "qa8_prep.cpp", "qa8_scalar.cpp", "qa8_avx2.cpp", "qa8_vnni.cpp",
           "qa8_amx.cpp", "panel4_scalar.cpp", "panel4_vnni.cpp", "panel4_avx2.cpp",
           "panel5_scalar.cpp", "panel5_avx2.cpp", "panel5_repack.cpp",
           "panel6_scalar.cpp", "panel6_vnni.cpp", "panel6_avx2.cpp", "panel8_scalar.cpp",
           "panel8_vnni.cpp", "panel8_avx2.cpp", "panel_repack.cpp", "panel_gather.cpp",
           "panelf_ops.cpp", "panelf_scalar.cpp", "panelf_avx2.cpp",
           "attn_ops.cpp", "attn_scalar.cpp", "attn_avx2.cpp", "attn_avx512.cpp",
           "attn_dot.cpp",
           "dequant_ops.cpp", "dequant_avx2.cpp", "dequant_avx512.cpp",
           "fmm_ops.cpp", "fmm_scalar.cpp", "fmm_avx2.cpp", "fmm_avx512.cpp", "fmm_dot.cpp",
           "repack_ops.cpp",
           "qa6_ops.cpp", "qa6_scalar.cpp", "qa6_avx2.cpp", "qa6_avx512.cpp", "qa6_vnni.cpp",
           "qa5_ops.cpp", "qa5_scalar.cpp", "qa5_avx2.cpp", "qa5_avx512.cpp", "qa5_vnni.cpp",
           "strip_gemm.cpp", "amx_bf16.cpp", "amx_fill_planes.cpp", "stack_ops.cpp")
_NAME = "localchat_cpu_kernels"
# at::parallel_for is an OpenMP region only in code compiled with -fopenmp: without it every
# kernel runs on the calling thread whatever torch.set_num_threads says. The library then
# names libgomp.so.1, the soname torch's own OpenMP runtime already loaded, so the two share
# one thread pool. (macOS clang has no -fopenmp: there the kernels stay single-threaded.)
_OPENMP = (("-fopenmp",) if sys.platform != "darwin" and torch.backends.openmp.is_available()
           else ())
_CFLAGS = ("-O3", "-std=c++17") + _OPENMP


def build_dir() -> Path:
    """Where the extension is built (created): one folder per torch version, Python ABI and
    source hash (:func:`build_name`)."""
    home = os.environ.get("LOCALCHAT_HOME")
    if home:
        root = Path(home).expanduser() / "cache"
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("localchat"))
    path = root / "kernels" / build_name()
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_name() -> str:
    """This installation's build folder name, ``cpu-torch<version>-py<ABI>-<hash of the
    flags, the source list and every source and header>``."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha1(" ".join(_CFLAGS + SOURCES).encode() + b"\0")
    for name in sorted(p.name for p in here.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    return (f"cpu-torch{torch.__version__.replace('+', '_')}-py{sys.version_info[0]}"
            f"{sys.version_info[1]}-{digest.hexdigest()[:10]}")


_PREDICT_ONLY = False  # inside predict_only(): answer available() without building


@contextlib.contextmanager
def predict_only():
    """For work that only sizes weights and runs nothing (``localchat plan``): within this
    context :func:`available` answers :func:`expected` until the library is loaded, so a plan
    on a fresh machine never starts the build (2-3 minutes on 2 cores). The formats' byte
    counts depend on it (which int4 layout, whether Q6_K / Q5_0 keep their bit planes).
    Answers given inside are not cached (``predicting`` tells callers that cache theirs)."""
    global _PREDICT_ONLY
    old, _PREDICT_ONLY = _PREDICT_ONLY, True
    try:
        yield
    finally:
        _PREDICT_ONLY = old


def predicting() -> bool:
    """Whether :func:`available` gives :func:`expected`'s answer now (see
    :func:`predict_only`)."""
    return _PREDICT_ONLY and not _available.cache_info().currsize


def expected() -> bool:
    """Whether :func:`available` would be True, without building: its answer where this
    process already has one; False under ``LOCALCHAT_KERNELS=reference``; True where the
    library for these sources is built; else whether the C++ compiler is on ``PATH`` (a build
    that then fails is not foreseen)."""
    if _available.cache_info().currsize:
        return _available()
    if os.environ.get("LOCALCHAT_KERNELS", "").lower() == "reference":
        return False
    if (build_dir() / f"{_NAME}.so").exists():
        return True
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def available() -> bool:
    """Build (first time) and load the extension; False, after one stderr line, if it cannot
    be built or ``LOCALCHAT_KERNELS=reference`` is set. Inside :func:`predict_only`,
    :func:`expected`'s answer until the library is loaded."""
    return expected() if predicting() else _available()


@functools.cache
def _available() -> bool:
    if os.environ.get("LOCALCHAT_KERNELS", "").lower() == "reference":
        return False
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        print(f"localchat: CPU kernels unavailable (no C++ compiler: {compiler}); using the "
              "PyTorch reference", file=sys.stderr, flush=True)
        return False
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    try:
        log.setLevel(logging.ERROR)  # its ABI / compiler-version warnings, not ours to show
        here = Path(__file__).resolve().parent
        out = build_dir()
        if _load_built(out / f"{_NAME}.so"):
            return True
        if not (out / f"{_NAME}.so").exists():
            print("localchat: building the CPU kernels (once, a few minutes on 2 cores)...",
                  file=sys.stderr, flush=True)
        _build(here, out)
        torch.ops.localchat_cpu.best_isa()
    except Exception as exc:  # noqa: BLE001  (no compiler / ninja, a failed build: fall back)
        text = str(exc).strip()
        reason = text.splitlines()[0][:160] if text else type(exc).__name__
        print(f"localchat: CPU kernels unavailable ({reason}); using the PyTorch reference",
              file=sys.stderr, flush=True)
        return False
    finally:
        log.setLevel(level)
    return True


def _build(here: Path, out: Path) -> None:
    """Compile the sources in a private folder beside ``out`` and move the library into
    ``out`` with one atomic rename: a build killed half way (Ctrl-C, a timeout) leaves only
    its own scratch folder, never a half-written library or a stale ninja lock that would make
    every later process wait; two processes building at once each finish their own."""
    import tempfile

    with warnings.catch_warnings():  # setuptools' pkg_resources notes on import
        warnings.simplefilter("ignore")
        from torch.utils import cpp_extension
    for old in out.parent.glob(f"{out.name}.build-*"):  # scratch of builds that died
        if time.time() - old.stat().st_mtime > 3600:
            shutil.rmtree(old, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{out.name}.build-", dir=out.parent))
    try:
        cpp_extension.load(
            name=_NAME, sources=[str(here / s) for s in SOURCES], build_directory=str(scratch),
            extra_cflags=list(_CFLAGS), extra_ldflags=list(_OPENMP), is_python_module=False,
            verbose=False)
        os.replace(scratch / f"{_NAME}.so", out / f"{_NAME}.so")
    except BaseException:  # Ctrl+C, SIGTERM, a failed build: no compiler left running
        stop_build_processes(scratch)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def stop_build_processes(scratch: Path) -> int:
    """Kill (SIGKILL) every process working in the build folder ``scratch``; returns how many
    were signalled. An interrupted ``cpp_extension.load`` kills ninja, but ninja runs each
    compile in its own process group, so its compilers (several minutes of CPU on 2 cores)
    outlived the interrupted ``ask``; they are found by their working directory
    (``/proc/PID/cwd``, Linux; elsewhere nothing is done). SIGKILL, because ``cc1plus`` outlived
    a SIGTERM; nothing of theirs is kept (the folder is removed)."""
    import signal

    proc = Path("/proc")
    if not proc.is_dir():
        return 0
    try:
        where = str(Path(scratch).resolve())
    except OSError:
        return 0
    stopped = 0
    for _ in range(20):  # again until none is left: a compiler driver may fork as we scan
        found = 0
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if os.readlink(entry / "cwd") != where:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                found += 1
            except OSError:  # gone meanwhile, or another user's process
                continue
        if not found:
            break
        stopped += found
        time.sleep(0.05)
    return stopped


def _load_built(library: Path) -> bool:
    """Load an already built extension directly (0.1 s). The build folder's name hashes every
    source and header, the torch version and the Python ABI, so a library there is this
    source's build. ``cpp_extension.load`` would import setuptools and run ninja on every
    start instead (seconds), and rebuild whenever another checkout of the same sources at
    another path shares the folder (its build.ninja names absolute source paths). False when
    there is no library yet, or it does not load (a build in progress): then it is built."""
    if not library.is_file():
        return False
    try:
        torch.ops.load_library(str(library))
        torch.ops.localchat_cpu.best_isa()
    except (OSError, RuntimeError, AttributeError):
        return False
    try:  # used now (``localchat cache prune`` removes builds of other versions)
        os.utime(library.parent)
    except OSError:
        pass
    return True
