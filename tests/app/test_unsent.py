"""``unsent.py``: the piped text of a failed ``ask`` kept in a file (the ``ask`` side is in
``test_ask_features.py``)."""

from __future__ import annotations

from localchat.app import settings, unsent
from localchat.engine.errors import ModelNotFoundError


def test_kept_text_files_never_collide_and_hold_the_text(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "data_dir", lambda: tmp_path)
    paths = [unsent.keep_piped_text(f"text {i}\n\udcff") for i in range(5)]  # one second
    assert len(set(paths)) == 5
    assert [p.read_bytes() for p in paths] == [f"text {i}\n".encode() + b"\xff" for i in range(5)]


def test_an_unwritable_folder_leaves_the_error_as_it_was(tmp_path, monkeypatch):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the folder would go")
    monkeypatch.setattr(settings, "data_dir", lambda: blocker)
    exc = ModelNotFoundError("unknown model 'x'")
    unsent.with_kept_text(exc, "piped\n")
    assert exc.args == ("unknown model 'x'",)
    unsent.with_kept_text(exc, " \n")  # blank text: nothing to keep, nothing said
    assert exc.args == ("unknown model 'x'",)
    monkeypatch.setattr(settings, "data_dir", lambda: tmp_path)
    unsent.with_kept_text(exc, "piped\n")
    assert exc.args[0].startswith(f"unknown model 'x'; the piped text is kept in {tmp_path}")


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    """A full disk: the part-written file goes, and nothing is named (a trial found an empty
    file left behind)."""
    monkeypatch.setattr(settings, "data_dir", lambda: tmp_path)

    class Full:
        def __init__(self, fd, *a, **k):
            import os
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(unsent.os, "fdopen", Full)
    assert unsent.keep_piped_text("piped\n") is None
    assert list((tmp_path / "unsent").iterdir()) == []
