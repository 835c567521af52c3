"""Options for loading the engine that come from ``--draft``, ``--num-speculative-tokens``,
``--quant`` and ``--context`` (or the settings), checked before any model is resolved or loaded.

``engine_loader.load`` turns them into an ``EngineConfig``. The weight format's and k's ranges
and defaults are the engine config's own (``QuantConfig``, ``SpeculativeConfig``):
``check_load_options`` builds those parts before any model is resolved and turns their
``ValueError`` into a usage error that names the flag (or config key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localchat.app.cli_io import CliUsageError

# The most sequences ``serve --max-num-seqs`` batches and ``plan --max-num-seqs`` plans for.
MAX_NUM_SEQS = 256
# The smallest context (tokens): one prompt token and one reply token.
MIN_CONTEXT = 2
CONTEXT_TOO_SMALL = (f"the context must hold at least {MIN_CONTEXT} tokens (one for the "
                     "prompt, one for the reply)")


def check_theme_flag(theme: str | None) -> None:
    """Raises ``CliUsageError`` (exit 2) when ``--theme`` names no theme (``config set
    theme`` refuses the same names; the TUI had opened anyway, with a notification)."""
    if theme is None:
        return
    from localchat.app.config_cli import theme_problem

    if (problem := theme_problem(theme)) is not None:
        raise CliUsageError(f"--theme {theme}: {problem}")


def check_max_num_seqs(value: int) -> None:
    """Raises ``CliUsageError`` (exit 2) unless ``1 <= value <= MAX_NUM_SEQS``."""
    if not 1 <= value <= MAX_NUM_SEQS:
        raise CliUsageError(f"--max-num-seqs {value}: must be between 1 and {MAX_NUM_SEQS}")


def check_model_flag(value: str | None) -> None:
    """Raises ``CliUsageError`` (exit 2) for ``-m/--model`` given as an empty or blank string
    (``-m "$MODEL"`` with the variable unset), which would otherwise fall back to the default
    model without a word. ``None`` (not given) passes."""
    if value is not None and not value.strip():
        raise CliUsageError("-m/--model needs a model name (see 'localchat models'); leave "
                            "it out for the default model")


def check_model_argument(value: str) -> None:
    """Raises ``CliUsageError`` (exit 2) for a MODEL argument (``plan``, ``pull``) given as an
    empty or blank string (``localchat pull "$MODEL"`` with the variable unset)."""
    if not value.strip():
        raise CliUsageError("MODEL is empty: name a model (see 'localchat models')")


TUI_NEEDS_A_TERMINAL = ("the chat TUI needs a terminal; use 'localchat chat --jsonl' or "
                        "'localchat ask'")


def tui_without_a_terminal(get_help: Callable[[], str] | None, *tui_flags: object) -> None:
    """``localchat`` (no command) or ``localchat chat`` (``get_help`` None) needs a terminal
    for the TUI; where stdin or stdout is none: ``CliUsageError`` (exit 2,
    ``TUI_NEEDS_A_TERMINAL``) for ``chat`` or when a TUI flag was given (``-m``, ``--theme``,
    ``--endpoint``, which the help would drop without a word), else the help and exit 0.
    Returns on a terminal."""
    import sys

    import typer

    from localchat.app.cli_io import stream_isatty

    if stream_isatty(sys.stdin) and stream_isatty(sys.stdout):
        return
    if get_help is None or any(flag is not None for flag in tui_flags):
        raise CliUsageError(TUI_NEEDS_A_TERMINAL)
    typer.echo(get_help())
    raise typer.Exit(0)


def bad_value_error(origin: str) -> type[Exception]:
    """The error for a bad value, by where it came from (``origin``, as ``flag_or_setting``
    names it): ``CliUsageError`` (exit 2) for a flag (``--quant``, ``--context``),
    ``SettingError`` (exit 1) for a setting (``config.toml``, ``LOCALCHAT_*``)."""
    from localchat.app.settings import SettingError

    return CliUsageError if origin.startswith("-") else SettingError


def check_trained_context(origin: str, context: int | None, name: str, trained: int) -> None:
    """Raises ``bad_value_error(origin)`` when ``context`` (tokens) is above ``trained``, the
    model ``name``'s trained context (``ask``, ``serve`` and ``plan`` say it alike)."""
    if context is not None and context > trained:
        raise bad_value_error(origin)(f"{origin} {context}: {name} was trained for a context "
                                      f"of at most {trained} tokens (use {trained} or less)")


def check_jsonl_only(draft: str | None, k: int | None, local: bool) -> None:
    """Raises ``CliUsageError`` (exit 2) when ``chat`` without ``--jsonl`` (the TUI) is given
    ``--draft``, ``--num-speculative-tokens`` or ``--local``: the TUI took them without a
    word (its draft is a conversation setting, Ctrl+S)."""
    for flag, value in (("--draft", draft), ("--num-speculative-tokens", k),
                        ("--local", local or None)):
        if value is not None:
            raise CliUsageError(f"{flag} applies with --jsonl; in the TUI, set the draft "
                                "under Ctrl+S")


