"""The C++ CPU kernels run on torch's OpenMP thread pool, and ``release_thread_pool`` ends a
thread's workers.

Reference: the operating system's own list of this process's threads (``/proc/self/task``):
a parallel region with 2 torch threads adds a worker thread to the calling thread's team
only if ``at::parallel_for`` is an OpenMP region in the extension (it is not without
``-fopenmp``, which then ran every kernel on the calling thread); after
``release_thread_pool`` that worker exits. Each check runs in a fresh Python thread, whose
OpenMP team starts empty whatever other tests did on the main thread.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from localchat.kernels import cpu

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="needs Linux's /proc to count threads")


@pytest.fixture(scope="module")
def built():
    if not cpu.available():
        pytest.skip("CPU kernels not built (no compiler)")


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _settle(count, want, timeout=10.0) -> int:
    """Poll ``count()`` until it returns ``want`` (workers exit asynchronously)."""
    deadline = time.monotonic() + timeout
    n = count()
    while n != want and time.monotonic() < deadline:
        time.sleep(0.01)
        n = count()
    return n


def _in_thread(fn):
    out, err = {}, []

    def run():
        try:
            out["v"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            err.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out["v"]


def test_kernels_use_the_thread_pool_and_release_ends_its_workers(built):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: OpenMP starts no worker")
    before_threads = torch.get_num_threads()
    # a matmul big enough that at::parallel_for splits it (many output rows)
    x = torch.randn(1, 4096, dtype=torch.bfloat16)
    q = torch.randint(0, 256, (8192, 2048), dtype=torch.uint8)
    s = torch.rand(8192, 4096 // 32) * 0.01
    m = -torch.rand(8192, 4096 // 32) * 0.01

    def check():
        torch.set_num_threads(2)
        start = _tasks()
        y = cpu.int4_matmul_a8(x, q, s, m, 32)
        with_team = _tasks()
        released = cpu.release_thread_pool()
        after = _settle(_tasks, start)
        # the pool comes back on the next call, and the result does not depend on it
        y2 = cpu.int4_matmul_a8(x, q, s, m, 32)
        return start, with_team, released, after, torch.equal(y, y2)

    try:
        start, with_team, released, after, same = _in_thread(check)
    finally:
        torch.set_num_threads(before_threads)
    assert with_team == start + 1, "the kernel ran without an OpenMP worker"
    assert released and after == start
    assert same
