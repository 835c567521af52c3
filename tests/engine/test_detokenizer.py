"""IncrementalDetokenizer: streamed deltas equal the one-shot decode, and no split UTF-8 leaks.

Reference: the ``tokenizers`` backend's one-shot ``decode`` of all ids (and transformers'
``decode`` with clean-up off). Tokenizers: SmolLM2's byte-level BPE from its GGUF, and two
SentencePiece-style BPE tokenizers with byte fallback built here offline (Llama-2 style:
Prepend/Replace normalizer + Strip decoder; Mistral/newer style: Metaspace ``first``).
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from localchat.engine.detokenizer import IncrementalDetokenizer
from localchat.engine.tokenizer import Tokenizer

FRAGMENTS = [
    "Hello", " world", ", ", ". ", "!", "  ", "   ", "\n", "\n\n", "\t", "\t\t", "    ",
    "你好", "世界", "。", "日本語", "한국어", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "e\u0301", "n\u0303",
    "a\u0308\u0301", "def f(x):", "    return x", "{'k': [1, 2]}", "==", "->", "Ünï", "Ωμέγα",
    "<|im_end|>", "<s>", "</s>", "\u200b", "\r\n", "𝔘𝔫𝔦", "½", "x",
]
CHARS = "ab Z9 \n\t.,;:'\"-_(){}<>你界😀🎉é\u0301\u0308ß∑€\u00a0"
texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=CHARS, max_size=6)), max_size=14
).map("".join)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- tokenizers under test
@pytest.fixture(scope="session")
def smollm2(smollm2_tokenizer_cold) -> Tokenizer:
    """SmolLM2's GGUF tokenizer, converted once per session (``tests/conftest.py``)."""
    return smollm2_tokenizer_cold[0]


_SP_CORPUS = [
    "hello world this is a test of the tokenizer, with some code: def foo(x):\n    return x + 1\n",
    "The quick brown fox jumps over the lazy dog.  Tabs\tand newlines\n\n",
] * 4


def _byte_fallback_tokenizer(style: str) -> Tokenizer:
    """A small BPE with byte fallback: ``llama2`` (legacy) or ``metaspace`` (Mistral-style)."""
    base = RustTokenizer(models.BPE(unk_token="<unk>"))
    if style == "llama2":
        base.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
    else:
        base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=80, show_progress=False)
    base.train_from_iterator(_SP_CORPUS, trainer)
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    for byte in range(256):  # SentencePiece byte pieces are ordinary (non-special) tokens
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    rust = RustTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                                    byte_fallback=True, fuse_unk=True))
    rust.normalizer, rust.pre_tokenizer = base.normalizer, base.pre_tokenizer
    if style == "llama2":
        rust.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                          decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        rust.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
        )
    rust.add_special_tokens(["<unk>", "<s>", "</s>"])
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>")
    return Tokenizer(hf)


@pytest.fixture(scope="module")
def sp_llama2() -> Tokenizer:
    return _byte_fallback_tokenizer("llama2")


@pytest.fixture(scope="module")
def sp_metaspace() -> Tokenizer:
    return _byte_fallback_tokenizer("metaspace")


TOKENIZERS = ["smollm2", "sp_llama2", "sp_metaspace"]


# ---------------------------------------------------------------- helpers
def _stream(tok: Tokenizer, ids: list[int], cuts: list[int], *, skip: bool = True,
            use_decode_stream: bool = True) -> tuple[list[str], str]:
    """Feed ``ids`` in chunks ending at ``cuts``; return (deltas incl. flush, detok.text)."""
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip,
                                 use_decode_stream=use_decode_stream)
    deltas, start = [], 0
    for end in [*sorted(set(cuts)), len(ids)]:
        deltas.append(det.step(ids[start:end]))
        start = end
    if use_decode_stream:  # DecodeStream was used, not silently replaced by the fallback
        assert det._stream is not None
    deltas.append(det.flush())
    return deltas, det.text


def _check(tok: Tokenizer, ids: list[int], cuts: list[int], **kw: bool) -> None:
    skip = kw.get("skip", True)
    expected = tok.hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    deltas, text = _stream(tok, ids, cuts, **kw)
    assert "".join(deltas) == text == expected == tok.decode(ids, skip_special_tokens=skip)
    if "\ufffd" not in expected:
        assert not any("\ufffd" in d for d in deltas)


