"""A prompt that click read as a short option with its value, said where it causes an error.

POSIX option syntax lets a short option that takes a value take the rest of its word:
``ask -mqwen`` is ``ask -m qwen``. So ``localchat ask "-make it short"`` is ``-m "ake it
short"`` with no prompt, ``ask "-sorry, again"`` sets the system prompt to ``"orry, again"``,
and ``ask "-Count to 3"`` gives ``--context`` the value ``"ount to 3"``. click cannot tell
such a prompt from options, so the error that follows (no prompt, no such model, a bad
``--context``) would not say what happened; :func:`with_misread_prompt` adds that to it.
"""

from __future__ import annotations

from collections.abc import Sequence

# ask's short options that take a value (cli.py): model, system prompt, context size
VALUE_SHORT_OPTIONS = ("-m", "-s", "-C")


def misread_prompt(args: Sequence[str]) -> tuple[str, str, str] | None:
    """``(word, option, value)`` for the last word of ``ask``'s arguments (``args`` as given
    after the program name; before any ``--``) that is a value-taking short option with its
    value attached (``"-make it short"`` -> ``("-make it short", "-m", "ake it short")``),
    where no word after it can be the prompt (``ask -mqwen Hi`` gave one: ``Hi``; a word
    after a ``--long`` option is taken for its value); None when there is none or the
    command is not ``ask``."""
    if not args or args[0] != "ask":
        return None
    found, after = None, False  # after: a word that may be the prompt follows ``found``
    words = list(args[1:])
    words = words[:words.index("--")] if "--" in words else words
    for i, word in enumerate(words):
        if len(word) > 2 and word[:2] in VALUE_SHORT_OPTIONS:
            found, after = (word, word[:2], word[2:]), False
        elif found and not word.startswith("-") and not (
                i and words[i - 1].startswith("--") and "=" not in words[i - 1]):
            after = True
    return None if after else found


def remember(args: Sequence[str]) -> None:
    """Keep this run's arguments (``cli_io.run_cli``, once per command) for
    :func:`warn_misread_system_prompt`, which runs where only the parsed options are known."""
    global _ARGS
    _ARGS = tuple(args)


_ARGS: tuple[str, ...] = ()


def warn_misread_system_prompt() -> None:
    """``echo text | localchat ask "-sorry"`` runs (the piped text is the prompt) with the
    system prompt ``"orry"``: no error follows to name it in, so ``ask`` calls this once
    its prompt came from stdin alone, and a warning line says it before the answer. Nothing
    for the other options, whose misreading ends in an error (:func:`with_misread_prompt`)."""
    found = misread_prompt(_ARGS)
    if found is not None and found[1] == "-s":
        from localchat.app.cli_io import warn

        word, option, value = found
        warn(f"'{word}' was read as {option} '{value}' (the system prompt); a prompt that "
             f"starts with '-' goes after --: localchat ask [OPTIONS] -- \"{word}\"")


def with_misread_prompt(args: Sequence[str], message: str) -> str:
    """``message`` (an error line of ``ask``) with what happened to a prompt that starts with
    ``-`` appended, where the error is one such a prompt causes: no prompt left, or the
    message quotes the option's value (no such model) or names the option (a bad
    ``--context``); before a closing ``(see '... --help')``. Otherwise ``message`` unchanged."""
    found = misread_prompt(args)
    if found is None:
        return message
    word, option, value = found
    if not (message.startswith("no prompt") or value in message or f"'{option}'" in message):
        return message
    head, see, tail = message.rpartition(" (see '")  # the help pointer stays last
    if not see:
        head, tail = message, ""
    return (f"{head}; '{word}' was read as {option} '{value}': a prompt that starts with '-' "
            f"goes after --: localchat ask [OPTIONS] -- \"{word}\"" + (see + tail if see else ""))
