"""The forms a ``/v1/completions`` ``prompt`` may take, and one clear line for any other:
a string, a one-string array, or a non-empty array of token ids. Checked before pydantic's
own validation (whose "Input should be a valid string" named none of what was wrong); the
vocabulary's upper bound is checked by the route, which has the tokenizer."""

from __future__ import annotations

from typing import Any

PROMPT_FORMS = ("a string, a one-string array, or a non-empty array of token ids "
                "(non-negative integers in the vocabulary)")


def check_prompt(value: Any) -> None:
    """Refuse a completion ``prompt`` that is none of ``PROMPT_FORMS``, saying what is wrong
    (empty array, negative token id, mixed types, several strings) and what is accepted. The
    vocabulary's upper bound is checked by the route, which has the tokenizer.

    Raises:
        ValueError: a one-line message starting with ``'prompt'``.
    """
    if isinstance(value, str):
        return
    # ValueError, not TypeError: pydantic turns only the former into a validation error.
    if not isinstance(value, list):
        raise ValueError(f"'prompt' is {_json_kind(value)}; give {PROMPT_FORMS}")  # noqa: TRY004
    if not value:
        raise ValueError(f"'prompt' is an empty array; give {PROMPT_FORMS}")
    if all(isinstance(v, str) for v in value):
        if len(value) > 1:
            raise ValueError(f"'prompt' holds {len(value)} strings; this server takes one "
                             f"prompt per request: give {PROMPT_FORMS}")
        return
    for i, v in enumerate(value):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"'prompt' mixes types: item {i} is {_json_kind(v)} in an "  # noqa: TRY004
                             f"array of token ids; give {PROMPT_FORMS}")
        if v < 0:
            raise ValueError(f"'prompt' holds the negative token id {v} (item {i}); give "
                             f"{PROMPT_FORMS}")


def _json_kind(value: Any) -> str:
    """``value``'s JSON type, with an article (``a string``, ``null``, ``an object``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
