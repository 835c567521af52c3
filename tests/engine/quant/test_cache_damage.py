"""A damaged memory-mapped weight cache entry (``engine/quant/cache.py``,
``load_quantized_mmap``) is reported in one warning and rebuilt, never raised: a header length
past the file (a fresh-clone trial's ``\\xff...\\x7f`` made ``ask`` fail with an internal
OverflowError on every later run), a header that is not JSON (said so, not in the parser's
words), not a JSON object, or whose entries lack their fields, a truncated file. An intact entry maps, the values equal to the saved ones."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from localchat.engine.quant.cache import FORMAT, load_quantized_mmap, save_quantized


def _model(seed: int) -> nn.Module:
    model = nn.Module()
    gen = torch.Generator().manual_seed(seed)
    model.register_buffer("w", torch.randint(0, 256, (64, 32), generator=gen,
                                             dtype=torch.uint8))
    model.register_buffer("s", torch.randn(64, generator=gen).half())
    return model


def _header(raw: bytes) -> tuple[int, dict]:
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8:8 + n])


def _with_header(raw: bytes, header: dict) -> bytes:
    body = json.dumps(header).encode()
    n, _ = _header(raw)
    body += b" " * (n - len(body)) if len(body) <= n else b""
    return len(body).to_bytes(8, "little") + body + raw[8 + n:]


def _damage(kind: str, raw: bytes) -> bytes:
    n, header = _header(raw)
    if kind == "huge_length":
        return b"\xff" * 7 + b"\x7f" + raw[8:]
    if kind == "length_past_end":
        return (len(raw)).to_bytes(8, "little") + raw[8:]
    if kind == "zeroed_header":  # (a fresh-clone trial's: the JSON parser's message alone)
        return raw[:8] + b"\x00" * n + raw[8 + n:]
    if kind == "not_an_object":
        return _with_header(raw, [1, 2, 3])
    if kind == "entry_without_offsets":
        del header["w"]["data_offsets"]
        return _with_header(raw, header)
    if kind == "entry_not_a_dict":
        header["s"] = "F16"
        return _with_header(raw, header)
    if kind == "truncated":
        return raw[:len(raw) - 100]
    if kind == "empty":
        return b""
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["huge_length", "length_past_end", "zeroed_header",
                                  "not_an_object",
                                  "entry_without_offsets", "entry_not_a_dict", "truncated",
                                  "empty"])
def test_damaged_entry_is_one_warning(tmp_path, caplog, kind):
    path = tmp_path / "entry.safetensors"
    save_quantized(_model(1), path, {"scheme": "test"})
    path.write_bytes(_damage(kind, path.read_bytes()))
    target = _model(2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="localchat.engine.quant.cache"):
        assert load_quantized_mmap(target, path, fmt=FORMAT) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and "rebuilding" in lines[0]
    if kind == "zeroed_header":
        assert "header is not JSON" in lines[0]
    for k, v in target.state_dict().items():  # nothing replaced
        assert torch.equal(v, before[k])


def test_intact_entry_maps(tmp_path):
    path = tmp_path / "entry.safetensors"
    source = _model(1)
    save_quantized(source, path, {"scheme": "test"})
    target = _model(2)
    assert load_quantized_mmap(target, path, fmt=FORMAT) is True
    for k, v in target.state_dict().items():
        assert torch.equal(v, source.state_dict()[k])
