"""Cached GGUF tokenizers read without transformers equal transformers' tokenizer.

A cached load reads the ``save_pretrained`` folder with the ``tokenizers`` library
(``engine/tokenizer_files.py``) and renders the chat template with ``engine/chat_template.py``.
The reference is transformers itself: the tokenizer it converts from the GGUF file
(``AutoTokenizer.from_pretrained(folder, gguf_file=...)``) and its own
``apply_chat_template(tokenize=False)`` on the same conversations.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localchat.engine.chat_template import render_chat_template
from localchat.engine.tokenizer import Tokenizer
from localchat.engine.tokenizer_files import TokenizerFiles

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Привет 👋 日本語 e\u0301"},
     {"role": "assistant", "content": "Здравствуйте! ¿Qué tal? 🎉"},
     {"role": "user", "content": "  tabs\tand\nnewlines  "}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "<|im_start|> c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "def f():\n\treturn 1"}],
]
TEXTS = ["", " ", "a", "Hello, world!", "你好，世界 😀👍🏽 façade", "\n\n  x  ", "<|im_end|> lit"]


def _check_same(cached: Tokenizer, hf) -> None:
    """``cached`` (TokenizerFiles) against transformers' tokenizer ``hf`` on every surface."""
    reference = Tokenizer(hf)
    for conv in CONVERSATIONS:
        for gen in (True, False):
            expected = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert cached.render_chat_template(conv, gen) == expected
            assert cached.apply_chat_template(conv, gen) == reference.apply_chat_template(conv,
                                                                                          gen)
    for text in TEXTS:
        ids = cached.encode(text)
        assert ids == hf(text, add_special_tokens=False)["input_ids"]
        assert cached.decode(ids) == reference.decode(ids)
        assert cached.decode(ids, skip_special_tokens=False) == reference.decode(
            ids, skip_special_tokens=False)
    assert cached.stop_token_ids == reference.stop_token_ids
    assert cached.special_ids == reference.special_ids
    assert (cached.bos_token_id, cached.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert cached.vocab_size == len(hf)
    assert sorted(cached.hf.all_special_ids) == sorted(hf.all_special_ids)


def _cold_then_cached(gguf: Path, cache: Path) -> tuple[Tokenizer, object]:
    from transformers import AutoTokenizer

    cold = Tokenizer.from_pretrained(gguf, cache_dir=cache)
    assert not cold.loaded_from_cache
    import localchat.engine.tokenizer as tokenizer_module

    tokenizer_module._CACHED.clear()
    cached = Tokenizer.from_pretrained(gguf, cache_dir=cache)
    assert cached.loaded_from_cache and isinstance(cached.hf, TokenizerFiles)
    return cached, AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def test_smollm2_cached_tokenizer_equals_transformers(smollm2_tokenizer_cold, smollm2_gguf):
    cold, cache = smollm2_tokenizer_cold  # cold.hf: transformers' conversion of the GGUF
    import localchat.engine.tokenizer as tokenizer_module

    tokenizer_module._CACHED.clear()
    cached = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache)
    assert cached.loaded_from_cache and isinstance(cached.hf, TokenizerFiles)
    assert type(cold.hf).__module__.startswith("transformers")
    _check_same(cached, cold.hf)


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_qwen_cached_tokenizer_equals_transformers(alias, cache_dir, tmp_path):
    from localchat.engine.hub.resolve import resolve_model

    gguf = Path(resolve_model(alias, cache_dir=cache_dir, download=True).path)
    cached, hf = _cold_then_cached(gguf, tmp_path)
    _check_same(cached, hf)
    tools_free = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert "<|im_start|>system\nBe brief." in cached.render_chat_template(tools_free)


def test_cached_tokenizer_imports_no_transformers(smollm2_tokenizer_cold, smollm2_gguf):
    """In a fresh process, a cached tokenizer load (and its chat template) imports neither
    transformers nor torch."""
    _tok, cache = smollm2_tokenizer_cold
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from localchat.engine.tokenizer import Tokenizer\n"
        f"t = Tokenizer.from_pretrained(Path({str(smollm2_gguf)!r}), cache_dir=Path({str(cache)!r}))\n"
        "ids = t.apply_chat_template([{'role': 'system', 'content': 's'},"
        " {'role': 'user', 'content': 'Hi'}])\n"
        "print(t.loaded_from_cache, len(ids) > 5,"
        " [m for m in ('transformers', 'torch') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.stdout.strip() == "True True []", out.stderr[-2000:]


