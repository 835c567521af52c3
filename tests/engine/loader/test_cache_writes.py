"""An optional cache write that fails (full disk, read-only folder) never fails a load (issue
18): the GGUF metadata cache (config, tensor table) and the converted-tokenizer cache. A full
disk is real here: the temp file is ``/dev/full``, whose every write fails with ENOSPC."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

from localchat.engine.loader import gguf as gguf_loader


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """``tempfile.mkstemp`` hands out ``/dev/full``: the file opens, every write gets ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (Linux)")

    def mkstemp(*args, **kwargs):
        return os.open("/dev/full", os.O_WRONLY), str(tmp_path / "never-created")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_metadata_cache_on_a_full_disk_still_loads(smollm2_gguf, tmp_path, full_disk):
    cache = tmp_path / "cache"
    config = gguf_loader.load_gguf_hf_config(smollm2_gguf, cache_dir=cache)
    names = gguf_loader.gguf_tensor_names(smollm2_gguf, cache_dir=cache)
    reference = gguf_loader.load_gguf_hf_config(smollm2_gguf)  # no cache at all
    assert config.to_dict() == reference.to_dict()
    assert names == gguf_loader.gguf_tensor_names(smollm2_gguf)
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing half-written is left


def test_tokenizer_cache_on_a_full_disk_still_loads(smollm2_gguf, tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerBase

    from localchat.engine.tokenizer import Tokenizer

    def no_space(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", no_space)
    tok = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=tmp_path / "cache")
    assert tok.decode(tok.encode("Hello, world")) == "Hello, world"
    assert not (tmp_path / "cache" / "gguf-tokenizers").exists() or not any(
        p.name.startswith("SmolLM2") for p in (tmp_path / "cache" / "gguf-tokenizers").iterdir())
