"""Which backend answers ``ask`` / ``chat --jsonl``: an endpoint, a running local server, or
an in-process engine.

Order: ``--local`` forces in-process; else ``--endpoint URL`` (or ``LOCALCHAT_ENDPOINT`` /
``endpoint`` in config.toml) names any OpenAI-compatible server; else a ``localchat serve``
whose state file is present, whose ``/health`` answers and that serves the wanted model (and
was not started with a key we lack) is used; else ``None``: load the engine in-process.
A flag that configures the engine (``--draft``, ``--num-speculative-tokens``, ``--quant``,
``--context``) also means in-process (the running server's own choices would be silently used
instead); with an endpoint, flag or setting, it is a usage error (exit 2) naming the flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def choose_backend(model: str, *, explicit_model: bool, local: bool, endpoint: str | None,
                   settings: Any, engine_flags: Sequence[str] = ()) -> Any:
    """A ``RemoteEngine`` for the chosen server, or None for an in-process engine.

    ``engine_flags`` names the flags given that configure an in-process model (``--draft``,
    ``--quant``, ...): with any, a running ``localchat serve`` is passed over (it was loaded
    with its own), and an endpoint is refused rather than answering without them.

    Raises:
        BackendError: the named endpoint cannot be reached or lists no model.
        CliUsageError: ``--local`` together with ``--endpoint``, an ``--endpoint`` that is
            not an http(s) URL with a host and a valid port, or an endpoint (flag or setting)
            with an engine flag (exit 2).
    """
    if local:
        if endpoint:
            from localchat.app.cli_io import CliUsageError

            raise CliUsageError("use either --local or --endpoint, not both")
        return None
    from localchat.app.server.client import RemoteEngine

    if endpoint:
        from localchat.app.settings import endpoint_problem

        problem = endpoint_problem(endpoint)
        if problem is not None:
            from localchat.app.cli_io import CliUsageError

            raise CliUsageError(f"--endpoint {endpoint}: not {problem}")
    if (endpoint or settings.endpoint) and engine_flags:
        from localchat.app.cli_io import CliUsageError

        flag = engine_flags[0]
        if endpoint:
            raise CliUsageError(f"{flag} does not apply with --endpoint: the server at "
                                f"{endpoint} answers with its own model and settings")
        raise CliUsageError(f"{flag} does not apply to the endpoint in the settings "
                            f"({settings.endpoint}), which answers with its own model and "
                            "settings; add --local to load the model here")
    endpoint = endpoint or settings.endpoint
    api_key = settings.api_key
    if endpoint:
        return RemoteEngine(endpoint, api_key, model if explicit_model else None)
    if engine_flags:
        return None
    from localchat.app.server.state import find_server

    info = find_server(model)
    if info is None:
        return None
    if info.auth and not api_key:
        from localchat.app.cli_io import note

        note(f"the running server at {info.url} needs an API key (LOCALCHAT_API_KEY or "
             "'localchat config set api_key ...'); answering in-process")
        return None
    try:
        return RemoteEngine(info.url, api_key, info.model, local_server=True)
    except Exception:  # noqa: BLE001 - a server going away right now: load locally
        return None
