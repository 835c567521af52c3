"""``localchat serve``: load one model and serve it over the OpenAI-compatible API.

Binds ``127.0.0.1`` by default. Any other host needs ``--api-key`` (or ``--insecure-no-auth``,
which is printed as a warning): the API runs a model on this machine for whoever reaches it.
The key comes from ``--api-key`` or ``LOCALCHAT_API_KEY`` (the environment keeps it out of
``ps``).
Once listening, the server writes its state file (``state.py``) so ``ask``, ``chat --jsonl``
and the TUI find it, unless another live server already holds it (a note says so, and that
one stays the one clients find); it removes its own file when it stops (Ctrl+C / SIGTERM).
Stopping ends in-flight requests at once: streams get an error event and ``data: [DONE]``,
waiting requests a 503 (``shutdown.py``). ``--keep-alive DURATION`` stops it the same way
once no generation request has been in flight for DURATION: it removes its state file, and
stops IDLE_GRACE_S later unless a request came meanwhile (a client that found it just before
is answered, and it registers again); what ``ask --keep-alive`` starts (``app/keep_alive.py``).
The API key is never printed or logged (``logs.RedactFilter`` guards every handler).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.app import cli_io
from localchat.app.cli_io import CliUsageError
from localchat.engine.errors import LocalchatError

LOOPBACK_NAMES = ("localhost",)
# uvicorn's backstop once in-flight requests have been ended (``shutdown.py``): a client that
# does not read its stream can hold its connection this long before the task is cancelled.
GRACEFUL_SHUTDOWN_S = 2
# ``--keep-alive``: seconds between unregistering an idle server and stopping it, so a client
# that read the state file just before gets its request served (the server then stays).
IDLE_GRACE_S = 2.0


class ServeError(LocalchatError):
    """The server cannot start (the port is taken, the host cannot be bound)."""


@dataclass
class ServeArgs:
    """``serve``'s command line (None: settings or defaults)."""

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8088
    api_key: str | None = None
    insecure_no_auth: bool = False
    draft: str | None = None
    quant: str | None = None
    max_num_seqs: int = 16
    max_model_len: int | None = None
    max_in_flight: int = 64
    max_tokens_limit: int | None = None
    log_level: str = "warning"
    keep_alive: str | None = None  # exit after this long without a request (a duration)
    batch_invariant: bool = True  # SchedulerConfig.batch_invariant


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(args: ServeArgs) -> None:
    """Refuse a non-loopback host without ``--api-key`` or ``--insecure-no-auth``.

    Raises:
        CliUsageError: exit 2, naming both ways out.
    """
    if args.api_key is not None and not args.api_key.strip():
        raise CliUsageError("--api-key: the key is empty")
    if args.api_key is not None:
        from localchat.app.settings import api_key_problem

        if (problem := api_key_problem(args.api_key.strip())) is not None:
            typed = any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv[1:])
            origin = "--api-key" if typed else "LOCALCHAT_API_KEY"  # typer's envvar
            raise CliUsageError(f"{origin}: the key must be {problem}")
    if not 0 <= args.port <= 65535:
        raise CliUsageError(f"--port {args.port}: must be between 0 and 65535")
    from localchat.app.server.logs import LOG_LEVELS

    if args.log_level not in LOG_LEVELS:
        raise CliUsageError(f"--log-level {args.log_level}: one of {', '.join(LOG_LEVELS)}")
    from localchat.app.load_options import check_max_num_seqs

    check_max_num_seqs(args.max_num_seqs)
    keep_alive_seconds(args)
    if is_loopback(args.host) or args.api_key:
        return
    if not args.insecure_no_auth:
        raise CliUsageError(f"--host {args.host} exposes the API beyond this machine: give "
                            "--api-key KEY (or --insecure-no-auth to serve without one)")
    cli_io.warn(f"serving on {args.host} WITHOUT authentication (--insecure-no-auth): "
                "anyone who can reach this port can use the model")


