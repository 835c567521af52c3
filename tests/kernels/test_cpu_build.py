"""An interrupted build of the CPU kernels leaves no compiler running and no scratch folder.

``cpp_extension.load`` runs ninja, and ninja runs each compile in its own process group; an
interrupted build (Ctrl+C, SIGTERM of ``ask``) killed ninja and left the compilers running
for minutes. The build now terminates every process working in its scratch folder. Here a
``sleep`` started in its own session with the scratch folder as its working directory stands
in for a compiler (Linux: processes are found through ``/proc``).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from localchat.kernels.cpu import build

pytestmark = pytest.mark.skipif(not Path("/proc/self/cwd").exists(),
                                reason="finding processes by working directory needs /proc")


def _sleeper(cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], cwd=cwd, start_new_session=True)


def test_processes_working_in_the_folder_are_stopped_and_others_left(tmp_path):
    scratch, elsewhere = tmp_path / "scratch", tmp_path / "elsewhere"
    scratch.mkdir()
    elsewhere.mkdir()
    inside, outside = _sleeper(scratch), _sleeper(elsewhere)
    try:
        assert build.stop_build_processes(scratch) == 1
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert outside.poll() is None
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()


def test_an_interrupted_build_stops_its_compilers_and_removes_its_folder(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    started = []

    def interrupted_load(*, build_directory, **kwargs):
        started.append(_sleeper(Path(build_directory)))  # a compile ninja started
        raise KeyboardInterrupt  # Ctrl+C (ask turns SIGTERM into the same) mid-build

    monkeypatch.setattr(cpp_extension, "load", interrupted_load)
    out = tmp_path / "cpu-kernels"
    out.mkdir()
    try:
        with pytest.raises(KeyboardInterrupt):
            build._build(Path(build.__file__).parent, out)
        assert started[0].wait(timeout=10) == -signal.SIGKILL
        assert list(out.parent.glob(f"{out.name}.build-*")) == []
    finally:
        started[0].kill()
        started[0].wait()

