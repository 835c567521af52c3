"""From the user's load options (model, ``--draft``, ``--quant``, ``--context``) to a running
engine.

``load`` is the one load path of every front end: it resolves the model and its draft
(``--draft auto`` picks the catalog's natural draft for the target, e.g.
``qwen2.5-coder-1.5b`` -> ``qwen2.5-coder-0.5b``), checks the context against the model,
builds the ``EngineConfig`` (weight format, speculative decoding, context) and loads a
synchronous ``LLMEngine`` (``ask``, ``chat --jsonl``) or an ``AsyncLLMEngine`` (the TUI,
``app/tui/engine_host.py``). Progress lines go to stderr, or to a ``progress`` callback (the
TUI owns the terminal). No engine logic lives here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localchat.app import cli_io
from localchat.app.load_options import LoadOptions
from localchat.engine.errors import LocalchatError

NO_DRAFT = ("", "none", "off")
NGRAM = "ngram"  # --draft ngram: prompt lookup drafts, no draft model (spec_decode/ngram.py)
Progress = Callable[[str], None]


class DraftChoiceError(LocalchatError):
    """``--draft auto`` for a model without a catalog draft, or a draft equal to the model: a
    bad flag value, so the CLI exits 2 (``exit_code``) as for any other; 1 when the draft came
    from the settings (a bad setting, as for every other one)."""

    exit_code = cli_io.EXIT_USAGE

    def __init__(self, message: str, origin: str = "--draft") -> None:
        super().__init__(message)
        if not origin.startswith("--"):
            self.exit_code = cli_io.EXIT_RUNTIME


def draft_spec(options: LoadOptions, target_alias: str | None) -> str | None:
    """The draft model spec to load, or ``None`` for no speculation.

    Raises ``DraftChoiceError`` for ``auto`` on a model the catalog pairs with no draft.
    """
    draft = (options.draft or "").strip()
    if draft.lower() in NO_DRAFT:
        return None
    if draft.lower() != "auto":
        return draft
    from localchat.engine.hub.catalog import resolve_alias

    entry = resolve_alias(target_alias) if target_alias else None
    if entry is None or not entry.draft:
        name = target_alias or options.model
        raise DraftChoiceError(f"{options.draft_origin} auto: no natural draft model is known "
                               f"for {name}; name one with --draft MODEL", options.draft_origin)
    return entry.draft


@contextlib.contextmanager
def naming_the_draft(origin: str) -> Iterator[None]:
    """A ``LocalchatError`` raised inside (the draft model cannot be resolved, downloaded or
    described) is raised again, of the same class, with its message led by ``origin`` (the
    flag or setting that named the draft, ``LoadOptions.draft_origin``), so the user knows
    the failing model is the draft."""
    try:
        yield
    except DraftChoiceError:
        raise
    except LocalchatError as exc:
        raise type(exc)(f"{origin}: {exc}") from exc


def refuse_the_model_itself(draft: str, draft_path: Path | str, model_path: Path | str,
                            origin: str) -> None:
    """Raises ``DraftChoiceError`` when the draft's file or folder is the model's (links too)."""
    if Path(draft_path).resolve() == Path(model_path).resolve():
        raise DraftChoiceError(f"{origin} {draft}: the draft is the model itself", origin)


def resolve_draft(options: LoadOptions, source: Any, progress: Progress | None
                  ) -> tuple[str | None, Path | str | None]:
    """``(draft spec, what engine_config takes)`` for the target ``source``: ``(None, None)``
    without speculation, ``("ngram", NGRAM)`` for prompt lookup, else the draft model's
    spec and local path (downloaded when needed, ``progress`` getting the lines).

    Raises:
        DraftChoiceError: ``auto`` with no known pairing, or the draft is the model itself.
        LocalchatError: the draft model cannot be resolved (the message starts with
            ``options.draft_origin``).
    """
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    draft = draft_spec(options, source.alias)
    if draft is None or draft.lower() == NGRAM:
        return (None, None) if draft is None else (NGRAM, NGRAM)
    with naming_the_draft(options.draft_origin):
        draft_source = resolve_model(draft, cache_dir=cache_dir(), download=True,
                                     progress=progress)
    refuse_the_model_itself(draft, draft_source.path, source.path, options.draft_origin)
    return draft, draft_source.path


def on_disk(spec: str) -> Any:
    """The ``ModelSource`` of ``spec`` when it is on disk, None when it names a model still to
    download (a catalog alias, Hub repo id or Hub GGUF file such as ``org/name:Q4_K_M`` not
    cached yet).

    Raises:
        ModelNotFoundError: ``spec`` names no model (``resolve_model``'s message, as ``ask``
            says it).
    """
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import ModelNotFoundError
    from localchat.engine.hub.catalog import resolve_alias
    from localchat.engine.hub.resolve import parse_gguf_spec, parse_repo_spec, resolve_model

    try:
        return resolve_model(spec, cache_dir=cache_dir(), download=False)
    except ModelNotFoundError:
        text = spec.strip()
        if text and not Path(text).expanduser().exists() and (
                resolve_alias(text) is not None or parse_repo_spec(text) is not None
                or parse_gguf_spec(text) is not None):
            return None  # the load fetches it
        raise


def check_before_load(options: LoadOptions) -> None:
    """``load``'s refusals that need no download and no weights, for a front end that must not
    give up a running engine for a value the load would refuse (the TUI's settings):
    ``check_load_options``, a model or draft that names no model, ``auto`` without a known
    pairing and a draft that is the model itself (when both are on disk). A model still to
    download passes; its load may fail later.

    Raises:
        CliUsageError, SettingError: as ``check_load_options``.
        ModelNotFoundError: the model names no model; the draft's message starts with
            ``options.draft_origin``.
        DraftChoiceError: as ``resolve_draft``.
    """
    from localchat.app.load_options import check_load_options

    check_load_options(options)
    source = on_disk(options.model)
    if source is None:  # its alias, draft pairing and path are known after the download
        return
    draft = draft_spec(options, source.alias)
    if draft is None or draft.lower() == NGRAM:
        return
    with naming_the_draft(options.draft_origin):
        draft_source = on_disk(draft)
    if draft_source is not None:
        refuse_the_model_itself(draft, draft_source.path, source.path, options.draft_origin)


def engine_config(options: LoadOptions, draft_path: Path | str | None,
                  repack_progress: bool = False) -> Any:
    """``EngineConfig`` for ``options``: the weight format, speculative decoding (the draft
    model's local path, or :data:`NGRAM` for prompt lookup) and the context
    (``SchedulerConfig.max_model_len``: the planner sizes the KV pool from it).
    ``repack_progress``: a progress line on stderr while a first load repacks a GGUF. A
    ``num_speculative_tokens`` without a draft is said in a note on stderr (it does nothing).
    The KV cache's element type is the ``kv_cache_dtype`` setting's (``auto`` unset).

    Raises:
        SettingError: the ``kv_cache_dtype`` setting is not a known type, or is one this
            engine cannot read (a 16-bit cache under fp32 activations is CPU-only).
    """
    from localchat.engine.config import (
        CacheConfig,
        EngineConfig,
        QuantConfig,
        SchedulerConfig,
        SpeculativeConfig,
    )

    if draft_path == NGRAM:
        spec = SpeculativeConfig(method="ngram")
    else:
        spec = SpeculativeConfig(
            draft_model=str(draft_path) if draft_path is not None else None)
    if options.num_speculative_tokens is not None:  # else the engine's default k
        spec = dataclasses.replace(spec, num_speculative_tokens=options.num_speculative_tokens)
        if draft_path is None:
            cli_io.note("--num-speculative-tokens has no effect without a draft (--draft, or "
                        "'draft' in the settings)")
    # the first answer does not wait for the weight cache's write (the process waits at exit)
    quant = QuantConfig(scheme=options.quant or "auto", progress=repack_progress,
                        background_write=True)
    config = EngineConfig(quant=quant, speculative=spec,
                          cache=CacheConfig(kv_cache_dtype=kv_cache_setting()),
                          scheduler=SchedulerConfig(max_model_len=options.context))
    try:
        config.resolved_kv_dtype()
    except ValueError as exc:  # a 16-bit cache asked of an engine that cannot read one
        from localchat.app.settings import SettingError

        raise SettingError(f"the kv_cache_dtype setting: {exc}") from None
    return config


def kv_cache_setting() -> str:
    """The ``kv_cache_dtype`` setting (config file or ``LOCALCHAT_KV_CACHE_DTYPE``), ``auto``
    when unset. Raises ``SettingError`` for a bad value (``load_settings``)."""
    from localchat.app.settings import load_settings

    return load_settings().kv_cache_dtype or "auto"


def check_context(options: LoadOptions, source: Any) -> None:
    """Refuse a context longer than the model was trained for, naming both numbers.

    Raises:
        CliUsageError: ``--context`` (or serve's ``--max-model-len``) exceeds the model's
            ``max_position_embeddings`` (exit 2).
        SettingError: the ``context`` setting (config.toml or ``LOCALCHAT_CONTEXT``) does
            (exit 1, as any bad setting).
    """
    if options.context is None:
        return
    from localchat.app.load_options import check_trained_context
    from localchat.app.settings import cache_dir
    from localchat.engine.loader import load_model_config

    trained = load_model_config(Path(source.path), cache_dir()).max_position_embeddings
    check_trained_context(options.context_origin, options.context,
                          getattr(source, "alias", None) or options.model, trained)


def load(options: LoadOptions, *, progress: Progress | None = None,
         use_async: bool = False) -> Any:
    """Resolve (downloading when needed) and load the engine for ``options``.

    ``progress`` receives the download lines and the "loading ..." line (None: they go to
    stderr through ``cli_io``). ``use_async`` returns an ``AsyncLLMEngine`` (its step loop on
    its own thread) instead of an ``LLMEngine``.

    Raises ``LocalchatError`` subclasses (unknown model, download or load failure, a draft
    whose vocabulary differs from the target's, ``DraftChoiceError``) and ``CliUsageError``
    for a context above the model's trained context.
    """
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    fetch_progress = progress if progress is not None else cli_io.stderr_progress
    source = resolve_model(options.model, cache_dir=cache_dir(), download=True,
                           progress=fetch_progress)
    check_context(options, source)
    draft, draft_path = resolve_draft(options, source, fetch_progress)
    name = source.alias or options.model
    line = f"loading {name}" + (f" with draft {draft}" if draft else "") + " ..."
    if progress is None:
        cli_io.notice(line)
    else:
        progress(line)
    # the first load's repack counter: on a terminal, when the lines above went there too
    config = engine_config(options, draft_path,
                           repack_progress=progress is None and cli_io.stream_isatty(sys.stderr))
    if use_async:
        from localchat.engine.async_engine import AsyncLLMEngine

        return AsyncLLMEngine.from_source(source, config, cache_dir=cache_dir())
    from localchat.engine.llm_engine import LLMEngine

    return LLMEngine.from_source(source, config, cache_dir=cache_dir())