# ------------------------------------------------- the renderer against transformers' own
TEMPLATES = {
    "namespace_loop_controls": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}"
        "{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}[{{ ns.n }}:{{ m.role }}]"
        "{{ m.content | trim }}{% if loop.last %}{% break %}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}{{ eos_token }}>{% endif %}"
    ),
    "tojson_and_dict": (
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}"
        "{{ dict(a=1, b=m.role) | tojson }}\n{% endfor %}"
    ),
    "trim_lstrip_blocks": (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n"
        "U: {{ m.content }}\n    {% else %}\nA: {{ m.content }}\n    {% endif %}\n{% endfor %}"
    ),
    "generation_block": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}"
    ),
    "reasoning_alias": (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>"
        "{% endif %};{% endfor %}"
    ),
}


def _tiny_hf():
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "[UNK]", "Hi", " "])}
    rust = RustTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    rust.add_special_tokens(["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=rust, bos_token="<s>", eos_token="</s>",
                                   unk_token="[UNK]")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renderer_equals_transformers(name):
    hf = _tiny_hf()
    messages = [
        {"role": "system", "content": "sys \"quoted\" <b>html</b>"},
        {"role": "user", "content": "  héllo 👋  "},
        {"role": "assistant", "content": "ok", "reasoning": "because", "name": None},
        {"role": "user", "content": "again"},
    ]
    for gen in (True, False):
        expected = hf.apply_chat_template(messages, chat_template=TEMPLATES[name],
                                          tokenize=False, add_generation_prompt=gen)
        got = render_chat_template(TEMPLATES[name], messages, add_generation_prompt=gen,
                                   special_tokens=dict(hf.special_tokens_map))
        assert got == expected


def test_renderer_refuses_what_transformers_refuses():
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        render_chat_template("{{ raise_exception('no system') }}", [], add_generation_prompt=True,
                             special_tokens={})
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template("{% set ns = namespace(_x=1) %}", [], add_generation_prompt=True,
                             special_tokens={})
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template("{{ messages.__class__.__mro__ }}", [], add_generation_prompt=True,
                             special_tokens={})


def test_saved_tokenizer_json_is_compact_and_older_saves_are_compacted(
        smollm2_tokenizer_cold, smollm2_gguf, tmp_path):
    """The cache's ``tokenizer.json`` is saved compact with ``"a b"`` merges
    (``compact_tokenizer_json``); an entry saved before that (indented, ``["a", "b"]`` pairs,
    as ``save_pretrained`` writes it) is compacted on its next read; both load the same
    tokenizer as transformers' conversion (``_check_same``)."""
    import json
    import shutil

    import localchat.engine.tokenizer as tokenizer_module
    from localchat.engine.tokenizer_files import compact_tokenizer_json

    cold, cache = smollm2_tokenizer_cold
    (entry,) = (cache / "gguf-tokenizers").iterdir()
    saved = entry / "tokenizer.json"
    assert saved.read_bytes()[:2] == b'{"'
    data = json.loads(saved.read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    assert merges and all(isinstance(m, str) and m.count(" ") == 1 for m in merges)
    # an older entry: the same tokenizer as save_pretrained writes it
    old_cache = tmp_path / "old"
    old_entry = old_cache / "gguf-tokenizers" / entry.name
    shutil.copytree(entry, old_entry)
    data["model"]["merges"] = [m.split(" ") for m in merges]
    (old_entry / "tokenizer.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    tokenizer_module._CACHED.clear()
    cached = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=old_cache)
    assert cached.loaded_from_cache
    assert (old_entry / "tokenizer.json").read_bytes() == saved.read_bytes()
    _check_same(cached, cold.hf)
    assert not compact_tokenizer_json(saved)  # already compact: untouched


def test_compact_tokenizer_json_keeps_pairs_whose_tokens_have_spaces(tmp_path):
    """Merges of tokens that contain a space stay ``[a, b]`` pairs (a ``"a b"`` string would
    split wrongly); the tokenizer encodes as the indented original does."""
    import json

    from tokenizers import Tokenizer as Backend

    from localchat.engine.tokenizer_files import compact_tokenizer_json

    vocab = {"a": 0, "b": 1, " ": 2, "a ": 3, "a b": 4, "ab": 5}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None,
            "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [["a", " "], ["a ", "b"], ["a", "b"]]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    want = Backend.from_file(str(path)).encode("a bab").ids
    assert want == [4, 5]
    assert compact_tokenizer_json(path)
    assert json.loads(path.read_text(encoding="utf-8"))["model"]["merges"][1] == ["a ", "b"]
    assert Backend.from_file(str(path)).encode("a bab").ids == want

