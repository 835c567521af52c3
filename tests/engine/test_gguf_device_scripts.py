"""The real-GGUF device check's scripts (``scripts/gguf_truncate.py``,
``scripts/gguf_device_check.py``), checked on the CPU before a device sees them.

The truncated copy of the SmolLM2 bundle keeps every metadata key (the block count set to
N), the kept blocks' tensors and the rest byte for byte, against gguf's own reader of the
source; a block count out of range is one line and exit 2. ``compare`` turns a failed load or
CLI call into a failure and counts the leading equal ids. (The whole record / check round
trip loads the copy through every weight format and the CLI: about 2 minutes here, run by
hand before a device run, not in the suite.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_truncated_gguf_keeps_its_blocks_byte_for_byte(smollm2_gguf, tmp_path):
    from gguf import GGUFReader

    dst = tmp_path / "small.gguf"
    assert _load("gguf_truncate").main([str(smollm2_gguf), str(dst), "--blocks", "2"]) == 0
    src, cut = GGUFReader(smollm2_gguf), GGUFReader(dst)
    kept = {t.name: t for t in src.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < 2}
    assert sorted(t.name for t in cut.tensors) == sorted(kept)
    for t in cut.tensors:
        s = kept[t.name]
        assert t.tensor_type == s.tensor_type and list(t.shape) == list(s.shape), t.name
        assert np.array_equal(np.asarray(t.data).view(np.uint8),
                              np.asarray(s.data).view(np.uint8)), t.name
    assert set(cut.fields) == set(src.fields)
    for name, field in src.fields.items():
        if name.startswith("GGUF.") or name.endswith(".block_count"):
            continue
        got = [bytes(cut.fields[name].parts[i]) for i in cut.fields[name].data]
        assert got == [bytes(field.parts[i]) for i in field.data], name
    count = cut.fields["llama.block_count"]
    assert int(count.parts[count.data[0]][0]) == 2


def test_a_block_count_out_of_range_is_one_line(smollm2_gguf, tmp_path, capsys):
    assert _load("gguf_truncate").main([str(smollm2_gguf), str(tmp_path / "x.gguf"),
                                        "--blocks", "31"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1..30" in err, err


def test_compare_fails_on_errors_and_counts_leading_ids():
    check = _load("gguf_device_check")
    ref = {"device": "cpu", "engine": {"native": {"greedy": [1, 2, 3, 4], "argmax": [5, 6],
                                                  "load_s": 1.0}},
           "cli": {"first": {"rc": 0, "stdout": "a", "stderr": []}}}
    same, failed = check.compare({**ref, "device": "cuda"}, ref)
    assert not failed and "| native | True | 4 of 4 | 2 of 2 |" in "\n".join(same)
    diff = {"device": "cuda", "engine": {"native": {"greedy": [1, 2, 9, 4], "argmax": [5, 0],
                                                    "load_s": 1.0}},
            "cli": {"first": {"rc": 0, "stdout": "b", "stderr": []}}}
    lines, failed = check.compare(diff, ref)
    assert not failed and "| native | False | 2 of 4 | 1 of 2 |" in "\n".join(lines)
    assert "| first | 0 | False |" in "\n".join(lines)
    broken = {"device": "cuda", "engine": {"native": {"error": "RuntimeError: devices"}},
              "cli": {"first": {"rc": 1, "stdout": "", "stderr": ["internal error"]}}}
    lines, failed = check.compare(broken, ref)
    assert failed and "RuntimeError" in "\n".join(lines)
