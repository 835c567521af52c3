"""Which running server answers a ``-m`` spec (``state.ServerInfo.serves``).

A server started with ``-m ./Smol.gguf`` registered that string, and ``ask -m ./Smol.gguf``
matched it from any folder: a file that did not exist there got an answer, and another
model's file of that name was answered by the server's model, recorded under the wrong name
in the history (new-user trial). Now a spec naming an existing file or folder matches by its
absolute path, which the server registers beside the spec; a path-like spec that names
nothing matches no server; names (aliases, repo ids) still match as typed.
"""

from __future__ import annotations

from localchat.app.server.state import ServerInfo


def test_a_local_path_matches_by_where_it_points(tmp_path, monkeypatch):
    served, other = tmp_path / "a", tmp_path / "b"
    served.mkdir()
    other.mkdir()
    (served / "Smol.gguf").write_bytes(b"GGUF")
    info = ServerInfo(url="http://127.0.0.1:1", model="./Smol.gguf",
                      aliases=(str((served / "Smol.gguf").resolve()),))
    monkeypatch.chdir(served)
    assert info.serves("./Smol.gguf") and info.serves("Smol.gguf")
    assert info.serves(str(served / "Smol.gguf"))
    monkeypatch.chdir(other)
    assert not info.serves("./Smol.gguf")  # nothing there: the load says it is missing
    (other / "Smol.gguf").write_bytes(b"GGUF")  # another model's file of the same name
    assert not info.serves("./Smol.gguf") and not info.serves("Smol.gguf")
    assert info.serves(str(served / "Smol.gguf")) and info.serves(None)


def test_names_match_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    info = ServerInfo(url="http://127.0.0.1:1", model="smollm2-135m",
                      aliases=("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",))
    assert info.serves("smollm2-135m")
    assert info.serves("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    assert not info.serves("qwen2.5-coder-0.5b") and not info.serves("~/nothing.gguf")
