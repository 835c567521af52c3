"""ChatSession: message bookkeeping and rendering through a tokenizer's chat template."""

from __future__ import annotations

import pytest

from localchat.app.session import ChatSession


class RecordingTokenizer:
    """Renders messages as ``role:content|`` and encodes each character as its code point."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict], bool]] = []

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.calls.append(([dict(m) for m in messages], add_generation_prompt))
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        if add_generation_prompt:
            text += "assistant:"
        return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_system_message_comes_first_and_turns_keep_order():
    session = ChatSession(system="Be brief.")
    session.add_user("hi")
    session.add_assistant("hello")
    session.add_user("bye")
    tok = RecordingTokenizer()
    ids = session.to_prompt_token_ids(tok)
    assert decode(ids) == "system:Be brief.|user:hi|assistant:hello|user:bye|assistant:"
    assert tok.calls[0][1] is True
    # The system prompt is not stored among the turns.
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user"]


def test_no_system_message_when_unset_or_empty():
    for system in (None, ""):
        session = ChatSession(system=system)
        session.add_user("hi")
        assert session.to_messages() == [{"role": "user", "content": "hi"}]


def test_add_generation_prompt_can_be_turned_off():
    session = ChatSession()
    session.add_user("hi")
    ids = session.to_prompt_token_ids(RecordingTokenizer(), add_generation_prompt=False)
    assert decode(ids) == "user:hi|"


def test_to_messages_returns_copies():
    session = ChatSession()
    session.add_user("hi")
    session.to_messages()[0]["content"] = "changed"
    assert session.messages[0]["content"] == "hi"


def test_empty_session_and_bad_content_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        ChatSession().to_prompt_token_ids(RecordingTokenizer())
    with pytest.raises(TypeError):
        ChatSession().add_user(None)  # type: ignore[arg-type]


def test_clear_keeps_the_system_prompt():
    session = ChatSession(system="sys")
    session.add_user("hi")
    session.clear()
    assert session.messages == []
    assert session.to_messages() == [{"role": "system", "content": "sys"}]


def test_accepts_a_raw_transformers_tokenizer():
    """transformers returns a BatchEncoding (a mapping with input_ids); ids must match its own
    rendering-then-encoding of the same template."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<s>", "user", "assistant", "system", "hello", "there", "sys"]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    hf.chat_template = (
        "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant {% endif %}"
    )
    session = ChatSession(system="sys")
    session.add_user("hello there")
    ids = session.to_prompt_token_ids(hf)
    text = hf.apply_chat_template(session.to_messages(), add_generation_prompt=True, tokenize=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ids == [
        vocab[w]
        for w in ["<s>", "system", "sys", "<s>", "user", "hello", "there", "<s>", "assistant"]
    ]
