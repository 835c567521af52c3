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


@pytest.mark.parametrize("code", [0, 3])
def test_a_closed_stderr_keeps_the_exit_code(code):
    """``localchat ask ... 2>&-``: Python starts with ``sys.stderr`` None; the fast exit has
    nothing to flush there and must keep the command's code (a trial got 1 for a clean
    answer: ``None.flush()`` raised inside the exit)."""
    import os

    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT.replace('sys.stderr.write("atexit ran\\n")', "None"),
         "plain", str(code)],
        stdout=subprocess.PIPE, text=True, timeout=120, check=False,
        preexec_fn=lambda: os.close(2))
    assert (proc.returncode, proc.stdout) == (code, "a reply without its newline")


def test_a_closed_stderr_never_reaches_stdout():
    """With descriptor 2 closed, what the CLI prints to stderr (``print(..., file=
    sys.stderr)``: serve's status lines, notes) is dropped, not written into stdout, and the
    next file opened does not take descriptor 2."""
    import os

    script = _SCRIPT.replace(
        'sys.stdout.write("a reply without its newline")',
        'print("a note", file=sys.stderr); sys.stdout.write(str(open(os.devnull).fileno()))')
    proc = subprocess.run([sys.executable, "-c", "import os\n" + script, "plain", "0"],
                          stdout=subprocess.PIPE, text=True, timeout=120, check=False,
                          preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0 and "note" not in proc.stdout and int(proc.stdout) > 2
