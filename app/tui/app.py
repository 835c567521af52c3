"""The localchat Textual app: themes, key map, the engine's lifecycle, errors as notifications.

``ChatApp`` loads the model on a thread worker (the UI is up at once and shows "loading"),
keeps one engine at a time (``AsyncLLMEngine``, its step loop on its own thread), registers
the themes of ``localchat.themes`` and remembers the theme picked in the command palette in the
config file. ``run_tui`` is what ``localchat`` (no command) and ``localchat chat`` call.
Tests pass a fake ``engine`` (or ``engine_loader``) and an in-memory store.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from textual import work
from textual.app import App
from textual.theme import Theme

from localchat.app.tui import keymap as keys
from localchat.app.tui.engine_host import check_async_load, describe_error, load_async_engine
from localchat.app.tui.messages import EngineLoaded
from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.engine.errors import LocalchatError
from localchat.themes import DEFAULT_THEME, THEMES, load_css, resolve_theme_name

logger = logging.getLogger(__name__)


class ChatApp(App[None]):
    """The TUI.

    Args:
        model: model spec to load (default: the settings' ``default_model``).
        theme: theme name (``dark``/``light``/``high-contrast`` or any registered theme).
        settings: a ``Settings`` (default: ``load_settings()``).
        engine: an already loaded engine (tests); skips loading.
        engine_loader: ``(spec, quant=, draft=, progress=, context=, endpoint=) -> engine``,
            run on a thread (``endpoint`` only when the settings name one).
        load_check: ``(spec, quant=, draft=, context=, context_origin=, endpoint=)``, raising
            on a model or draft the loader would refuse (``check_async_load``), run before a
            switch unloads anything.
        context: context size in tokens (``--context``; default: the settings' ``context``,
            else the model's, at most 8192 on CPU).
        store: the history store (default: ``TuiStore()`` on the user's history file),
            wrapped in a ``HistoryGuard``: a corrupt or read-only file shows a banner and the
            chat goes on in memory.
        remember_theme: write theme changes to the config file.
    """

    CSS = load_css()
    TITLE = "localchat"
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, *, model: str | None = None, theme: str | None = None,
                 settings: Any = None, engine: Any = None,
                 engine_loader: Callable[..., Any] | None = None, store: Any = None,
                 remember_theme: bool = True, context: int | None = None,
                 load_check: Callable[..., None] | None = None) -> None:
        super().__init__()
        if settings is None:
            from localchat.app.settings import load_settings

            settings = load_settings()
        from localchat.app.tui.history_guard import HistoryGuard, open_tui_store

        if store is None:
            store = open_tui_store()
        elif not isinstance(store, HistoryGuard):
            store = HistoryGuard(store)
        self.settings = settings
        self.store: HistoryGuard = store
        self.model_name: str = model or settings.default_model
        self.loads_running = 0  # model loads on their threads now (run_tui waits for them)
        self.draft: str | None = settings.draft
        self.quant: str | None = settings.quant
        from localchat.app.load_options import context_choice

        self.context, self.context_origin = context_choice(context, settings)
        self.default_system: str | None = settings.system_prompt
        self.default_sampling: dict[str, Any] = dict(settings.sampling)
        # The loaded model's recommended sampling (below the user's own settings).
        self.model_sampling: dict[str, Any] = {}
        self._recommended: dict[str, dict[str, Any]] = {}  # model -> recommended sampling
        self.engine = engine
        self.engine_error: str | None = None
        self.show_tracebacks = False  # Textual's traceback after a crash (``--debug``)
        self._engine_loader = engine_loader or load_async_engine
        self._load_check = load_check or check_async_load
        # (model, draft) that answered before a switch, loaded again if the switch fails
        self._fallback: tuple[str, str | None] | None = None
        self._remember_theme = remember_theme
        self.keymap: dict[str, str] = {}
        self._keymap_error: str | None = None
        from localchat.app.settings import config_path

        self.keymap, problems = keys.parse_keymap(getattr(settings, "keys", None) or {},
                                                  config_path())
        self._keymap_error = "; ".join(problems) or None  # the valid bindings still apply
        for t in THEMES:
            self.register_theme(t)
        self._theme_warning: str | None = None
        wanted = resolve_theme_name(theme or settings.theme or DEFAULT_THEME)
        if wanted not in self.available_themes:
            self._theme_warning = (f"unknown theme '{wanted}'; using {DEFAULT_THEME} "
                                   f"(themes: {', '.join(sorted(self.available_themes))})")
            wanted = DEFAULT_THEME
        self.theme = wanted

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        self.push_screen(ChatScreen())
        for warning in (self._theme_warning, self._keymap_error):
            if warning:
                self.notify(warning, severity="warning", timeout=8)
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.store.on_failure = self._history_failed  # reports a failure at open at once
        self.store.on_lost = self._conversation_lost
        if self.engine is None:
            self.load_model(self.model_name, self.draft)
        else:
            self.post_message(EngineLoaded(self.model_name, self.engine, preloaded=True))

    # -- engine --------------------------------------------------------------------------------

    def check_load(self, model: str, draft: str | None) -> str | None:
        """Why ``load_model(model, draft)`` would fail before loading anything (a model or
        draft that names no model, the draft being the model itself: ``ask``'s checks), as
        one line; None when it may go ahead. Nothing is unloaded."""
        extra = {} if self.context is None else {"context": self.context,
                                                 "context_origin": self.context_origin}
        try:
            self._load_check(model, quant=self.quant, draft=draft,
                             endpoint=getattr(self.settings, "endpoint", None), **extra)
        except Exception as exc:  # noqa: BLE001 - said in a notification; nothing changes
            return describe_error(exc)
        return None

    def load_model(self, model: str, draft: str | None = None) -> None:
        """Load ``model`` (and ``draft``) on a thread; ``EngineLoaded`` reports the outcome.
        The engine in use is shut down first (two models may not fit in memory); when the new
        one fails to load, the one that answered before is loaded again."""
        old, self.engine = self.engine, None
        if old is not None:
            self._fallback = (self.model_name, self.draft)
        self.model_name, self.draft, self.engine_error = model, draft, None
        if old is not None:
            _shutdown(old)
        self._load(model, draft)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load(self, model: str, draft: str | None) -> None:
        def progress(line: str) -> None:
            self.call_from_thread(self._progress, model, line)

        self.loads_running += 1
        try:
            extra = {} if self.context is None else {"context": self.context,
                                                     "context_origin": self.context_origin}
            if getattr(self.settings, "endpoint", None):
                extra["endpoint"] = self.settings.endpoint
            engine = self._engine_loader(model, quant=self.quant, draft=draft,
                                         progress=progress, **extra)
            from localchat.app.model_defaults import recommended_sampling

            self._recommended[model] = recommended_sampling(model)[0]
        except BaseException as exc:
            logger.debug("loading %s failed", model, exc_info=True)
            self.post_message(EngineLoaded(model, error=describe_error(exc)))
            return
        finally:
            self.loads_running -= 1
        self.post_message(EngineLoaded(model, engine))

    def _progress(self, model: str, line: str) -> None:
        screen = self._chat_screen()
        if screen is not None and model == self.model_name:
            screen.show_notice(" ".join(line.split()))

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        if message.model != self.model_name:  # a newer load superseded this one
            if message.engine is not None and message.engine is not self.engine:
                _shutdown(message.engine)
            return
        fallback, self._fallback = self._fallback, None
        if message.error and fallback is not None and fallback != (message.model, self.draft):
            self.notify(f"{message.error}; loading {fallback[0]} again", severity="error",
                        title=f"Cannot load {message.model}", timeout=15)
            self.model_name, self.draft = fallback
            self._load(*fallback)
        elif message.error:
            self.engine_error = message.error
            self.notify(message.error, severity="error", title=f"Cannot load {message.model}",
                        timeout=15)
        else:
            self.engine = message.engine
            self.engine_error = None
            self.model_sampling = self._recommended.get(message.model, {})
            if not message.preloaded:
                self.notify(f"{message.model} is ready", timeout=3)
        screen = self._chat_screen()
        if screen is not None:
            if not message.error:
                screen.model_loaded(message.model)
            screen.show_notice("")
            screen.refresh_status()

    def _history_failed(self, problem: str) -> None:
        """The history file failed: a persistent banner, the chat goes on in memory."""
        screen = self._chat_screen()
        if screen is not None and screen.is_mounted:  # else its on_mount shows the banner
            screen.show_history_banner(problem)
        self.notify("The history cannot be saved; this chat is kept in memory (Ctrl+T "
                    "exports it)", severity="error", title="History unavailable", timeout=10)

    def _conversation_lost(self, conversation_id: str) -> None:
        """An open conversation was deleted by another localchat: it goes on in memory."""
        self.notify("This conversation was deleted elsewhere (another localchat); it goes on "
                    "here but is no longer saved (Ctrl+T exports it, Ctrl+N starts a new one)",
                    severity="warning", title="Conversation deleted", timeout=10)

    def _chat_screen(self) -> ChatScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        return None

    async def on_unmount(self) -> None:
        if self.engine is not None:
            _shutdown(self.engine)

    def sampling_defaults(self) -> dict[str, Any]:
        """The sampling a conversation gets without its own values: ``SamplingParams``'
        defaults, overlaid with the model's recommendation, then the user's settings (config
        file, environment, command-line flags)."""
        from dataclasses import MISSING, fields

        from localchat.engine.sampling_params import SamplingParams

        base = {f.name: f.default for f in fields(SamplingParams) if f.default is not MISSING}
        return {**base, **self.model_sampling, **self.default_sampling}

    # -- themes --------------------------------------------------------------------------------

    def _print_error_renderables(self) -> None:
        """Print Textual's traceback of an unexpected crash only with ``--debug``; otherwise
        ``run_tui`` reports it as one line."""
        if self.show_tracebacks:
            super()._print_error_renderables()
        else:
            self._exit_renderables.clear()

    def _theme_changed(self, theme: Theme) -> None:
        if not self._remember_theme:
            return
        try:
            from localchat.app.settings import set_value

            set_value("theme", theme.name)
        except Exception as exc:  # noqa: BLE001 - the theme still applies for this session
            self.notify(f"cannot save the theme: {describe_error(exc)}", severity="warning")


def _shutdown(engine: Any) -> None:
    shutdown = getattr(engine, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown(timeout=2.0)
        except TypeError:
            shutdown()
        except Exception:
            logger.debug("engine shutdown failed", exc_info=True)


def run_tui(model: str | None = None, theme: str | None = None,
            sampling: dict[str, Any] | None = None, context: int | None = None,
            endpoint: str | None = None) -> int:
    """Run the TUI in this terminal until the user quits; returns the exit code (0).

    ``sampling`` holds ``SamplingParams`` fields from command-line flags; they override the
    settings' defaults for every conversation of this session. ``endpoint`` (``--endpoint``)
    names an OpenAI-compatible server to chat with, over the settings' ``endpoint``.

    Raises:
        LocalchatError: bad settings (before the UI starts); an unusable history file does
            not stop the TUI (``HistoryGuard``).
        CliUsageError: a sampling flag is out of range.
    """
    from localchat.app.settings import load_settings

    settings = load_settings()
    if sampling:
        from localchat.app.cli_io import CliUsageError
        from localchat.engine.sampling_params import SamplingParams

        merged = {**settings.sampling, **sampling}
        try:
            SamplingParams(**merged)
        except ValueError as exc:
            raise CliUsageError(str(exc)) from None
        settings = replace(settings, sampling=merged)
    if endpoint:
        settings = replace(settings, endpoint=endpoint)
    from localchat.app.cli_io import debug_requested

    if context is not None and context < 1:
        from localchat.app.cli_io import CliUsageError

        raise CliUsageError(f"--context {context}: the context must be a positive number of "
                            "tokens")
    app = ChatApp(model=model, theme=theme, settings=settings, context=context)
    app.show_tracebacks = debug_requested(sys.argv[1:])
    app.run()
    if app._exception is not None and not app.show_tracebacks:
        raise LocalchatError(f"the chat stopped on an unexpected error: "
                             f"{describe_error(app._exception)} (--debug shows the traceback)")
    if app.loads_running:
        # the load runs on (a repack is not interruptible) and the process waits for it at
        # exit: a line, rather than a blank terminal until it ends
        from localchat.app.cli_io import note

        note(f"waiting for the load of {app.model_name} to finish before exiting")
    return app.return_code or 0
