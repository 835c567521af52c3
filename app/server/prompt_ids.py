"""Prompt token ids of a request: a chat request's messages through the model's chat template,
a completion's ``prompt`` (text or token ids, ``prompt_forms.PROMPT_FORMS``) through the
tokenizer; a prompt that cannot be encoded is a 400 naming its field."""

from __future__ import annotations

import warnings
from typing import Any

from localchat.app.server.errors import APIError
from localchat.app.server.protocol import ChatCompletionRequest


def render_chat(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """Prompt token ids of the request's messages, by the model's chat template."""
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in body.messages]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a folded system prompt is not the client's error
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise APIError(400, f"the messages cannot be rendered: {exc}", param="messages",
                       code="invalid_value") from None
    return [int(t) for t in ids]


def encode_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """Token ids of a completion ``prompt`` (already in one of ``PROMPT_FORMS``): ids are
    checked against the vocabulary, text is encoded with the special tokens."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        vocab = getattr(tokenizer, "vocab_size", None)
        if vocab is not None and max(prompt) >= vocab:
            raise APIError(400, f"token id {max(prompt)} is outside the vocabulary "
                           f"(size {vocab})", param="prompt", code="invalid_value")
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    if not text:
        raise APIError(400, "'prompt' is empty", param="prompt", code="invalid_value")
    ids = tokenizer.encode(text, add_special_tokens=True)
    if not ids:
        raise APIError(400, "'prompt' encodes to no tokens", param="prompt",
                       code="invalid_value")
    return ids
