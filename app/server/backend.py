"""Which backend answers ``ask`` / ``chat --jsonl``: an endpoint, a running local server, or
an in-process engine.

Order: ``--local`` forces in-process; else ``--endpoint URL`` (or ``LOCALCHAT_ENDPOINT`` /
``endpoint`` in config.toml) names any OpenAI-compatible server; else a ``localchat serve``
whose state file is present, whose ``/health`` answers and that serves the wanted model (and
was not started with a key we lack) is used; else ``None``: load the engine in-process.
A ``--draft`` or ``--quant`` flag also means in-process unless an endpoint is named (the
running server's own choices would be silently used instead).
"""

from __future__ import annotations

from typing import Any


def choose_backend(model: str, *, explicit_model: bool, local: bool, endpoint: str | None,
                   settings: Any, engine_flags: bool = False) -> Any:
    """A ``RemoteEngine`` for the chosen server, or None for an in-process engine.

    Raises:
        BackendError: the named endpoint cannot be reached or lists no model.
        CliUsageError: ``--local`` together with ``--endpoint``, or an ``--endpoint`` that is
            not an http(s) URL (exit 2).
    """
    if local:
        if endpoint:
            from localchat.app.cli_io import CliUsageError

            raise CliUsageError("use either --local or --endpoint, not both")
        return None
    from localchat.app.server.client import RemoteEngine

    if endpoint and not endpoint.strip().lower().startswith(("http://", "https://")):
        from localchat.app.cli_io import CliUsageError

        raise CliUsageError(f"--endpoint {endpoint}: not an http:// or https:// URL "
                            "(e.g. http://127.0.0.1:8088)")
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
