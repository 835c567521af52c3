"""``gguf_cache_key`` is computed once per process per file state: a second call for an
unchanged file reads nothing; a file rewritten (new bytes, new mtime) gets its new key."""

from __future__ import annotations

import os

import pytest

from localchat.engine import cache_keys


def _fresh_key(path):
    cache_keys._KEYS.clear()
    return cache_keys.gguf_cache_key(path)


def test_key_memoized_until_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    first = _fresh_key(path)
    assert first.startswith("model-") and len(first) == len("model-") + 16

    def no_open(*args, **kwargs):
        raise AssertionError("an unchanged file was read again")

    monkeypatch.setattr(cache_keys, "open", no_open, raising=False)
    assert cache_keys.gguf_cache_key(path) == first  # memoized: no read
    monkeypatch.undo()

    # same size, other bytes, later mtime: a new key, the one a fresh process computes
    path.write_bytes(b"GGUF" + bytes(reversed(range(256))) * 40)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = cache_keys.gguf_cache_key(path)
    assert second != first
    assert second == _fresh_key(path)


@pytest.mark.parametrize("size", [10, 3 << 20])  # one read; first and last MiB
def test_key_equals_its_definition(tmp_path, size):
    import hashlib

    path = tmp_path / "m.gguf"
    data = os.urandom(size)
    path.write_bytes(data)
    head, tail = data[: 1 << 20], data[-(1 << 20):] if size > 2 << 20 else data[1 << 20:]
    digest = hashlib.sha256(f"m.gguf|{size}|{cache_keys.transformers_version()}".encode())
    digest.update(head)
    digest.update(tail)
    assert _fresh_key(path) == f"m-{digest.hexdigest()[:16]}"
