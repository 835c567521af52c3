"""The console script ends a torch-importing command with ``os._exit`` once its exit handlers
have run and stdout and stderr are flushed (``entry._exit_now_if_torch``): checked in fresh
processes against the normal interpreter exit, which must give the same output and code."""

from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = r"""
import atexit, sys, threading, time
import torch
import localchat.app.cli as cli

class Teardown:  # a module global's finalizer: runs in the interpreter's teardown only
    def __del__(self):
        sys.stderr.write("teardown\n")

keep = Teardown()

def fake_main():
    atexit.register(lambda: sys.stderr.write("atexit ran\n"))
    if sys.argv[1] == "thread":  # a thread still working when the command returns
        threading.Thread(target=time.sleep, args=(0.3,)).start()
    sys.stdout.write("a reply without its newline")  # still in the buffer at exit
    sys.exit(int(sys.argv[2]))

cli.main = fake_main
from localchat.app.entry import main
main()
"""


def _run(mode: str, code: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(code)], capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.parametrize("code", [0, 3])
def test_the_fast_exit_keeps_output_code_and_exit_handlers(code):
    fast, normal = _run("plain", code), _run("thread", code)
    assert (fast.returncode, fast.stdout) == (normal.returncode, normal.stdout) \
        == (code, "a reply without its newline")
    assert fast.stderr == "atexit ran\n"  # no teardown: the process ended at once
    assert normal.stderr == "atexit ran\nteardown\n"  # a live thread: the normal exit