@dataclass(frozen=True)
class LoadOptions:
    """What to load: ``model`` (a model spec), ``draft`` (a draft model spec for speculative
    decoding, ``auto`` for the catalog's pairing, or None), ``num_speculative_tokens`` (k, the
    most draft tokens per step; None: ``SpeculativeConfig``'s default) and ``quant``
    (``auto|native|none|fp8|int8|int4``), as the
    user gave them; ``context`` the context size in tokens (prompt + reply; None: the model's,
    at most 8192 on CPU); ``context_origin``, ``draft_origin`` and ``quant_origin`` say where
    those came from (the flag, or a setting: ``flag_or_setting``), named in errors."""

    model: str
    draft: str | None = None
    quant: str = "auto"
    num_speculative_tokens: int | None = None
    context: int | None = None
    context_origin: str = "--context"
    draft_origin: str = "--draft"
    quant_origin: str = "--quant"


def check_load_options(options: LoadOptions) -> None:
    """Refuse values the engine does not take, as the engine's config checks them; the
    message names where the value came from (``quant_origin``, ``context_origin``: the flag,
    or the setting, so the user knows what to change).

    Raises:
        CliUsageError: ``QuantConfig`` refuses ``quant``, ``fp8`` without a CUDA GPU of
            compute capability >= 8.9 (checked before any model loads),
            ``SpeculativeConfig`` refuses ``num_speculative_tokens`` (the engine's reason in
            the message), or ``context`` is below 1 (exit 2).
        SettingError: the same for a ``quant`` that came from the settings (exit 1, as for
            every bad setting).
    """
    from localchat.engine.config import QuantConfig, SpeculativeConfig

    bad_quant = bad_value_error(options.quant_origin)
    where = options.quant_origin
    try:
        QuantConfig(scheme=options.quant)
    except ValueError as exc:
        raise bad_quant(f"{where} {options.quant}: {exc}") from None
    if options.context is not None and options.context < MIN_CONTEXT:
        raise CliUsageError(f"{options.context_origin} {options.context}: {CONTEXT_TOO_SMALL}")
    if options.quant == "fp8":
        from localchat.engine.quant.schemes import fp8_supported

        if not fp8_supported("cuda"):
            raise bad_quant(f"{where} fp8: needs a CUDA GPU of compute capability 8.9 or "
                            "newer, and none is available (use int8 or int4)")
    k = options.num_speculative_tokens
    if k is not None:
        try:
            SpeculativeConfig(num_speculative_tokens=k)
        except ValueError as exc:
            raise CliUsageError(f"--num-speculative-tokens {k}: {exc}") from None


def context_choice(flag: int | None, settings: object,
                   spellings: tuple[str, ...] = ("--context", "-C")) -> tuple[int | None, str]:
    """The context size to use and where it came from: ``--context`` > ``LOCALCHAT_CONTEXT``
    > ``context`` in config.toml > None (the model's, at most 8192 on CPU). A flag is named
    as the user typed it (``typed_spelling`` of ``spellings``, the first one by default)."""
    value, origin = flag_or_setting(flag, settings, "context")
    return value, typed_spelling(spellings) if flag is not None else origin


def typed_spelling(spellings: tuple[str, ...], argv: list[str] | None = None) -> str:
    """Which of one option's ``spellings`` (long ones first, then a one-letter ``-X``) the
    command line used last (``--context 512``, ``--context=512``, ``-C 512``, ``-C512``), so
    an error names the flag the user typed; ``spellings[0]`` when none appears."""
    import sys

    found = spellings[0]
    for arg in (sys.argv[1:] if argv is None else argv):
        if arg == "--":
            break
        for spelling in spellings:
            long_form = spelling.startswith("--")
            if arg == spelling or (long_form and arg.startswith(spelling + "=")) or (
                    not long_form and arg.startswith(spelling) and not arg.startswith("--")):
                found = spelling
    return found


def flag_or_setting(flag: object, settings: object, name: str) -> tuple[object, str]:
    """The value of top-level setting ``name`` to use and where it came from: the flag
    (``--name``) when given, else the setting (``setting_origin``; None when unset)."""
    if flag is not None:
        return flag, f"--{name}"
    return getattr(settings, name, None), setting_origin(settings, name)


def setting_origin(settings: object, name: str) -> str:
    """How errors name top-level setting ``name`` where it came from: its environment
    variable (``LOCALCHAT_DRAFT``) or ``draft (config.toml)``."""
    source = getattr(settings, "sources", {}).get(name)
    return f"LOCALCHAT_{name.upper()}" if source == "env" else f"{name} (config.toml)"
