"""The one-pass GGUF header reader and the config built from it, against ``gguf.GGUFReader``
and transformers' ``AutoConfig`` / ``AutoTokenizer`` (the oracles)."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from localchat.engine.errors import ModelLoadError
from localchat.engine.loader.gguf_header import numpy_view_spec, read_gguf_header


def _oracle_value(field):
    """A ``gguf.ReaderField``'s value as plain Python (lists for arrays)."""
    value = field.contents()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _assert_same_as_reader(path: Path) -> None:
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for key, field in fields.items():
        want, got = _oracle_value(field), header.metadata[key]
        if isinstance(want, float):
            assert np.float64(got) == np.float64(want), key
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert np.array_equal(np.array(got), np.array(want)), key
        else:
            assert got == want, key
    assert header.data_offset == reader.data_offset
    assert len(header.tensors) == len(reader.tensors)
    for ours, ref in zip(header.tensors, reader.tensors):
        assert ours.name == ref.name
        assert ours.ggml_type == int(ref.tensor_type)
        assert list(ours.dims) == [int(d) for d in ref.shape]
        assert ours.offset == int(ref.data_offset)
        assert ours.n_bytes == int(ref.n_bytes)
        assert numpy_view_spec(ours) == (ref.data.dtype.str, list(ref.data.shape))


def _write_synthetic(path: Path, alignment: int | None = None) -> None:
    """A GGUF with every metadata value type, arrays of strings and numbers, and tensors of
    several GGML types (gguf's own writer)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo, 世界 🙂")
    w.add_array("t.strs", ["a", "", "ü" * 40, "<|im_end|>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25, 3.0e-8])
    w.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((5, 32)).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bundle_header_equals_gguf_reader(smollm2_gguf):
    _assert_same_as_reader(smollm2_gguf)


@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_synthetic_header_equals_gguf_reader(tmp_path, alignment):
    path = tmp_path / "synthetic.gguf"
    _write_synthetic(path, alignment)
    _assert_same_as_reader(path)
    header = read_gguf_header(path)
    assert header.metadata["t.strs"] == ["a", "", "ü" * 40, "<|im_end|>"]
    assert header.metadata["t.u64"] == 2**63 + 5
    assert header.architecture == "llama"


def test_truncated_and_corrupt_files_raise_one_error(tmp_path):
    path = tmp_path / "synthetic.gguf"
    _write_synthetic(path)
    data = path.read_bytes()
    header = read_gguf_header(path)
    cut = tmp_path / "cut.gguf"
    # every cut inside the header, and cuts inside the tensor data
    last = header.tensors[-1]
    for n in [*range(0, header.data_offset, 7), last.offset + 1, last.offset + last.n_bytes - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(ModelLoadError, match=r"cut\.gguf"):
            read_gguf_header(cut)
    bad = bytearray(data)
    bad[0:4] = b"GGUX"
    cut.write_bytes(bytes(bad))
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        read_gguf_header(cut)
    bad = bytearray(data)
    bad[4:8] = struct.pack("<I", 1)
    cut.write_bytes(bytes(bad))
    with pytest.raises(ModelLoadError, match="version 1"):
        read_gguf_header(cut)
    bad = bytearray(data)
    bad[16:24] = struct.pack("<Q", 2**40)  # metadata key count past any file
    cut.write_bytes(bytes(bad))
    with pytest.raises(ModelLoadError, match="corrupt"):
        read_gguf_header(cut)
    with pytest.raises(ModelLoadError, match="no-such"):
        read_gguf_header(tmp_path / "no-such.gguf")


def _config_matches_transformers(path: Path) -> None:
    from transformers import AutoConfig

    from localchat.engine.config import ModelConfig
    from localchat.engine.loader.gguf_config import hf_config_from_header

    ours = hf_config_from_header(read_gguf_header(path))
    ref = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    a, b = ours.to_dict(), ref.to_dict()
    for volatile in ("_name_or_path", "_commit_hash", "transformers_version"):
        a.pop(volatile, None)
        b.pop(volatile, None)
    assert a == b
    assert ModelConfig.from_hf_config(ours) == ModelConfig.from_hf_config(ref)


def _tokenizer_matches_transformers(path: Path) -> None:
    from transformers import AutoTokenizer

    from localchat.engine.tokenizer import _load_gguf

    ours = _load_gguf(path)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(ours) is type(ref)
    assert ours.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert ours.special_tokens_map == ref.special_tokens_map
    assert ours.chat_template == ref.chat_template
    for text in ["Hello, world!", "def f(x):\n    return x ** 2  # ünï 日本 🙂"]:
        assert ours(text)["input_ids"] == ref(text)["input_ids"]


def test_bundle_config_equals_autoconfig(smollm2_gguf):
    _config_matches_transformers(smollm2_gguf)


def test_bundle_tokenizer_equals_autotokenizer(smollm2_gguf):
    _tokenizer_matches_transformers(smollm2_gguf)


def test_other_architectures_keep_transformers_path(tmp_path):
    from localchat.engine.loader.gguf_config import hf_config_dict

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("a.weight", np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert hf_config_dict(read_gguf_header(path)) is None


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_qwen_header_config_tokenizer(alias, cache_dir):
    from localchat.engine.hub.resolve import resolve_model

    path = resolve_model(alias, cache_dir=cache_dir).path
    _assert_same_as_reader(path)
    _config_matches_transformers(path)
    _tokenizer_matches_transformers(path)
