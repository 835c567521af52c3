"""``ask``'s side of the history (``store.py``): open the conversation to continue, commit the
user's message before generation starts, commit the reply after it.

The history never costs an answer: a store that cannot be opened or written is said once on
stderr (``this turn is not saved: ...``) and the turn goes on unsaved, except when the user
asked to continue a conversation, which needs it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from localchat.app import cli_io


def open_history(args: Any) -> tuple[Any, Any]:
    """The store (None with ``--no-save``) and the conversation to continue (or None) for
    ``args`` (an ``AskArgs``: ``continue_``, ``conversation``, ``no_save``).

    Raises:
        LocalchatError: the store cannot be opened while continuing, or the conversation
            does not exist.
    """
    continuing = bool(args.continue_ or args.conversation)
    if args.no_save and not continuing:
        return None, None
    from localchat.app.store import Store
    from localchat.engine.errors import LocalchatError

    try:
        store = Store()
    except LocalchatError as exc:
        if continuing:
            raise
        not_saved(exc)  # answering matters more than saving
        return None, None
    try:
        conv = None
        if args.conversation:
            conv = store.get_conversation(args.conversation)
        elif args.continue_:
            conv = store.most_recent(with_messages=True)
            if conv is None:
                cli_io.note("no earlier conversation to continue; starting a new one")
    except BaseException:
        store.close()
        raise
    if args.no_save:
        store.close()
        return None, conv
    return store, conv


def stored_model(spec: str) -> str:
    """The model spec as the history keeps it: a local file or folder as its absolute, resolved
    path (so ``-c`` works from any folder); a catalog alias or Hub repo id as given."""
    from pathlib import Path

    path = Path(spec).expanduser()
    try:
        return str(path.resolve()) if path.exists() else spec
    except (OSError, RuntimeError):  # an unreadable path or a symlink loop: keep it as given
        return spec


def not_saved(exc: Exception) -> None:
    """The one stderr line saying this turn is not in the history, and why (the file, the
    reason and what to do: ``HistoryUnavailable``'s message)."""
    cli_io.warn(f"this turn is not saved: {exc}")


def save_user(store: Any, conv: Any, args: Any, model: str, system: str | None,
              text: str) -> tuple[str | None, int | None]:
    """Create (or update) the conversation and commit the user's message before generation
    starts; ``(conversation id, message id)``, or Nones when the history cannot be written
    (said on stderr)."""
    from localchat.app.store import HistoryUnavailable

    created = None
    try:
        if conv is None:
            conv = created = store.create_conversation(stored_model(model), system,
                                                       explicit(args.sampling))
        elif args.system and args.system != conv.system_prompt:
            store.update_conversation(conv.id, system_prompt=args.system)
        message = store.add_message(conv.id, "user", text)
    except HistoryUnavailable as exc:
        not_saved(exc)
        if created is not None:  # leave no empty conversation behind when possible
            with contextlib.suppress(Exception):
                store.delete_conversation(created.id)
        return None, None
    return conv.id, message.id


def drop_refused_turn(store: Any, message_id: int | None) -> None:
    """Take back the user message committed for a turn the server refused before any reply
    (a 4xx, e.g. a prompt too long for its context; ``BackendError.refused``): kept, it
    would be merged into every later turn of the conversation (``alternating``) and make each
    one fail the same way. The conversation goes too when it was created for this turn. A
    local prompt that does not fit is refused before anything is saved, so both paths agree.
    A failed write is one stderr line."""
    if store is None or message_id is None:
        return
    from localchat.app.store import HistoryUnavailable

    try:
        store.delete_message(message_id)
    except HistoryUnavailable as exc:
        not_saved(exc)


def save_reply(store: Any, conv_id: str | None, text: str, interrupted: bool,
               stats: dict[str, Any] | None, parent_id: int | None = None) -> None:
    """Commit the reply (``interrupted`` after Ctrl+C); a failed write is one stderr line."""
    if store is None or conv_id is None:
        return
    from localchat.app.store import HistoryUnavailable

    try:
        store.add_message(conv_id, "assistant", text, interrupted=interrupted, stats=stats,
                          parent_id=parent_id)
    except HistoryUnavailable as exc:  # the user's message is saved; the reply is not
        cli_io.warn(f"the reply is not saved: {exc}")


def alternating(stored: list[Any], text: str) -> list[tuple[str, str]]:
    """Earlier turns plus the new user message, as alternating (role, content) pairs: a user
    message left without a reply (a crash mid-reply) is joined to the next user message with a
    blank line, as chat templates may require alternating roles."""
    turns: list[tuple[str, str]] = []
    for role, content in [(m.role, m.content) for m in stored] + [("user", text)]:
        if role not in ("user", "assistant"):
            continue
        if turns and turns[-1][0] == role:
            turns[-1] = (role, turns[-1][1] + "\n\n" + content)
        else:
            turns.append((role, content))
    return turns


def explicit(knobs: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags given on the command line, JSON-ready (for the conversation row)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in knobs.items() if v is not None}
