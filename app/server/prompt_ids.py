"""Prompt token ids of a request: a chat request's messages through the model's chat template,
a completion's ``prompt`` (text or token ids, ``prompt_forms.PROMPT_FORMS``) through the
tokenizer; a prompt that cannot be encoded is a 400 naming its field.

A prompt far longer than the context is refused after tokenizing a prefix of it, as ``ask``
refuses one (``session.far_too_long``): refusing a 4 MB paste costs what the context costs,
not what the paste would. The routes run these functions in a worker thread, off the event
loop, since an accepted prompt is still tokenized whole."""

from __future__ import annotations

import warnings
from typing import Any

from localchat.app.server.errors import APIError
from localchat.app.server.protocol import ChatCompletionRequest
from localchat.app.session import far_too_long


def context_length_error(num_prompt: int, max_model_len: int, param: str,
                         about: int | None = None) -> APIError:
    """400 ``context_length_exceeded`` naming both numbers; ``param`` is the request's
    prompt field (``messages`` or ``prompt``). With ``about`` the prompt was measured on a
    prefix: ``num_prompt`` is a lower bound and ``about`` the estimate of the whole."""
    size = f"{num_prompt} tokens" if about is None else (
        f"more than {num_prompt} tokens (about {about} in all, measured on a prefix)")
    return APIError(400, f"the prompt is {size} but the context holds "
                    f"{max_model_len} tokens (prompt + reply)",
                    param=param, code="context_length_exceeded")


def render_chat(tokenizer: Any, body: ChatCompletionRequest, max_model_len: int) -> list[int]:
    """Prompt token ids of the request's messages, by the model's chat template.

    Raises:
        APIError: 400 ``context_length_exceeded`` for a message far longer than
            ``max_model_len`` (measured on a prefix); 400 ``invalid_value`` when the
            template rejects the messages.
    """
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in body.messages]

    def count(part: str) -> int:  # a prefix of one message, rendered alone
        return len(_chat_ids(tokenizer, [{"role": "user", "content": part}]))

    far = far_too_long([m["content"] for m in messages], max_model_len - 1, count)
    if far is not None:
        raise context_length_error(far[0], max_model_len, "messages", about=far[1])
    return _chat_ids(tokenizer, messages)


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a folded system prompt is not the client's error
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise APIError(400, f"the messages cannot be rendered: {exc}", param="messages",
                       code="invalid_value") from None
    return [int(t) for t in ids]


def encode_prompt(tokenizer: Any, prompt: Any, max_model_len: int) -> list[int]:
    """Token ids of a completion ``prompt`` (already in one of ``PROMPT_FORMS``): ids are
    checked against the vocabulary, text is encoded with the special tokens.

    Raises:
        APIError: 400 ``context_length_exceeded`` for a text far longer than
            ``max_model_len`` (measured on a prefix); 400 ``invalid_value`` for an id
            outside the vocabulary or a text that is empty or encodes to nothing.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        vocab = getattr(tokenizer, "vocab_size", None)
        if vocab is not None and max(prompt) >= vocab:
            raise APIError(400, f"token id {max(prompt)} is outside the vocabulary "
                           f"(size {vocab})", param="prompt", code="invalid_value")
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    if not text:
        raise APIError(400, "'prompt' is empty", param="prompt", code="invalid_value")

    def count(part: str) -> int:
        return len(tokenizer.encode(part, add_special_tokens=True))

    far = far_too_long([text], max_model_len - 1, count)
    if far is not None:
        raise context_length_error(far[0], max_model_len, "prompt", about=far[1])
    ids = tokenizer.encode(text, add_special_tokens=True)
    if not ids:
        raise APIError(400, "'prompt' encodes to no tokens", param="prompt",
                       code="invalid_value")
    return ids