def keep_alive_seconds(args: ServeArgs) -> float | None:
    """``--keep-alive`` in seconds (None: serve until stopped).

    Raises:
        CliUsageError: not a duration, or zero (exit 2).
    """
    if args.keep_alive is None:
        return None
    from localchat.app.keep_alive import parse_duration

    try:
        seconds = parse_duration(args.keep_alive)
    except ValueError as exc:
        raise CliUsageError(f"--keep-alive: {exc}") from None
    if seconds <= 0:
        raise CliUsageError("--keep-alive: give a positive duration (leave it out to serve "
                            "until stopped)")
    return seconds


def run_serve(args: ServeArgs) -> None:
    """Load the model, listen, serve until interrupted.

    Raises:
        CliUsageError: bad flags (exit 2).
        LocalchatError: unknown model, load failure, the port cannot be bound (exit 1).
    """
    from localchat.app.load_options import (
        LoadOptions,
        check_load_options,
        check_model_flag,
        context_choice,
        flag_or_setting,
    )
    from localchat.app.settings import load_settings

    check_model_flag(args.model)
    if args.api_key is not None:  # as clients read LOCALCHAT_API_KEY (settings strip it):
        args = dataclasses.replace(args, api_key=args.api_key.strip())  # 'key ' matched none
    check_exposure(args)
    settings = load_settings()
    # --max-model-len is checked as ask's --context is: positive, at most what the model
    # was trained for (engine_loader.check_context, after the model resolves)
    context, context_origin = context_choice(args.max_model_len, settings,
                                             ("--max-model-len", "--context", "-C"))
    draft, draft_origin = flag_or_setting(args.draft, settings, "draft")
    quant, quant_origin = flag_or_setting(args.quant, settings, "quant")
    options = LoadOptions(model=args.model or settings.default_model, draft=draft,
                          quant=quant or "auto", context=context, context_origin=context_origin,
                          draft_origin=draft_origin, quant_origin=quant_origin)
    check_load_options(options)
    sock = _bind(args.host, args.port)  # before loading: a taken port fails fast
    try:
        engine, model_id, weights = cli_io.guarded(lambda: _load(options, args))
    except BaseException:
        sock.close()
        raise
    try:
        _serve(engine, model_id, (options.model, weights), args, sock)
    finally:
        engine.shutdown()


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket. Its protocol is named (IPPROTO_TCP, not 0): asyncio turns Nagle's
    algorithm off (TCP_NODELAY) only on accepted sockets whose ``proto`` says TCP, and with
    it on, a streamed reply on a reused keep-alive connection (every OpenAI client's second
    request) sat in the kernel until the client's delayed ACK: tokens arrived in one burst at
    the end. Raises ``ServeError`` when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _load(options: Any, args: ServeArgs) -> tuple[Any, str, str]:
    """Resolve and load an ``AsyncLLMEngine``; returns it, the model id to serve and the
    absolute path of its weights (a name a local ``-m PATH`` is matched by)."""
    from localchat.app import interrupts
    from localchat.app.engine_loader import check_context, engine_config, resolve_draft
    from localchat.app.settings import cache_dir
    from localchat.engine.async_engine import AsyncLLMEngine
    from localchat.engine.config import SchedulerConfig
    from localchat.engine.hub.resolve import resolve_model

    with interrupts.loading_interrupts():
        source = resolve_model(options.model, cache_dir=cache_dir(), download=True,
                               progress=cli_io.stderr_progress)
        check_context(options, source)
        _, draft_path = resolve_draft(options, source, cli_io.stderr_progress)
        config = engine_config(options, draft_path)
        config = dataclasses.replace(config, scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_model_len=options.context,
            batch_invariant=args.batch_invariant))
        name = source.alias or options.model
        cli_io.notice(f"loading {name} ...")
        engine = AsyncLLMEngine.from_source(source, config, cache_dir=cache_dir())
        # a local path is served (and recorded in clients' histories) by its absolute path:
        # ./m.gguf means nothing from another folder; the spec as typed stays an alias
        local = source.alias is None and Path(options.model).expanduser().exists()
        return engine, str(source.path) if local else name, str(source.path)


