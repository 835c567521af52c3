"""The llama.cpp peers of ``bench_peers.py``: three ways to time llama.cpp on one GGUF.

``pick_llama_peer`` chooses, in this order: ``LlamaPeer`` (``scripts/llama_peer.cpp`` built
against a llama.cpp tree, a persistent child over ``llama.h`` fed the same prompt ids, greedy),
``LlamaBench`` (llama.cpp's own ``llama-bench``: ``pp`` over random ids, then ``tg`` at depth
P), else ``LlamaCpp`` (``llama-cpp-python``) when it is installed and passes a 4-token probe
in a child process. Each peer has ``name``, ``weight_bytes``, ``warm(ids)`` and
``measure(ids, n) -> (prefill tok/s, decode tok/s)`` like the other engines of the benchmark.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import bench_decode as bd


def pick_llama_peer(path: Path, threads: int, ctx: int, *, peer_exe: Path | None = None,
                    bench_exe: Path | None = None):
    """The llama.cpp peer for ``path`` and why there is none: ``(peer, None)`` or
    ``(None, reason)`` (``llama-cpp-python`` missing or failing its probe). ``ctx`` is the
    context ``llama-cpp-python`` is given (prompt + new tokens + slack)."""
    if peer_exe is not None:
        return LlamaPeer(peer_exe, path, threads), None
    if bench_exe is not None:
        return LlamaBench(bench_exe, path, threads), None
    if (problem := llama_cpp_problem(path, threads)) is not None:
        return None, problem
    return LlamaCpp(path, threads, ctx), None


def llama_cpp_problem(path: Path, threads: int) -> str | None:
    """None if llama-cpp-python loads ``path`` and evaluates 4 tokens in a child process;
    else why not (not installed, or the child died, e.g. a build using instructions this
    CPU or kernel does not allow)."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'localchat[bench]')"
    code = ("import sys; from llama_cpp import Llama; "
            "Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=64, "
            "verbose=False).eval([1, 2, 3, 4])")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(threads)],
                          check=False, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:120]
        return f"llama-cpp-python failed a 4-token probe (exit {proc.returncode}) {tail}"
    return None


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path: Path, threads: int, ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                         n_ctx=ctx, n_batch=512, verbose=False)
        self.weight_bytes = path.stat().st_size

    def _gen(self, prompt, n):
        import numpy as np

        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        times = []
        for i in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            times.append(time.perf_counter())
            if i < n - 1:
                llm.eval([tok])
        return t0, times

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        t0, times = self._gen(ids, n)
        return len(ids) / (times[0] - t0), (n - 1) / (times[-1] - times[0])


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of the GGUF's tensor data (what llama.cpp reads per decode step, at most)."""
    from localchat.engine.loader.gguf import _tensor_index

    return sum(t["n_bytes"] for t in _tensor_index(path, None)["tensors"])


class LlamaPeer:
    """llama.cpp through ``scripts/llama_peer.cpp``'s ``serve`` mode: one child process holds
    the model; each measurement sends the prompt ids and reads back one JSON line."""

    name = "llama.cpp"

    def __init__(self, exe: Path, path: Path, threads: int) -> None:
        import subprocess

        self.proc = subprocess.Popen([str(exe), "serve", str(path), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.weight_bytes = gguf_tensor_bytes(path)
        self.forward5 = []

    def _run(self, ids, n) -> dict:
        self.proc.stdin.write(",".join(map(str, [n, *ids])) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"llama_peer exited with {self.proc.wait()}")
        return json.loads(line)

    def _gen(self, prompt, n):
        return self._run(prompt, n)

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        r = self._run(ids, n)
        self.forward5.append(r["forward5_s"] / r["step1_s"])
        return len(ids) / r["prefill_s"], (n - 1) / r["decode_s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class LlamaBench:
    """llama.cpp's ``llama-bench`` binary, run per measurement: ``-p P -n 0`` (prefill of P
    random ids) and ``-p 0 -n N -d P`` (N tokens after a P-token context), 1 repetition."""

    name = "llama.cpp"

    def __init__(self, exe: Path, path: Path, threads: int) -> None:
        self.cmd = [str(exe), "-m", str(path), "-t", str(threads), "-r", "1", "-o", "json"]
        self.weight_bytes = gguf_tensor_bytes(path)

    def _ts(self, *args) -> float:
        import subprocess

        out = subprocess.run(self.cmd + list(args), capture_output=True, text=True,
                             timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr[-300:]}")
        return float(json.loads(out.stdout)[0]["avg_ts"])

    def warm(self, ids):
        self._ts("-p", "32", "-n", "0")

    def measure(self, ids, n):
        return (self._ts("-p", str(len(ids)), "-n", "0"),
                self._ts("-p", "0", "-n", str(n), "-d", str(len(ids))))


