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


# -- context overflow ------------------------------------------------------------------------


def long_session(pairs: int, system: str | None = "SYS") -> ChatSession:
    session = ChatSession(system=system)
    for i in range(pairs):
        session.add_user(f"Q{i:02d}")
        session.add_assistant(f"A{i:02d}")
    session.add_user("LAST")
    return session


def rendered(system: str | None, kept_pairs: range, last: str = "LAST") -> str:
    """Independent reference of RecordingTokenizer's rendering of a truncated session."""
    text = f"system:{system}|" if system else ""
    for i in kept_pairs:
        text += f"user:Q{i:02d}|assistant:A{i:02d}|"
    return text + f"user:{last}|assistant:"


def test_no_limit_or_a_roomy_limit_keeps_everything():
    session = long_session(5)
    full = rendered("SYS", range(5))
    for limit in (None, len(full), 10_000):
        assert decode(session.to_prompt_token_ids(RecordingTokenizer(), limit)) == full
        assert session.last_dropped_turns == 0


@pytest.mark.parametrize("pairs", [1, 2, 7, 40])
@pytest.mark.parametrize("system", ["SYS", None])
def test_oldest_pairs_are_dropped_whole_until_it_fits(pairs, system):
    session = long_session(pairs, system)
    for keep in range(pairs + 1):  # the limit that fits exactly the last `keep` pairs
        expected = rendered(system, range(pairs - keep, pairs))
        for slack in (0, 1):  # one token short of the next longer rendering still keeps `keep`
            tok = RecordingTokenizer()
            ids = session.to_prompt_token_ids(tok, len(expected) + slack)
            assert decode(ids) == expected
            assert len(ids) <= len(expected) + slack
            assert session.last_dropped_turns == pairs - keep
            assert len(tok.calls) <= 3 + pairs.bit_length()  # full, minimal, binary search
    assert len(session.messages) == 2 * pairs + 1  # the stored conversation is untouched


def test_system_plus_latest_too_long_is_a_context_length_error():
    from localchat.engine.errors import ContextLengthError

    session = long_session(3)
    minimal = rendered("SYS", range(0))
    with pytest.raises(ContextLengthError) as info:
        session.to_prompt_token_ids(RecordingTokenizer(), len(minimal) - 1)
    msg = str(info.value)
    assert "\n" not in msg and str(len(minimal)) in msg and str(len(minimal) - 1) in msg
    assert "system prompt" in msg
    solo = ChatSession()
    solo.add_user("x" * 50)
    with pytest.raises(ContextLengthError,
                       match=r"latest message takes \d+ tokens in the chat template"):
        solo.to_prompt_token_ids(RecordingTokenizer(), 20)


def test_turn_groups_keep_consecutive_messages_together():
    """A user message without a reply (interrupted) and a leading assistant greeting are whole
    groups too; messages after the latest user message are kept."""
    session = ChatSession(system="S")
    session.add_assistant("hello")
    session.add_user("u1")
    session.add_user("u2")
    session.add_assistant("a2")
    session.add_user("u3")
    from localchat.engine.errors import ContextLengthError

    tok = RecordingTokenizer()
    seen = set()
    for limit in range(1, 200):
        try:
            ids = session.to_prompt_token_ids(tok, limit)
        except ContextLengthError:
            continue
        seen.add((decode(ids), session.last_dropped_turns))
    kept = sorted(seen, key=lambda t: t[1])
    assert [t[0] for t in kept] == [
        "system:S|assistant:hello|user:u1|user:u2|assistant:a2|user:u3|assistant:",
        "system:S|user:u1|user:u2|assistant:a2|user:u3|assistant:",
        "system:S|user:u2|assistant:a2|user:u3|assistant:",
        "system:S|user:u3|assistant:",
    ]
    assert [t[1] for t in kept] == [0, 1, 2, 3]


def test_truncation_with_the_real_smollm2_tokenizer(smollm2_tokenizer_cold):
    """Reference: transformers renders each candidate (the last k pairs) itself; the session
    must keep the largest k that fits, with the system prompt and the latest message."""
    tok, _ = smollm2_tokenizer_cold
    system = "You are a careful assistant. Answer in one short sentence."
    pairs = [(f"Question number {i}: what is {i} times {i + 3}?",
              f"Answer number {i}: it is {i * (i + 3)}.") for i in range(24)]
    session = ChatSession(system=system)
    for q, a in pairs:
        session.add_user(q)
        session.add_assistant(a)
    session.add_user("Final question: what is the capital of France?")

    def reference(k: int) -> list[int]:
        msgs = [{"role": "system", "content": system}]
        for q, a in pairs[len(pairs) - k:]:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": session.messages[-1]["content"]})
        text = tok.hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return tok.hf(text, add_special_tokens=False)["input_ids"]

    full = reference(len(pairs))
    assert session.to_prompt_token_ids(tok, len(full)) == full
    limit = len(full) * 2 // 5
    keep = max(k for k in range(len(pairs) + 1) if len(reference(k)) <= limit)
    assert 0 < keep < len(pairs)
    ids = session.to_prompt_token_ids(tok, limit)
    assert len(ids) <= limit
    assert ids == reference(keep)
    assert session.last_dropped_turns == len(pairs) - keep
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.count(system) == 1 and text.count("Final question") == 1
    for i, (q, a) in enumerate(pairs):
        kept = i >= len(pairs) - keep
        assert (q in text, a in text) == (kept, kept), i
    from localchat.engine.errors import ContextLengthError

    with pytest.raises(ContextLengthError):
        session.to_prompt_token_ids(tok, len(reference(0)) - 1)


@pytest.mark.parametrize("kind", ["base64 lines", "one word", "cjk", "spaces", "prose"])
def test_a_far_too_long_message_is_refused_on_a_prefix(smollm2_tokenizer_cold, kind):
    """A message far longer than the budget is refused after tokenizing a prefix only
    (``_far_too_long``): the count it reports is a lower bound of the real one (the whole
    conversation rendered by SmolLM2's tokenizer), and a message whose whole fits is never
    refused by it (runs of spaces: several characters per token)."""
    import base64
    import random

    from localchat.app import session as session_module
    from localchat.engine.errors import ContextLengthError

    tok, _cache = smollm2_tokenizer_cold
    budget = 200
    size = 20 * session_module._PREFIX_CHARS_PER_TOKEN * budget
    rng = random.Random(kind)
    text = {
        "base64 lines": "\n".join(base64.b64encode(rng.randbytes(57)).decode()
                                  for _ in range(size // 77)),
        "one word": "".join(rng.choice("abcdefghij") for _ in range(size)),
        "cjk": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(size)),
        "spaces": " " * size + "end",
        "prose": " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat."])
                          for _ in range(size // 4)),
    }[kind]
    s = ChatSession(system="Be brief.")
    s.add_user(text)
    whole = len(session_module._render_ids(tok, s.to_messages(), True))
    far = session_module._far_too_long(tok, s.to_messages(), budget, True)
    if far is None:
        assert kind == "spaces" and whole <= 20 * budget
        return
    bound, about = far
    assert budget < bound <= whole
    # the estimate scales the prefix's count by length: within a quarter of the real count
    # for these uniform texts (a prefix is a fair sample), where the bound is 10-20x under it
    assert 0.75 * whole <= about <= 1.25 * whole, (about, whole)
    with pytest.raises(ContextLengthError, match=f"take more than {bound} tokens, more than "
                                                 f"the {budget} available for the prompt; "
                                                 f"shorten it \\(about {about:,} tokens in all"):
        s.to_prompt_token_ids(tok, budget)
