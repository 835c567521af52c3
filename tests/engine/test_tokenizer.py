"""Tokenizer: GGUF and HF-folder loading, the GGUF cache, chat template and stop token ids.

References are independent of ``localchat.engine.tokenizer``: the chat template is read from
the GGUF metadata with the ``gguf`` package and rendered with jinja2 directly; token ids come
from transformers' own calls (``convert_tokens_to_ids``, ``tokenizer(...)``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from localchat.engine.errors import ModelLoadError, ModelNotFoundError
from localchat.engine.tokenizer import Tokenizer

MIXED = (
    "Hello, world! Ünïcödé façade — 你好，世界。日本語のテキスト 😀👍🏽👨‍👩‍👧 e\u0301\n"
    "def f(x):\n\treturn {'a': [x ** 2, \"s\"]}  # comment\n\n   trailing  spaces "
)
CORPUS = [MIXED, "", " ", "a", "\n\n\n", "  leading", "数学 math 🧮", "<|im_end|> literal"]


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_tokenizer_cold) -> tuple[Tokenizer, Path]:
    """(tokenizer, cache root), converted once per session (``tests/conftest.py``)."""
    return smollm2_tokenizer_cold


@pytest.fixture
def smollm2(smollm2_loaded: tuple[Tokenizer, Path]) -> Tokenizer:
    return smollm2_loaded[0]


@pytest.fixture
def cache_root(smollm2_loaded: tuple[Tokenizer, Path]) -> Path:
    return smollm2_loaded[1]


def test_gguf_round_trip_mixed_text(smollm2: Tokenizer) -> None:
    for text in CORPUS[:-1]:
        ids = smollm2.encode(text)
        assert smollm2.decode(ids) == text
        assert ids == smollm2.hf(text, add_special_tokens=False)["input_ids"]
    assert len(smollm2.encode(MIXED)) > 20


def test_chat_template_matches_gguf_metadata(smollm2: Tokenizer, smollm2_gguf: Path) -> None:
    import gguf
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    reader = gguf.GGUFReader(smollm2_gguf)
    template = reader.fields["tokenizer.chat_template"].contents()
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 你好?"},
    ]
    expected = env.from_string(template).render(messages=messages, add_generation_prompt=True)
    assert expected.endswith("<|im_start|>user\nAnd 你好?<|im_end|>\n<|im_start|>assistant\n")
    assert smollm2.render_chat_template(messages) == expected
    ids = smollm2.apply_chat_template(messages)
    assert ids == smollm2.hf(expected, add_special_tokens=False)["input_ids"]
    assert smollm2.decode(ids, skip_special_tokens=False) == expected
    assert ids.count(smollm2.hf.convert_tokens_to_ids("<|im_start|>")) == 5


def test_stop_ids_and_properties(smollm2: Tokenizer) -> None:
    im_end = smollm2.hf.convert_tokens_to_ids("<|im_end|>")
    assert im_end in smollm2.stop_token_ids
    assert smollm2.eos_token_id in smollm2.stop_token_ids
    assert smollm2.end_of_turn_token() == "<|im_end|>"
    assert smollm2.vocab_size == len(smollm2.hf) == 49152
    assert im_end in smollm2.all_special_ids
    assert smollm2.bos_token_id == smollm2.hf.bos_token_id


def test_gguf_cache_is_identical_and_used(smollm2: Tokenizer, smollm2_gguf: Path,
                                          cache_root: Path) -> None:
    entries = list((cache_root / "gguf-tokenizers").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")
    start = time.perf_counter()
    cached = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache_root)
    warm = time.perf_counter() - start
    print(f"GGUF tokenizer: cold {smollm2.cold_seconds:.2f} s, cached {warm:.2f} s")
    assert cached.loaded_from_cache
    assert warm < smollm2.cold_seconds  # type: ignore[attr-defined]
    for text in CORPUS:
        assert cached.encode(text) == smollm2.encode(text)
    assert cached.stop_token_ids == smollm2.stop_token_ids
    assert cached.vocab_size == smollm2.vocab_size
    msgs = [{"role": "user", "content": MIXED}]
    assert cached.apply_chat_template(msgs) == smollm2.apply_chat_template(msgs)


def test_damaged_cache_entry_is_rebuilt(smollm2: Tokenizer, smollm2_gguf: Path,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache mechanics only: the conversion itself is replaced by the already converted one."""
    import localchat.engine.tokenizer as tokenizer_module

    calls = []
    monkeypatch.setattr(tokenizer_module, "_load_gguf",
                        lambda path: calls.append(path) or smollm2.hf)
    first = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=tmp_path)
    assert not first.loaded_from_cache and len(calls) == 1
    (entry,) = (tmp_path / "gguf-tokenizers").iterdir()
    (entry / "tokenizer.json").write_text("{ not json")
    rebuilt = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=tmp_path)
    assert not rebuilt.loaded_from_cache and len(calls) == 2
    again = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=tmp_path)
    assert again.loaded_from_cache and len(calls) == 2
    assert again.encode(MIXED) == smollm2.encode(MIXED)