def _byte_level_token(byte: int) -> str:
    """GPT-2 byte-to-unicode mapping (the byte-level BPE alphabet), computed independently."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    if byte in printable:
        return chr(byte)
    return chr(256 + [b for b in range(256) if b not in printable].index(byte))


# ---------------------------------------------------------------- property tests
@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["DecodeStream", "window"])
@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(text=texts, data=st.data())
def test_stream_equals_one_shot_decode(name: str, use_decode_stream: bool, text: str,
                                       data: st.DataObject, request: pytest.FixtureRequest
                                       ) -> None:
    tok: Tokenizer = request.getfixturevalue(name)
    ids = tok.encode(text)
    if data.draw(st.booleans(), label="bos"):
        ids = [tok.bos_token_id, *ids]
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)), label="cuts")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    _check(tok, ids, cuts, skip=skip, use_decode_stream=use_decode_stream)


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["DecodeStream", "window"])
@SETTINGS
@given(data=st.data())
def test_byte_level_random_ids(smollm2: Tokenizer, use_decode_stream: bool,
                               data: st.DataObject) -> None:
    """Arbitrary ids (invalid UTF-8 included): still exactly the one-shot decode."""
    ids = data.draw(st.lists(st.one_of(st.integers(0, smollm2.vocab_size - 1),
                                       st.integers(0, 300)), max_size=24), label="ids")
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)), label="cuts")
    _check(smollm2, ids, cuts, skip=data.draw(st.booleans()), use_decode_stream=use_decode_stream)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_token_by_token_on_tricky_corpus(name: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(name)
    for text in [*FRAGMENTS, " leading space", "  two leading", "end  ", "a.b. c", "".join(
            FRAGMENTS)]:
        ids = tok.encode(text)
        _check(tok, ids, list(range(len(ids))))


# ---------------------------------------------------------------- exact scenarios
@pytest.mark.parametrize("use_decode_stream", [True, False])
def test_emoji_over_byte_tokens_is_held_back(smollm2: Tokenizer, use_decode_stream: bool) -> None:
    raw = "😀".encode()
    ids = [smollm2.hf.convert_tokens_to_ids(_byte_level_token(b)) for b in raw]
    assert smollm2.decode(ids) == "😀"
    det = IncrementalDetokenizer(smollm2, use_decode_stream=use_decode_stream)
    assert det.step(smollm2.encode("Hi")) == "Hi"
    assert [det.step([i]) for i in ids] == ["", "", "", "😀"]
    assert det.flush() == "" and det.text == "Hi😀"


@pytest.mark.parametrize("name", ["sp_llama2", "sp_metaspace"])
def test_byte_fallback_pieces_are_held_back(name: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(name)
    ids = tok.encode("ok 中")
    tokens = tok.hf.convert_ids_to_tokens(ids)
    assert tokens[-3:] == ["<0xE4>", "<0xB8>", "<0xAD>"]
    det = IncrementalDetokenizer(tok)
    deltas = [det.step([i]) for i in ids]
    assert deltas[-3:] == ["", "", "中"] and "".join(deltas) == "ok 中"


@pytest.mark.parametrize("use_decode_stream", [True, False])
def test_flush_releases_an_invalid_tail(smollm2: Tokenizer, use_decode_stream: bool) -> None:
    ids = smollm2.encode("ab") + [smollm2.hf.convert_tokens_to_ids(_byte_level_token(b))
                                  for b in "😀".encode()[:2]]
    det = IncrementalDetokenizer(smollm2, use_decode_stream=use_decode_stream)
    assert det.step(ids) == "ab"
    tail = det.flush()
    assert "ab" + tail == smollm2.decode(ids) and "\ufffd" in tail
    assert det.flush() == ""
    with pytest.raises(RuntimeError):
        det.step([1])


@pytest.mark.parametrize("use_decode_stream", [True, False])
def test_flush_can_drop_a_cut_character(smollm2: Tokenizer, use_decode_stream: bool) -> None:
    """A reply cut by max_tokens inside an emoji ends at the last whole character."""
    partial = [smollm2.hf.convert_tokens_to_ids(_byte_level_token(b))
               for b in "😀".encode()[:3]]
    ids = smollm2.encode("pizza 🍕") + partial
    det = IncrementalDetokenizer(smollm2, use_decode_stream=use_decode_stream)
    streamed = "".join(det.step([i]) for i in ids)
    assert streamed + det.flush(drop_incomplete=True) == smollm2.decode(ids).rstrip("\ufffd")
    assert det.text == "pizza 🍕" and "\ufffd" not in det.text


def test_special_tokens_kept_or_skipped(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("Hi") + [2] + smollm2.encode(" there")
    assert "".join(_stream(smollm2, ids, [1, 2, 3])[0]) == "Hi there"
    assert "".join(_stream(smollm2, ids, [1, 2], skip=False)[0]) == "Hi<|im_end|> there"


def test_work_per_step_is_bounded(smollm2: Tokenizer) -> None:
    """O(new tokens) per step: the decode window does not grow with the output."""
    ids = smollm2.encode("The quick brown fox, 你好 😀, jumps.\n" * 200)
    det = IncrementalDetokenizer(smollm2, use_decode_stream=False)
    start = time.perf_counter()
    for i in ids:
        det.step([i])
        assert len(det._context) + len(det._pending) <= 8
    per_step = (time.perf_counter() - start) / len(ids)
    assert det.text + det.flush() == smollm2.decode(ids)
    assert per_step < 1e-3
