"""``resolve_model`` on a local path that is neither a file nor a folder: ``/dev/null``, a
named pipe. ``iterdir`` on them was an internal error (a new-user trial); now the one line
any other non-model path gets, and no Hub call."""

from __future__ import annotations

import os

import pytest

from localchat.engine.errors import ModelNotFoundError
from localchat.engine.hub.resolve import resolve_model


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_path_that_is_neither_file_nor_folder_is_not_a_model(tmp_path, fake_hub, kind):
    spec = "/dev/null" if kind == "device" else str(tmp_path / "pipe")
    if kind == "fifo":
        os.mkfifo(spec)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(spec, cache_dir=tmp_path)
    assert str(err.value) == f"{spec} is not a model: expected a .gguf file or a model folder"
    assert fake_hub.calls == []
