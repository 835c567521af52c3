"""Fail fast on a prompt no context of the model can hold, before any weight is loaded.

``ask`` renders the conversation with the model's cached tokenizer and checks it against the
model's trained positions (or ``--context``) from its cached config: a 40,000-token paste
into SmolLM2 fails in a fraction of a second instead of after the load. The engine's own
context is never larger, so this rejects only what would fail later.
"""

from __future__ import annotations

from typing import Any


def check_prompt_before_load(options: Any, session: Any, max_tokens: int | None) -> None:
    """Tokenize ``session`` (a ``ChatSession``) for ``options.model`` (a ``LoadOptions``)
    and check it leaves room for a reply within the model's positions. Models not on disk
    yet, or whose config or tokenizer cannot be read, are left to the load (which says what
    is wrong); the notices about dropped turns come from the real fit, after the load.

    Raises:
        ContextLengthError: the prompt cannot fit (exit 1).
    """
    from localchat.app.session import fit_prompt as fit
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model

    try:
        source = resolve_model(options.model, cache_dir=cache_dir(), download=False)
    except LocalchatError:  # not on disk (or not resolvable): the load says why
        return
    from localchat.engine.loader import load_model_config
    from localchat.engine.tokenizer import Tokenizer

    try:
        bound = load_model_config(source.path, cache_dir()).max_position_embeddings
        tokenizer = Tokenizer.from_pretrained(source.path, cache_dir=cache_dir())
    except LocalchatError:  # an unreadable model: the load names what is wrong with it
        return
    if getattr(options, "context", None):
        bound = min(bound, options.context)
    fit(session, tokenizer, bound, max_tokens)