# ---------------------------------------------------------------- tiny offline tokenizers
def _tiny(special: list[str], *, template: str | None, eos: str, bos: str | None = None,
          add_bos: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with the given special tokens (no network)."""
    words = ["Hi", "there", "user", "assistant", "system", "\n", ":", " ", "Lc7Sentinel"]
    vocab = {w: i for i, w in enumerate(special + words + ["[UNK]"])}
    rust = RustTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Split(r"\s|:", behavior="isolated")
    rust.add_special_tokens(special)
    if add_bos and bos is not None:
        rust.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab[bos])]
        )
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=eos, bos_token=bos,
                                 unk_token="[UNK]")
    hf.chat_template = template
    return hf


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_qwen_style_two_stop_ids(tmp_path: Path) -> None:
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    _tiny(special, template=CHATML, eos="<|endoftext|>").save_pretrained(tmp_path)
    tok = Tokenizer.from_pretrained(tmp_path)
    ids = {t: tok.hf.convert_tokens_to_ids(t) for t in special}
    assert tok.stop_token_ids == {ids["<|endoftext|>"], ids["<|im_end|>"]}


def test_llama3_style_stop_ids_and_generation_config(tmp_path: Path) -> None:
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
    hf = _tiny(special, template=LLAMA3, eos="<|eot_id|>", bos="<|begin_of_text|>",
               add_bos=True)
    hf.save_pretrained(tmp_path)
    ids = {t: hf.convert_tokens_to_ids(t) for t in special}
    gen = {"eos_token_id": [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.stop_token_ids == {ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]}
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.count(ids["<|begin_of_text|>"]) == 1 and prompt[0] == ids["<|begin_of_text|>"]
    # a template without {{ bos_token }} still gets exactly one BOS from the tokenizer
    tok.hf.chat_template = LLAMA3.replace("{{ bos_token }}", "")
    tok2 = Tokenizer(tok.hf)
    prompt2 = tok2.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt2 == prompt


def test_no_template_falls_back_to_chatml(tmp_path: Path) -> None:
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(_tiny(special, template=None, eos="<|endoftext|>"))
    text = tok.render_chat_template([{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.hf.convert_tokens_to_ids("<|im_end|>") in tok.stop_token_ids


def test_corrupt_or_missing_tokenizer(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError) as info:
        Tokenizer.from_pretrained(bad, cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{ not json")
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelLoadError):
        Tokenizer.from_pretrained(folder)
    with pytest.raises(ModelNotFoundError):
        Tokenizer.from_pretrained(tmp_path / "missing.gguf")


NO_SYSTEM = (  # Gemma style: the template raises on a system message
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}"
)


def test_system_role_is_folded_into_the_first_user_turn() -> None:
    import warnings

    from localchat.engine.tokenizer import SystemPromptFoldedWarning

    special = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(_tiny(special, template=NO_SYSTEM, eos="<eos>", bos="<bos>"))
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": "there"}]
    expected = ("<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
                "<start_of_turn>assistant\nHi<end_of_turn>\n"
                "<start_of_turn>user\nthere<end_of_turn>\n<start_of_turn>assistant\n")
    for _ in range(2):  # the second time the template is known to reject the system role
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert tok.render_chat_template(msgs) == expected
        assert [w.category for w in caught] == [SystemPromptFoldedWarning]
        assert "\n" not in str(caught[0].message) and "system" in str(caught[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = tok.apply_chat_template(msgs)
    assert ids == tok.hf(expected, add_special_tokens=False)["input_ids"]
    assert msgs[1]["content"] == "Hi there"  # the caller's messages are not changed
    # no system message: no notice; a system message alone becomes a user message
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok.render_chat_template(msgs[1:])
    assert caught == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = tok.render_chat_template(msgs[:1])
    assert alone.startswith("<bos><start_of_turn>user\nBe brief.<end_of_turn>\n")


def test_templates_that_accept_the_system_role_are_untouched() -> None:
    import warnings

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(_tiny(special, template=CHATML, eos="<|endoftext|>"))
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = tok.render_chat_template(msgs)
    assert caught == []
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>")


def test_other_template_errors_still_raise() -> None:
    special = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    broken = "{{ raise_exception('Conversation roles must alternate') }}"
    tok = Tokenizer(_tiny(special, template=broken, eos="<eos>", bos="<bos>"))
    for msgs in ([{"role": "user", "content": "Hi"}],
                 [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]):
        with pytest.raises(ValueError, match="roles must alternate"):
            tok.render_chat_template(msgs)