def _serve(engine: Any, model_id: str, names: tuple[str, ...], args: ServeArgs,
           sock: socket.socket) -> None:
    import uvicorn

    from localchat.app.keep_alive import show_duration
    from localchat.app.server.routes import (
        ServerOptions,
        activity,
        begin_shutdown,
        create_app,
    )
    from localchat.app.server.shutdown import stopping_line
    from localchat.app.server.state import (
        ServerInfo,
        find_server,
        read_state,
        remove_state,
        write_state,
    )

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    # the spec as typed (what the server's clients send) and the weights' absolute path (what
    # a local -m PATH of ask, chat and the TUI is compared by: ServerInfo.serves)
    aliases = tuple(a for a in dict.fromkeys(names) if a != model_id)
    app = create_app(engine, ServerOptions(
        model_id=model_id, aliases=aliases, api_key=args.api_key,
        max_in_flight=args.max_in_flight, max_tokens_limit=args.max_tokens_limit))
    info = ServerInfo(url=url, model=model_id, aliases=aliases, auth=args.api_key is not None)
    keep_alive = keep_alive_seconds(args)
    idle_note = "" if keep_alive is None else \
        f"; so does {show_duration(keep_alive)} without a request"

    class _Server(uvicorn.Server):
        async def _idle_watch(self, limit: float) -> None:
            while not self.should_exit:
                await asyncio.sleep(min(1.0, limit / 4))
                busy, last = activity(app)
                if busy or time.monotonic() - last < limit:
                    continue
                # Unregister first, then stop only if no request came in the grace period:
                # a client that found the server just before still gets its answer.
                registered = (read_state() or info).pid == os.getpid()
                remove_state()
                await asyncio.sleep(IDLE_GRACE_S)
                if activity(app) == (0, last):
                    print(f"localchat: no request for {show_duration(limit)} (--keep-alive); "
                          "stopping", file=sys.stderr, flush=True)
                    self.should_exit = True
                elif registered and read_state() is None:
                    write_state(info)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit and keep_alive is not None:
                self._idle_task = asyncio.ensure_future(self._idle_watch(keep_alive))
            if not self.should_exit:
                other = find_server(None)  # a live server already registered stays so
                if other is None:
                    write_state(info)
                print(f"localchat: serving {model_id} at {url}/v1 "
                      f"(Ctrl+C stops{idle_note})", file=sys.stderr, flush=True)
                if other is not None:
                    print(f"localchat: note: another localchat server ({other.model} at "
                          f"{other.url}, pid {other.pid}) is the one ask, chat and the TUI "
                          f"find; reach this one with --endpoint {url}/v1",
                          file=sys.stderr, flush=True)

        async def shutdown(self, sockets: Any = None) -> None:
            # Here, not only after run(): uvicorn re-raises the signal that stopped it once
            # it has shut down, and SIGTERM's default action ends the process at once.
            # In-flight requests end first (streams with an error event and [DONE], the rest
            # with a 503), so uvicorn's graceful wait finds the connections done at once.
            captured = getattr(self, "_captured_signals", None)  # uvicorn >= 0.29
            if captured:
                print(stopping_line(captured[0], activity(app)[0]), file=sys.stderr, flush=True)
            try:
                begin_shutdown(app)
                await super().shutdown(sockets=sockets)
            finally:
                remove_state()

    from localchat.app.server.logs import configure_logging

    config = uvicorn.Config(app, log_level=args.log_level,
                            access_log=args.log_level in ("info", "debug"), lifespan="off",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    configure_logging(args.log_level, args.api_key)
    try:
        _Server(config).run(sockets=[sock])
    finally:
        remove_state()
        sock.close()
